"""`ppre health HOST:PORT`: exit 0 when the service answers SERVING (compose health checks).

Over mutual TLS (`--tls-dir DIR --tls-role ROLE`, or `--ca/--cert/--key`) any certificate
from the CA may ask (the health service is not allow-listed); `--insecure` for a
plaintext service.
"""
from __future__ import annotations

import argparse

from ppre.commands import add_tls_arguments, tls_identity


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("health", help="check a service's gRPC health")
    s.add_argument("address", help="HOST:PORT")
    s.add_argument("--timeout", type=float, default=3.0)
    add_tls_arguments(s, None)
    s.add_argument("--server-identity", metavar="NAME",
                   help="the identity the service's certificate must carry (default: the address's host)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from common.channels import check_health
    tls = tls_identity(args)
    ok = check_health(args.address, args.timeout, tls=tls, server_name=args.server_identity if tls else None)
    print("SERVING" if ok else "NOT SERVING")
    return 0 if ok else 1
