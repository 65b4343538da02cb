"""`ppre audit`: the operator's command.

Against running services: `ppre audit --tester HOST:PORT --client-dataset NAME --metric ero`.
Locally: `ppre audit --local --metric ero --tester-probabilities FILE --client-data FILE`
starts both services as real gRPC servers on loopback ports for that one audit.
With --json it prints exactly one JSON object (the result, or {"error": ...}).
Metrics (`common.metrics`): ero, lot, mqos-ndcg, pot, mqos-auc, output, prob-count; a
metric's option with --metric-option, its parameters with --metric-param NAME=VALUE
(or the named flags below).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from common.bootstrap import DEFAULT_CONFIDENCE, DEFAULT_REPLICATES
from common.errors import InputError
from common.metrics import METRICS
from common.results import DEFAULT_TAU
from ppre.commands import add_executor_argument, add_tls_arguments, tls_identity
from ppre.commands.tester import (add_preparation_arguments, add_release_arguments, preparation_config,
                                  release_settings)


LOCAL_DATASET = "local"
#: named flags for the metrics' parameters (each also settable with --metric-param)
PARAM_FLAGS = {"reference-scores": "reference_scores", "bandwidth": "bandwidth", "dti-weights": "dti_weights",
               "pairs": "pairs", "count-threshold": "count_threshold", "inclusion-level": "inclusion_level",
               "same-group-pairs": "same_group_pairs"}


def metric_params(args: argparse.Namespace) -> dict[str, str]:
    params = {}
    for item in args.metric_param:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise InputError(f"'{item}' is not NAME=VALUE", parameter="--metric-param")
        params[name.strip()] = value.strip()
    for name in PARAM_FLAGS.values():
        value = getattr(args, f"param_{name}", None)
        if value is not None:
            params[name] = value
    return params


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("audit", help="run one audit through the Tester's RunAudit")
    s.add_argument("--tester", help="HOST:PORT of the Tester service")
    s.add_argument("--client-dataset", help="dataset name known to the Test-Client")
    s.add_argument("--metric", required=True, choices=list(METRICS), help="metric to audit")
    s.add_argument("--metric-option", "--ero-form", dest="metric_option", default="",
                   help="; ".join(f"{m.name}: {m.option_help}" for m in METRICS.values() if m.option_help))
    s.add_argument("--metric-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a metric parameter: " + "; ".join(
                       f"{m.name}: {', '.join(p.name for p in m.params)}" for m in METRICS.values() if m.params))
    for flag, name in PARAM_FLAGS.items():
        s.add_argument(f"--{flag}", dest=f"param_{name}", default=None, help=f"same as --metric-param {name}=...")
    s.add_argument("--bootstrap", type=int, default=DEFAULT_REPLICATES, help="replicates B (default 1000)")
    s.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE, help="CI level (default 0.95)")
    s.add_argument("--seed", type=int, help="seed of the Tester's bucket assignment and resampling (not of any key, mask, or the Test-Client's own random choices)")
    s.add_argument("--tau", type=float, default=DEFAULT_TAU, help="disparity threshold of the verdict")
    s.add_argument("--correction", choices=("none", "calibration"), default="none",
                   help="calibration: also report attenuation-corrected estimates M^-1 Num beside the "
                        "weighted ones (ero, output, mqos-ndcg, pot; README, 'Corrected estimates')")
    s.add_argument("--result-recipient", choices=("client", "tester"), default="client",
                   help="who may learn the result: the Test-Client (default) or only the Tester")
    s.add_argument("--json", action="store_true", help="print exactly one JSON object")
    s.add_argument("--local", action="store_true", help="start both services on loopback for this audit")
    s.add_argument("--tester-probabilities", help="--local: the Tester's probability table")
    s.add_argument("--client-data", help="--local: the Test-Client's dataset file")
    s.add_argument("--tester-members", help="--local: members file (BISG + Self-ID + clipping per audit), "
                                            "instead of --tester-probabilities")
    add_preparation_arguments(s, prefix="tester-")
    add_release_arguments(s, local=True)
    s.add_argument("--timeout", type=float, default=3600.0)
    add_executor_argument(s)
    add_tls_arguments(s, "operator")
    s.add_argument("--tester-identity", default=os.environ.get("PPRE_TESTER_IDENTITY", "tester.ppre.local"),
                   metavar="NAME", help="the identity the Tester's certificate must carry, whatever address "
                                        "--tester names (env PPRE_TESTER_IDENTITY, default tester.ppre.local)")
    s.set_defaults(func=run)


def build_request(args: argparse.Namespace, dataset: str):
    from proto import ppre_pb2 as pb

    if args.bootstrap < 1:
        raise InputError("must be at least 1", parameter="--bootstrap")
    if not 0 < args.confidence < 1:
        raise InputError("must be strictly between 0 and 1", parameter="--confidence")
    return pb.AuditRequest(metric=args.metric, client_dataset=dataset, bootstrap=args.bootstrap,
                           confidence=args.confidence, has_seed=args.seed is not None, seed=args.seed or 0,
                           result_recipient=args.result_recipient, metric_option=args.metric_option, tau=args.tau,
                           metric_params=metric_params(args), correction=args.correction)


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
            path, mapping = args.tester_probabilities, preparation_config(args).group_mapping
            load = lambda: read_probability_table(path, mapping)  # noqa: E731
        else:
            from tester_service.server import prepare_from_files
            members, self_id, preparation = args.tester_members, args.self_id, preparation_config(args)
            load = lambda: prepare_from_files(members, self_id, preparation)  # noqa: E731
        load()  # fail fast, before any service starts
        registry = DatasetRegistry(named={LOCAL_DATASET: args.client_data})
        request = build_request(args, LOCAL_DATASET)
        # mutual TLS with a development CA made in memory for this run (--insecure: plaintext)
        if args.insecure:
            from common.tls import INSECURE_WARNING
            print(INSECURE_WARNING, file=sys.stderr, flush=True)
        release, accountant = release_settings(args, local=True)
        from ppre.commands import make_executor
        executor = make_executor(args)  # one pool for both local services
        try:
            with local_services(load, registry, tls=not args.insecure, release=release,
                                accountant=accountant, executor=executor) as services:
                event = run_audit(services.tester_address, request, timeout=args.timeout,
                                  on_progress=_progress(args), tls=services.operator_tls)
        finally:
            executor.shutdown(wait=False)
    else:
        if not args.tester or not args.client_dataset:
            raise InputError("give --tester and --client-dataset (or --local)", parameter="--tester")
        request = build_request(args, args.client_dataset)
        tls = tls_identity(args)
        event = run_audit(args.tester, request, timeout=args.timeout, on_progress=_progress(args), tls=tls,
                          server_name=args.tester_identity if tls is not None else None)
    return print_event(event, as_json=args.json, insecure=args.insecure)


#: what an --insecure audit's result says about its link (`info.transport`)
INSECURE_TRANSPORT = "insecure: plaintext gRPC, peers not authenticated"


def print_event(event, *, as_json: bool, insecure: bool = False) -> int:
    from common.results import AuditReport

    if event.WhichOneof("event") == "error":
        if as_json:
            print(json.dumps({"error": {"code": event.error.code, "message": event.error.message}}))
        else:
            print(f"ppre audit: error ({event.error.code}): {event.error.message}", file=sys.stderr)
        return 2
    report = AuditReport.from_proto(event.result)
    if insecure:
        report.info["transport"] = INSECURE_TRANSPORT
    print(report.to_json() if as_json else report.to_table())
    if insecure and not as_json:
        print(f"WARNING: this audit ran over {INSECURE_TRANSPORT} (--insecure)")
    return 0
