"""`ppre health HOST:PORT`: exit 0 when the service answers SERVING (compose health checks)."""
from __future__ import annotations

import argparse



def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("health", help="check a service's gRPC health")
    s.add_argument("address", help="HOST:PORT")
    s.add_argument("--timeout", type=float, default=3.0)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from common.channels import check_health
    ok = check_health(args.address, args.timeout)
    print("SERVING" if ok else "NOT SERVING")
    return 0 if ok else 1
