"""`ppre log verify FILE`: check the Tester's keyed, chained audit log; `ppre log head FILE`:
print its head (record count and last MAC) to keep in a second place
(tester_service.audit_log; docs/operations.md, "The audit log")."""
from __future__ import annotations

import argparse
import json
import os

#: the environment variable naming the key file, as `ppre tester serve` reads it
KEY_ENV = "PPRE_AUDIT_LOG_KEY_FILE"
#: the environment variable naming the exported head file
HEAD_ENV = "PPRE_AUDIT_LOG_HEAD"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("log", help="the Tester's audit log")
    actions = parser.add_subparsers(dest="action", required=True)
    v = actions.add_parser("verify", help="check the chain and its MACs; name the first broken record")
    _common(v)
    v.add_argument("--expect-head", metavar="N:MAC|FILE", default=os.environ.get(HEAD_ENV),
                   help="the head exported when the log was written (`ppre log head`, or the head file the "
                        "Tester writes beside the key): detects records removed from the end or a rewritten "
                        f"tail (env {HEAD_ENV}; default: KEYFILE.head when it exists)")
    v.set_defaults(func=run)
    h = actions.add_parser("head", help="print the head (N:MAC) of an intact log, to keep in a second place")
    _common(h)
    h.set_defaults(func=run_head)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", help="the audit log (`ppre tester serve --audit-log FILE`)")
    p.add_argument("--key", metavar="FILE", default=os.environ.get(KEY_ENV),
                   help=f"the log's key file (`ppre tester serve --audit-log-key FILE`; env {KEY_ENV}); "
                        "without it only a log of the older, unkeyed kind verifies")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _key(args: argparse.Namespace) -> bytes | None:
    from tester_service.audit_log import load_key
    return load_key(args.key) if args.key else None


def _expected_head(args: argparse.Namespace):
    from tester_service.audit_log import head_path, parse_head
    if args.expect_head:
        return parse_head(args.expect_head)
    if args.key and head_path(args.key).is_file():
        return parse_head(str(head_path(args.key)))
    return None


def run(args: argparse.Namespace) -> int:
    from tester_service.audit_log import verify

    result = verify(args.file, _key(args), _expected_head(args))
    if args.json:
        print(json.dumps({"ok": result.ok, "records": result.records, "broken_line": result.broken_line,
                          "reason": result.reason}))
    elif result.ok:
        print(f"{args.file}: {result.records} records, {result.reason}")
    else:
        where = f"record at line {result.broken_line}" if result.broken_line else "the file"
        print(f"{args.file}: BROKEN at {where}: {result.reason} ({result.records} records before it intact)")
    return 0 if result.ok else 1


def run_head(args: argparse.Namespace) -> int:
    """The head of an intact log (`N:MAC`); a broken log prints why and exits 1."""
    from tester_service.audit_log import format_head, verify

    result = verify(args.file, _key(args))
    if not result.ok:
        print(f"{args.file}: BROKEN at line {result.broken_line}: {result.reason}; no head to export")
        return 1
    head = format_head(result.records, result.last)
    print(json.dumps({"records": result.records, "head": head}) if args.json else head)
    return 0
