"""The configuration wired into the parsers (docs/configuration.md): ``--config FILE`` on
``ppre SERVICE serve``, and the sub-commands ``check-config`` and ``config-table``.

`install` records which flags the command line gave (each action notes itself when
argparse calls it) and wraps the command's function so that the file is applied before it
runs. The service command modules never import this package: `ppre.cli` calls
`install_services` once they have registered.
"""
from __future__ import annotations

import argparse
import functools
import os
from typing import Callable

from ppre.config.client import check_client
from ppre.config.file import GIVEN_ATTRIBUTE, apply
from ppre.config.table import CONFIG_ENV, SERVICES, settings_table
from ppre.config.tester import check_tester


@functools.cache
def _noting(cls: type) -> type:
    """`cls` whose call also notes, in the namespace, that its option was given."""
    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, GIVEN_ATTRIBUTE, None)
        if given is None:
            given = set()
            setattr(namespace, GIVEN_ATTRIBUTE, given)
        given.add(self.dest)
        return cls.__call__(self, parser, namespace, values, option_string)
    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, "_ppre_noting": True})


def _note_given(parser: argparse.ArgumentParser) -> None:
    for action in parser._actions:
        if action.option_strings and not isinstance(action, argparse._HelpAction) \
                and not getattr(type(action), "_ppre_noting", False):
            action.__class__ = _noting(type(action))


def layered(func: Callable[[argparse.Namespace], int], service: str, *, collect: bool = False):
    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        return func(apply(args, service, collect=collect))
    return run


def install_services(commands: argparse._SubParsersAction) -> None:
    """`install` on each service whose command `commands` holds (`ppre.cli` calls it once
    the command modules have registered: they do not import this module)."""
    for service, (module, action) in SERVICES.items():
        parser = commands.choices.get(module)
        if parser is not None:
            actions = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            install(actions, actions.choices[action], service)


def install(actions: argparse._SubParsersAction, serve: argparse.ArgumentParser, service: str) -> None:
    """`--config` on `ppre SERVICE serve` (call once its options and `func` are set), and
    the sub-commands ``check-config`` (the same options, and ``--json``) and ``config-table``."""
    serve.add_argument("--config", default=os.environ.get(CONFIG_ENV), metavar="FILE",
                       help=f"a TOML file of settings: keys are the flags' long names with '_' (e.g. peer_timeout "
                            f"= 600); flags and environment variables win over it (env {CONFIG_ENV}; "
                            "docs/configuration.md)")
    _note_given(serve)
    serve.set_defaults(func=layered(serve.get_default("func"), service))
    check = actions.add_parser("check-config", parents=[serve], add_help=False,
                               help="check the settings and the files they name, without serving",
                               description="Read the settings (flags, environment, --config FILE) and every "
                                           "file they name, as `serve` would, without opening a port: list every "
                                           "problem (exit status 2) or say that all is well (0).")
    check.add_argument("--json", action="store_true", help="print the report as one JSON object")
    check.add_argument("--data-only", action="store_true",
                       help="check the data files and the settings that read them only, not TLS, the peer link "
                            "or the session limits (for `ppre audit --local`, which makes its own certificates)")
    check.set_defaults(func=layered(check_tester if service == "tester" else check_client, service, collect=True))
    table = actions.add_parser("config-table", help="print the table of both services' settings (Markdown)")
    table.set_defaults(func=lambda args: print(settings_table()) or 0)
