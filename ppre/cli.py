"""The `ppre` console command.

Each sub-command lives in its own module under `ppre.commands` and exposes
`register(subparsers)`, which adds its parser and sets `func=run`. Errors that the
project raises on purpose (`common.errors.PPREError`) print one clear line and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

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
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ppre", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a command whose module is not written yet
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        return int(args.func(args) or 0)
    except PPREError as exc:
        print(f"ppre {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
