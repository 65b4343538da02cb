"""`ppre client serve`: run the Test-Client service (P2)."""
from __future__ import annotations

import argparse
import os

from common.errors import InputError
from ppre.commands import add_service_arguments, link_settings


def _named(values: list[str]) -> dict[str, str]:
    out = {}
    for item in values:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InputError(f"expected NAME=FILE, got '{item}'", parameter="--dataset")
        out[name] = path
    return out


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("client", help="the Test-Client service (P2)")
    actions = parser.add_subparsers(dest="action", required=True)
    s = actions.add_parser("serve", help="serve the peer protocol over the product team's datasets")
    s.add_argument("--host", default=os.environ.get("PPRE_CLIENT_HOST", "0.0.0.0"))
    s.add_argument("--port", type=int, default=int(os.environ.get("PPRE_CLIENT_PORT", "50052")))
    s.add_argument("--data-dir", default=os.environ.get("PPRE_CLIENT_DATA_DIR"),
                   help="directory of datasets NAME.csv / NAME.parquet (env PPRE_CLIENT_DATA_DIR)")
    s.add_argument("--dataset", action="append", default=[], metavar="NAME=FILE",
                   help="a named dataset file (repeatable)")
    add_service_arguments(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from client_service.datasets import DatasetRegistry
    from client_service.server import ClientConfig, serve
    from ppre.commands import serve_forever
    from common.memory import protect_process

    protect_process()  # SPEC 7: a crash must not write keys or tables to disk (no core dumps)
    registry = DatasetRegistry(args.data_dir, _named(args.dataset))
    config = ClientConfig(registry, settings=link_settings(args), max_sessions=args.max_sessions)
    server, port, servicer = serve(config, args.port, args.host)
    print(f"client serving on {args.host}:{port}; datasets: {', '.join(registry.names()) or 'none'}", flush=True)
    return serve_forever(server, servicer)
