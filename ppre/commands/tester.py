"""`ppre tester serve`: run the Tester service (P1)."""
from __future__ import annotations

import argparse
import os

from ppre.commands import serve_forever
from tester_service.server import TesterConfig, serve


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tester", help="the Tester service (P1)")
    actions = parser.add_subparsers(dest="action", required=True)
    s = actions.add_parser("serve", help="serve RunAudit and drive audits against the Test-Client")
    s.add_argument("--host", default=os.environ.get("PPRE_TESTER_HOST", "0.0.0.0"))
    s.add_argument("--port", type=int, default=int(os.environ.get("PPRE_TESTER_PORT", "50051")))
    s.add_argument("--client", default=os.environ.get("PPRE_CLIENT_ADDRESS", "127.0.0.1:50052"),
                   help="HOST:PORT of the Test-Client service (env PPRE_CLIENT_ADDRESS)")
    s.add_argument("--probabilities", default=os.environ.get("PPRE_TESTER_PROBABILITIES"),
                   help="prepared probability table, CSV or Parquet (env PPRE_TESTER_PROBABILITIES)")
    s.add_argument("--buckets", type=int, default=int(os.environ.get("PPRE_BOOTSTRAP_BUCKETS", "128")))
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.probabilities:
        raise SystemExit("ppre tester serve: --probabilities (or PPRE_TESTER_PROBABILITIES) is required")
    config = TesterConfig.from_probability_file(args.client, args.probabilities, n_buckets=args.buckets)
    server, port, _ = serve(config, args.port, args.host)
    print(f"tester serving on {args.host}:{port}; Test-Client at {args.client}", flush=True)
    return serve_forever(server)
