"""`ppre health HOST:PORT`: exit 0 when the service answers SERVING (compose health checks).

Over mutual TLS (`--tls-dir DIR --tls-role ROLE`, or `--ca/--cert/--key`) any certificate
from the CA may ask (the health service is not allow-listed); `--insecure` for a
plaintext service. What it prints and its exit status tell apart a service that is up
but not serving, nothing answering at the address, and a TLS handshake that failed
(`EXIT_CODES`).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ppre.commands import add_tls_arguments, tls_identity

#: the exit status of each answer (2 stays what it is for every ppre command: bad usage or input)
EXIT_CODES = {"SERVING": 0, "NOT_SERVING": 1, "UNREACHABLE": 3, "TLS_FAILED": 4}
EPILOG = """exit status:
  0  SERVING: the service is up and serving
  1  NOT SERVING: the service answers but does not serve (it is shutting down or starting)
  2  bad usage or input (e.g. no TLS certificates given)
  3  UNREACHABLE: nothing answers at HOST:PORT (no service listens there, a wrong host or port,
     a firewall)
  4  TLS FAILED: a service answers but the TLS handshake failed (its certificate is not from
     the CA, or does not name --server-identity, or it is plaintext: --insecure, or it wants TLS)"""


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("health", help="check a service's gRPC health", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("address", help="HOST:PORT")
    s.add_argument("--timeout", type=float, default=3.0)
    add_tls_arguments(s, None)
    s.add_argument("--server-identity", metavar="NAME",
                   help="the identity the service's certificate must carry (default: the address's host)")
    s.set_defaults(func=run)


@contextlib.contextmanager
def core_log_silenced():
    """gRPC's C core writes its own log lines to file descriptor 2 (a refused handshake:
    "Handshake failed ..."), beside this command's one line, whatever sys.stderr is; the
    answer's detail already says what failed. While the check runs, descriptor 2 points
    to /dev/null, unless the operator asked gRPC for more (GRPC_VERBOSITY other than
    `ppre`'s default ERROR: ppre/__init__.py)."""
    if os.environ.get("GRPC_VERBOSITY", "ERROR").upper() != "ERROR":
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def run(args: argparse.Namespace) -> int:
    from common.net.channels import health_status
    tls = tls_identity(args)
    with core_log_silenced():
        answer = health_status(args.address, args.timeout, tls=tls,
                               server_name=args.server_identity if tls else None)
    print(describe(answer, args.address, tls is not None))
    return EXIT_CODES[answer.status]


def describe(answer, address: str, tls: bool) -> str:
    """One line: the status, then (when not serving) what it means and what to check."""
    if answer.status == "SERVING":
        return "SERVING"
    if answer.status == "NOT_SERVING":
        return f"NOT SERVING: the service at {address} is up but does not serve (shutting down or starting)"
    if answer.status == "UNREACHABLE":
        return (f"UNREACHABLE: nothing answers at {address}: is the service running, on this host and port? "
                f"({answer.detail})")
    other = ("is it plaintext (then --insecure), is its certificate from this CA, does it name --server-identity?"
             if tls else "the service probably requires TLS: give --tls-dir (or --ca, --cert, --key)")
    return f"TLS FAILED: a service answers at {address} but the TLS handshake failed: {other} ({answer.detail})"
