"""`ppre client serve`: run the Test-Client service (P2)."""
from __future__ import annotations

import argparse
import os

from common.crypto import batch, paillier
from common.errors import InputError
from ppre.commands import (add_names_argument, add_service_arguments, add_tls_arguments, link_settings, listening_words,
                           tls_identity)


def dataset_files(values: list[str]) -> dict[str, str]:
    """The ``--dataset NAME=FILE`` values as {name: file} (also read by ``ppre client check-config``)."""
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
    s.add_argument("--host", default=os.environ.get("PPRE_CLIENT_HOST", "127.0.0.1"), metavar="ADDRESS",
                   help="the address to listen on (env PPRE_CLIENT_HOST; default 127.0.0.1: this machine only); "
                        "0.0.0.0 listens on every interface, for the Tester on other machines "
                        "(docs/deployment.md)")
    s.add_argument("--port", type=int, default=int(os.environ.get("PPRE_CLIENT_PORT", "50052")))
    s.add_argument("--data-dir", default=os.environ.get("PPRE_CLIENT_DATA_DIR"),
                   help="directory of datasets NAME.csv / NAME.parquet (env PPRE_CLIENT_DATA_DIR)")
    s.add_argument("--dataset", action="append", default=[], metavar="NAME=FILE",
                   help="a named dataset file (repeatable)")
    s.add_argument("--accept-noiseless", action="store_true",
                   default=os.environ.get("PPRE_ACCEPT_NOISELESS", "") == "1",
                   help="finish audits whose aggregates carry no release noise (a Tester with its release "
                        "controls off), and take part in the probabilistic count without noise (plaintext "
                        "pools); refused by default (env PPRE_ACCEPT_NOISELESS=1)")
    s.add_argument("--results-dir", default=os.environ.get("PPRE_CLIENT_RESULTS_DIR"), metavar="DIR",
                   help="write each audit's result (result recipient client: only this service learns it) to "
                        "DIR/AUDIT_ID.json, mode 0600; DIR must exist and be writable; without it results are "
                        "kept in memory only (env PPRE_CLIENT_RESULTS_DIR)")
    add_service_arguments(s)
    add_tls_arguments(s, "client")
    add_names_argument(s, "--allow-tester", "PPRE_ALLOW_TESTERS", "tester.ppre.local",
                       "a Tester identity (certificate SAN or CN) allowed to open audit sessions")
    from ppre.columns import add_column_arguments
    add_column_arguments(s, whose="the datasets")
    s.set_defaults(func=run)  # `ppre.cli` then adds --config FILE, `check-config`, `config-table` (ppre/config/)


def run(args: argparse.Namespace) -> int:
    from client_service.datasets import DatasetRegistry
    from client_service.server import ClientConfig, serve
    from ppre.commands import make_executor, serve_forever, setup_logging, shut_down_unless_serving
    setup_logging(args, "client")  # the process is protected already (`ppre.cli.main`, design §7)
    from common.net.tls import parse_names

    tls = tls_identity(args)
    from ppre.columns import client_columns
    from client_service.results import ResultStore
    results = ResultStore(args.results_dir)  # checked before the service starts
    registry = DatasetRegistry(args.data_dir, dataset_files(args.dataset), client_columns(args))
    registry.check_servable()  # before the port opens: a service that serves nothing does not start
    bits, test_keys = paillier.process_key_size()
    executor = make_executor(args)
    with shut_down_unless_serving(executor):
        config = ClientConfig(registry, modulus_bits=bits, allow_insecure=test_keys,
                              settings=link_settings(args), max_sessions=args.max_sessions, tls=tls,
                              allowed_testers=parse_names(args.allow_tester), executor=executor,
                              accept_noiseless=args.accept_noiseless, results=results)
        server, port, servicer = serve(config, args.port, args.host)
    security = (f"mutual TLS as {tls.identity}; Testers allowed: {', '.join(config.allowed_testers)}"
                if tls is not None else "INSECURE plaintext")
    kept = (f"results to {results.directory}" if results.directory is not None
            else "results in memory only (--results-dir DIR keeps them)")
    print(f"client serving on {listening_words(args.host, port)}; datasets: {', '.join(registry.names()) or 'none'}; {security}; "
          f"{kept}; crypto backend {batch.backend()} ({batch.backend_reason()})"
          + (f"; {paillier.test_keys_label()}" if test_keys else ""), flush=True)
    return serve_forever(server, servicer, config.executor)
