"""`ppre audit`: the operator's command (issue 2, point 7).

Against running services: `ppre audit --tester HOST:PORT --client-dataset NAME --metric ero`.
Locally: `ppre audit --local --metric ero --tester-probabilities FILE --client-data FILE`
starts both services as real gRPC servers on loopback ports for that one audit.
With --json it prints exactly one JSON object (the result, or {"error": ...}).
"""
from __future__ import annotations

import argparse
import json
import sys

from common.bootstrap import DEFAULT_CONFIDENCE, DEFAULT_REPLICATES
from common.errors import InputError
from common.report import DEFAULT_TAU
from ppre.commands.tester import add_preparation_arguments, preparation_config


LOCAL_DATASET = "local"


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("audit", help="run one audit through the Tester's RunAudit")
    s.add_argument("--tester", help="HOST:PORT of the Tester service")
    s.add_argument("--client-dataset", help="dataset name known to the Test-Client")
    s.add_argument("--metric", required=True, help="metric to audit (ero)")
    s.add_argument("--metric-option", "--ero-form", dest="metric_option", default="",
                   help="ERO: fpr (default) or unconditional (paper eq. 6)")
    s.add_argument("--bootstrap", type=int, default=DEFAULT_REPLICATES, help="replicates B (default 1000)")
    s.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE, help="CI level (default 0.95)")
    s.add_argument("--seed", type=int, help="seed of the bootstrap resampling (not of any key or mask)")
    s.add_argument("--tau", type=float, default=DEFAULT_TAU, help="disparity threshold of the verdict")
    s.add_argument("--result-recipient", choices=("client", "tester"), default="client",
                   help="who may learn the result: the Test-Client (default) or only the Tester")
    s.add_argument("--json", action="store_true", help="print exactly one JSON object")
    s.add_argument("--local", action="store_true", help="start both services on loopback for this audit")
    s.add_argument("--tester-probabilities", help="--local: the Tester's probability table")
    s.add_argument("--client-data", help="--local: the Test-Client's dataset file")
    s.add_argument("--tester-members", help="--local: members file (BISG + Self-ID + clipping per audit), "
                                            "instead of --tester-probabilities")
    add_preparation_arguments(s, prefix="tester-")
    s.add_argument("--timeout", type=float, default=3600.0)
    s.set_defaults(func=run)


def build_request(args: argparse.Namespace, dataset: str):
    from proto import ppre_pb2 as pb

    if args.bootstrap < 1:
        raise InputError("must be at least 1", parameter="--bootstrap")
    if not 0 < args.confidence < 1:
        raise InputError("must be strictly between 0 and 1", parameter="--confidence")
    return pb.AuditRequest(metric=args.metric, client_dataset=dataset, bootstrap=args.bootstrap,
                           confidence=args.confidence, has_seed=args.seed is not None, seed=args.seed or 0,
                           result_recipient=args.result_recipient, metric_option=args.metric_option, tau=args.tau)


def _progress(args):
    if args.json:
        return None
    return lambda p: print(f"[{p.elapsed_s:7.2f}s] {p.phase}: {p.message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from client_service.datasets import DatasetRegistry
    from ppre.local import local_services
    from tester_service.inputs import read_probability_table
    from tester_service.server import run_audit

    if args.local:
        if bool(args.tester_probabilities) == bool(args.tester_members) or not args.client_data:
            raise InputError("--local needs --client-data and one of --tester-probabilities, --tester-members",
                             parameter="--local")
        if args.tester_probabilities:
            path = args.tester_probabilities
            load = lambda: read_probability_table(path)  # noqa: E731
        else:
            from tester_service.server import prepare_from_files
            members, self_id, preparation = args.tester_members, args.self_id, preparation_config(args)
            load = lambda: prepare_from_files(members, self_id, preparation)  # noqa: E731
        load()  # fail fast, before any service starts
        registry = DatasetRegistry(named={LOCAL_DATASET: args.client_data})
        request = build_request(args, LOCAL_DATASET)
        with local_services(load, registry) as services:
            event = run_audit(services.tester_address, request, timeout=args.timeout, on_progress=_progress(args))
    else:
        if not args.tester or not args.client_dataset:
            raise InputError("give --tester and --client-dataset (or --local)", parameter="--tester")
        event = run_audit(args.tester, build_request(args, args.client_dataset), timeout=args.timeout,
                          on_progress=_progress(args))
    return print_event(event, as_json=args.json)


def print_event(event, *, as_json: bool) -> int:
    from common.report import AuditReport

    if event.WhichOneof("event") == "error":
        if as_json:
            print(json.dumps({"error": {"code": event.error.code, "message": event.error.message}}))
        else:
            print(f"ppre audit: error ({event.error.code}): {event.error.message}", file=sys.stderr)
        return 2
    report = AuditReport.from_proto(event.result)
    print(report.to_json() if as_json else report.to_table())
    return 0
