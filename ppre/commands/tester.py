"""`ppre tester serve`: run the Tester service (P1)."""
from __future__ import annotations

import argparse
import os

from common.errors import InputError
from ppre.commands import add_service_arguments, link_settings



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
    s.add_argument("--members", default=os.environ.get("PPRE_TESTER_MEMBERS"),
                   help="members file (member_id, surname, zip[, first_name, tract, state, country, opt_out]): "
                        "BISG + Self-ID + clipping run inside each audit (env PPRE_TESTER_MEMBERS)")
    add_preparation_arguments(s)
    s.add_argument("--buckets", type=int, default=int(os.environ.get("PPRE_BOOTSTRAP_BUCKETS", "128")))
    s.add_argument("--audit-log", default=os.environ.get("PPRE_AUDIT_LOG"),
                   help="append every audit request and its outcome to this hash-chained log "
                        "(no member-level data; check it with `ppre log verify`) (env PPRE_AUDIT_LOG)")
    add_service_arguments(s)
    s.set_defaults(func=run)


def add_preparation_arguments(s: argparse.ArgumentParser, prefix: str = "") -> None:
    """The Tester's demographic preparation options (SPEC section 2), shared with `ppre audit --local`."""
    env = os.environ.get
    s.add_argument(f"--{prefix}self-id", dest="self_id", default=env("PPRE_TESTER_SELF_ID"),
                   help="Self-ID survey file (member_id, race) (env PPRE_TESTER_SELF_ID)")
    s.add_argument("--epsilon", type=float, default=env("PPRE_EPSILON", "4.5"),
                   help="randomized-response epsilon for Self-ID (default 4.5)")
    s.add_argument("--threshold", type=float, default=env("PPRE_CLIP_THRESHOLD"),
                   help="clipping threshold T (default: the 90%%-of-largest-BISG-probabilities rule)")
    s.add_argument("--excluded-states", default=env("PPRE_EXCLUDED_STATES", ""),
                   help="comma-separated state codes whose members are not measured")
    s.add_argument("--geo", choices=("zcta", "tract"), default=env("PPRE_GEO", "zcta"))
    s.add_argument("--first-names", action="store_true", default=env("PPRE_FIRST_NAMES", "") == "1",
                   help="BIFSG: use the members' first names")
    s.add_argument("--group-mapping", default=env("PPRE_GROUP_MAPPING", ""),
                   help="coarsened groups, e.g. 'hsm=black+hispanic+aian,non_hsm=white+api+multiple'")
    s.add_argument("--opt-out-column", default=env("PPRE_OPT_OUT_COLUMN", "opt_out"))


def preparation_config(args: argparse.Namespace):
    from common.races import GroupMapping
    from tester_service.preparation import PreparationConfig

    states = tuple(x.strip() for x in args.excluded_states.split(",") if x.strip())
    mapping = GroupMapping.parse(args.group_mapping) if args.group_mapping else None
    return PreparationConfig(epsilon=args.epsilon, threshold=args.threshold, excluded_states=states, geo=args.geo,
                             first_names=args.first_names, group_mapping=mapping,
                             opt_out_column=args.opt_out_column)


def run(args: argparse.Namespace) -> int:
    from ppre.commands import serve_forever
    from common.memory import protect_process

    protect_process()  # SPEC 7: a crash must not write keys or tables to disk (no core dumps)
    from tester_service.server import TesterConfig, serve
    if bool(args.probabilities) == bool(args.members):
        raise InputError("give exactly one of --probabilities (a prepared table) and --members",
                         parameter="--probabilities/--members")
    from tester_service.audit_log import AuditLog
    service = dict(n_buckets=args.buckets, settings=link_settings(args), max_sessions=args.max_sessions,
                   audit_log=AuditLog(args.audit_log) if args.audit_log else None)
    if args.probabilities:
        mapping = preparation_config(args).group_mapping
        config = TesterConfig.from_probability_file(args.client, args.probabilities, mapping, **service)
        config.load_probabilities()  # check the table now, not at the first audit
    else:
        config = TesterConfig.from_members(args.client, args.members, args.self_id, preparation_config(args),
                                           **service)
        config.load_probabilities()  # check the files and parameters now, not at the first audit
    server, port, servicer = serve(config, args.port, args.host)
    print(f"tester serving on {args.host}:{port}; Test-Client at {args.client}", flush=True)
    return serve_forever(server, servicer)
