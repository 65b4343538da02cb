"""`ppre log verify FILE`: check the Tester's hash-chained audit log (tester_service.audit_log)."""
from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("log", help="the Tester's audit log")
    actions = parser.add_subparsers(dest="action", required=True)
    v = actions.add_parser("verify", help="check the hash chain; name the first broken record")
    v.add_argument("file", help="the audit log (`ppre tester serve --audit-log FILE`)")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tester_service.audit_log import verify

    result = verify(args.file)
    if args.json:
        print(json.dumps({"ok": result.ok, "records": result.records, "broken_line": result.broken_line,
                          "reason": result.reason}))
    elif result.ok:
        print(f"{args.file}: {result.records} records, {result.reason}")
    else:
        where = f"record at line {result.broken_line}" if result.broken_line else "the file"
        print(f"{args.file}: BROKEN at {where}: {result.reason} ({result.records} records before it intact)")
    return 0 if result.ok else 1
