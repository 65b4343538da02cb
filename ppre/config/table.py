"""The one table of settings of both services, read off the argparse definitions of
`ppre tester serve` and `ppre client serve` (docs/configuration.md).

Nothing is declared twice: `settings(service)` builds the service's parser once per
process, with every ``PPRE_*`` variable hidden so the defaults are the defaults, and
notes each option's environment variable; `settings_table` prints the Markdown table of
both (``ppre tester config-table``). A setting's TOML key is its flag's long name with
``_`` for ``-``; the repeatable ``NAME=VALUE`` flags are the tables ``[columns]`` and
``[datasets]``.
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ppre.flags import RepeatedNames

#: the environment variable that names the configuration file
CONFIG_ENV = "PPRE_CONFIG"
#: the services a configuration file configures: (command module, action)
SERVICES = {"tester": ("tester", "serve"), "client": ("client", "serve")}
#: TOML keys that are not the flag's long name: the repeatable NAME=VALUE flags are tables
TABLE_KEYS = {"--column": "columns", "--dataset": "datasets"}
#: settings that name a file or a directory besides those with metavar FILE or DIR:
#: a relative path in a configuration file is relative to the file's directory
PATH_KEYS = frozenset({"members", "self_id", "probabilities", "audit_log", "history", "privacy_ledger",
                       "data_dir", "tls_dir", "ca", "cert", "key"})
#: comma-separated settings that also take a TOML array of strings
LIST_KEYS = frozenset({"excluded_states"})
#: options that are no setting
NOT_SETTINGS = frozenset({"help", "config"})


# --------------------------------------------------------------------------------------
# The settings, read off the parsers
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    key: str             # the TOML key
    dest: str            # the argparse destination
    flag: str            # the long flag
    env: str | None      # its environment variable
    default: Any         # with no environment variable set
    help: str
    kind: str            # bool, int, float, str, names, columns, datasets
    choices: tuple | None = None
    path: bool = False   # names a file or directory
    type: Any = None

    @property
    def default_text(self) -> str:
        d = self.default
        if self.kind == "bool":
            return "on" if d else "off"
        if d is None or d == "" or d == []:
            return "–"
        return ", ".join(map(str, d)) if isinstance(d, (list, tuple)) else str(d)


#: what a setting without a help text of its own means (for the table)
FALLBACK_HELP = {"host": "the address to listen on", "port": "the port to listen on",
                 "buckets": "bootstrap buckets the joined rows are assigned to (resampling unit)",
                 "opt_out_column": "the members file's opt-out column (1/true/yes: not measured)"}


def _help_text(text: str) -> str:
    """A flag's help without what the table's other columns say: in each parenthesis, the
    parts (split at ';') that name the environment variable or a plain default."""
    def strip(match: re.Match) -> str:
        parts = [p.strip() for p in match.group(1).split(";")]
        kept = [p for p in parts if not re.match(r"env [A-Z_]+", p) and not re.fullmatch(r"default [^:]*", p)]
        return f" ({'; '.join(kept)})" if kept else ""
    text = re.sub(r"\s*\(((?:[^()]|\([^()]*\))*)\)", strip, text)
    return text.replace("%%", "%").strip()


_BUILD_LOCK = threading.Lock()


def _register(service: str) -> Callable[[argparse._SubParsersAction], None]:
    """The `register` of the service's command module (this module sits above them)."""
    from ppre.commands import client, tester
    return {"tester": tester.register, "client": client.register}[service]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


@functools.cache
def settings(service: str) -> tuple[Setting, ...]:
    """The settings of `ppre SERVICE serve`, from its parser built with every ``PPRE_*``
    variable hidden (so defaults are the defaults) and each option's variable noted."""
    module, command = SERVICES[service]
    envs: dict[int, list[str]] = {}
    pending: list[str] = []
    real_get = os.environ.get
    original_add = argparse._ActionsContainer.add_argument

    def get(key, default=None):
        if isinstance(key, str) and key.startswith("PPRE_"):
            pending.append(key)
            return default
        return real_get(key, default)

    def add_argument(self, *a, **k):
        action = original_add(self, *a, **k)
        envs[id(action)] = list(pending)
        pending.clear()
        return action

    with _BUILD_LOCK:
        os.environ.get = get  # an instance attribute: shadows Mapping.get while the parser is built
        argparse._ActionsContainer.add_argument = add_argument
        try:
            root = argparse.ArgumentParser(prog="ppre")
            sub = root.add_subparsers(dest="command")
            _register(service)(sub)
        finally:
            del os.environ.get
            argparse._ActionsContainer.add_argument = original_add
    parser = _subparser(_subparser(root, module), command)
    out = []
    for action in parser._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest in NOT_SETTINGS or isinstance(action, argparse._HelpAction):
            continue
        flag = longs[0]
        key = TABLE_KEYS.get(flag, flag[2:].replace("-", "_"))
        if action.nargs == 0:
            kind = "bool"
        elif key in ("columns", "datasets"):
            kind = key
        elif isinstance(action, RepeatedNames):
            kind = "names"
        elif action.type is int:
            kind = "int"
        elif action.type is float:
            kind = "float"
        else:
            kind = "str"
        names = [e for e in envs.get(id(action), []) if e != CONFIG_ENV]
        text = _help_text(action.help or FALLBACK_HELP.get(key, ""))
        out.append(Setting(key=key, dest=action.dest, flag=flag, env=names[0] if names else None,
                           default=action.default, help=text, kind=kind,
                           choices=tuple(action.choices) if action.choices else None,
                           path=key in PATH_KEYS or action.metavar in ("FILE", "DIR"), type=action.type))
    return tuple(out)


def settings_table() -> str:
    """The one Markdown table of both services' settings (docs/configuration.md)."""
    rows: dict[tuple, list[str]] = {}
    for service in SERVICES:
        for s in settings(service):
            row = (s.key, s.flag, s.env or "–", s.default_text, s.help)
            rows.setdefault(row, []).append(service)
    lines = ["| TOML key | flag | environment | default | service | meaning |", "|---|---|---|---|---|---|"]
    for (key, flag, env, default, text), services in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[1])):
        who = "both" if len(services) == len(SERVICES) else ", ".join(services)
        cells = (f"`{key}`", f"`{flag}`", f"`{env}`" if env != "–" else env,
                 f"`{default}`" if default != "–" else default, who, text.replace("|", "\\|"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
