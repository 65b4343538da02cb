"""The `ppre` console command.

Each sub-command lives in its own module under `ppre.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func=run`. Errors that the
project raises on purpose (`common.errors.PPREError`) print one clear line and exit 2.
A reader that closes the pipe early (`ppre runs list | head -1`) ends the command
quietly, with the shell's status for it (`CLOSED_PIPE_STATUS`), never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback

from common.errors import PPREError

#: Sub-command modules, in the order `ppre --help` lists them.
COMMAND_MODULES = (
    "ppre.commands.tester",
    "ppre.commands.client",
    "ppre.commands.audit",
    "ppre.commands.demo",
    "ppre.commands.bisg",
    "ppre.commands.synth",
    "ppre.commands.health",
    "ppre.commands.log",
    "ppre.commands.runs",
    "ppre.commands.report",
    "ppre.commands.certs",
)


#: the exit status of a command whose reader closed its pipe: 128 + SIGPIPE, as the shell
#: reports for any program a pipe's reader stopped early (`seq 100000 | head -1`)
CLOSED_PIPE_STATUS = 141


def closed_pipe_quietly() -> int:
    """After a BrokenPipeError: point stdout and stderr at /dev/null, so that the
    interpreter's last flush at exit finds no closed pipe to complain about, and
    return `CLOSED_PIPE_STATUS`. The reader asked for no more output; there is no one
    left to tell anything."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError):
            pass
    os.close(devnull)
    return CLOSED_PIPE_STATUS


class _Parser(argparse.ArgumentParser):
    """A usage error is one line that says what is wrong and where the options are, not
    the sub-command's whole usage (dozens of lines for `ppre audit`)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options)\n")


def _base_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    parser = _Parser(prog="ppre", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log progress at INFO level (-vv: DEBUG)")
    return parser, parser.add_subparsers(dest="command", required=True)


def build_parser() -> argparse.ArgumentParser:
    """The parser with every sub-command."""
    parser, sub = _base_parser()
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    _install_settings(sub)
    return parser


def _install_settings(sub: argparse._SubParsersAction) -> None:
    """``--config FILE``, ``check-config`` and ``config-table`` on the services' commands
    registered in `sub` (`ppre.config`, which sits above the command modules)."""
    if any(name in sub.choices for name in ("tester", "client")):
        from ppre.config import install_services
        install_services(sub)


def _parser_for(argv: list[str] | None) -> argparse.ArgumentParser:
    """The parser with only the invoked sub-command's module imported (startup time);
    the full `build_parser()` for help, errors or anything unusual."""
    args = sys.argv[1:] if argv is None else list(argv)
    rest = [a for a in args if a not in ("-v", "-vv", "--verbose")]
    module = f"ppre.commands.{rest[0]}" if rest else None
    if module not in COMMAND_MODULES or any(a in ("-h", "--help") for a in args[:len(args) - len(rest) + 1]):
        return build_parser()
    parser, sub = _base_parser()
    importlib.import_module(module).register(sub)
    _install_settings(sub)
    return parser


class _WithheldMessages(logging.Formatter):
    """Logged tracebacks keep their frames but not the message of an exception that is not
    one of ours: our errors name files, rows and parameters, never member-level values
    (common.errors), while a library's (a pandas KeyError, say) could carry a member id."""

    def formatException(self, ei) -> str:
        exc_type, exc, tb = ei
        frames = "".join(traceback.format_tb(tb))
        said = f": {exc}" if isinstance(exc, PPREError) else " (message withheld: it may hold data)"
        return f"Traceback (most recent call last):\n{frames}{exc_type.__name__}{said}"


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:
        return closed_pipe_quietly()


def _main(argv: list[str] | None) -> int:
    try:
        parser = _parser_for(argv)
        args = parser.parse_args(argv)
    except SystemExit:  # --help, a usage error: argparse printed and exits
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        raise
    level = logging.DEBUG if args.verbose >= 2 else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setFormatter(_WithheldMessages("%(asctime)s %(name)s %(levelname)s %(message)s"))
    try:
        from common.crypto import batch
        batch.backend()  # the batch primitives' backend, chosen (or refused) before any work
        status = int(args.func(args) or 0)
    except PPREError as exc:
        print(f"ppre {args.command}: error: {exc}", file=sys.stderr)
        status = 2
    except KeyboardInterrupt:
        status = 130
    sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
