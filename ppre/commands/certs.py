"""`ppre certs init DIR`: a development CA and the three role certificates (mutual TLS).

Writes DIR/ca.pem and DIR/ca.key (the CA), and for each role — tester, client,
operator — DIR/ROLE.pem (certificate, identity ROLE.ppre.local in its CN and SAN; the
two services' also name localhost, 127.0.0.1 and ::1) and DIR/ROLE.key. ECDSA P-256;
keys are written 0600, certificates 0644. Files already there are kept (a restarted
compose init must not replace the CA the running services trust) unless --force.

For development and the compose example only: in production use the organisation's CA
and give each party only ca.pem and its own certificate and key (`--ca/--cert/--key`).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("certs", help="development certificates for mutual TLS")
    actions = parser.add_subparsers(dest="action", required=True)
    s = actions.add_parser("init", help="create a development CA and the tester, client and operator certificates")
    s.add_argument("directory", metavar="DIR", help="where to write ca.pem, ca.key, ROLE.pem, ROLE.key")
    s.add_argument("--days", type=int, default=365, help="validity of every certificate in days (default 365)")
    s.add_argument("--force", action="store_true", help="replace the files already in DIR (a new CA)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from common.net.tls import DevCA, ROLES, dev_files, role_identity

    directory = Path(args.directory)
    if args.days < 1:
        raise InputError("must be at least 1", parameter="--days")
    if directory.exists() and not directory.is_dir():
        raise InputError("exists and is not a directory", file=str(directory))
    present = [p for p in dev_files(directory) if p.exists()]
    if present and not args.force:
        if len(present) == len(dev_files(directory)):
            print(f"{directory}: development certificates already there, kept (--force replaces them)")
            return 0
        raise InputError(f"holds some of the files but not all ({', '.join(p.name for p in present)}); "
                         "--force replaces them all", file=str(directory))
    ca = DevCA.generate(days=args.days)
    for path in ca.write(directory, days=args.days):
        print(f"wrote {path}")
    print("identities: " + ", ".join(f"{role} = {role_identity(role)}" for role in ROLES))
    print(f"{directory / 'ca.key'} signs certificates: keep it secret (development CA: not for production)",
          file=sys.stderr)
    return 0
