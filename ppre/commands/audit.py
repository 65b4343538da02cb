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
import contextlib
import json
import os
import sys

from common.stats.bootstrap import DEFAULT_CONFIDENCE, DEFAULT_REPLICATES
from common.errors import InputError, PPREError
from common.metrics import METRICS
from common.stats.results import DEFAULT_TAU
from ppre.commands import add_executor_argument, add_log_arguments, add_tls_arguments, tls_identity
from ppre.commands.tester import (add_preparation_arguments, add_release_arguments, preparation_config,
                                  release_settings)


LOCAL_DATASET = "local"
#: named flags for the metrics' parameters (each also settable with --metric-param)
PARAM_FLAGS = {"reference-scores": "reference_scores", "bandwidth": "bandwidth", "dti-weights": "dti_weights",
               "pairs": "pairs", "count-threshold": "count_threshold", "inclusion-level": "inclusion_level",
               "same-group-pairs": "same_group_pairs", "decision-threshold": "decision_threshold",
               # declared value bounds the release noise is sized from (a negative LO: --outcome-range=-1:3)
               "outcome-range": "outcome_range", "relevance-range": "relevance_range",
               "max-queries-per-viewer": "max_queries_per_viewer", "out-of-range": "out_of_range"}


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


def metric_name(text: str) -> str:
    """`--metric`: a metric's name, in any case and with `_` for `-` (dataset files are
    named mqos_auc.csv, the metric mqos-auc); a near miss gets a did-you-mean."""
    from common.tables import did_you_mean
    name = text.strip().lower().replace("_", "-")
    if name in METRICS:
        return name
    raise argparse.ArgumentTypeError(f"unknown metric '{text}'{did_you_mean(text, METRICS)}; the metrics: "
                                     f"{', '.join(METRICS)}")


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("audit", help="run one audit through the Tester's RunAudit")
    s.add_argument("--tester", help="HOST:PORT of the Tester service")
    s.add_argument("--client-dataset", help="dataset name known to the Test-Client")
    s.add_argument("--metric", required=True, choices=list(METRICS), type=metric_name, metavar="METRIC",
                   help=f"metric to audit: {', '.join(METRICS)} ('_' for '-' is accepted)")
    s.add_argument("--metric-option", "--ero-form", dest="metric_option", default="",
                   help="; ".join(f"{m.name}: {m.option_help}" for m in METRICS.values() if m.option_help))
    s.add_argument("--metric-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a metric parameter: " + "; ".join(
                       f"{m.name}: {', '.join(p.name for p in m.params)}" for m in METRICS.values() if m.params))
    for flag, name in PARAM_FLAGS.items():
        s.add_argument(f"--{flag}", dest=f"param_{name}", default=None, help=f"same as --metric-param {name}=...")
    s.add_argument("--bootstrap", type=int, default=DEFAULT_REPLICATES, help="replicates B (default 1000)")
    s.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE, help="CI level (default 0.95)")
    s.add_argument("--seed", type=int, help="seed of the Tester's bucket assignment and resampling (not of any key, mask or release noise, nor of the randomized response on the Self-ID answers or the Test-Client's own random choices: two runs with one seed differ by those draws)")
    s.add_argument("--tau", type=float, default=DEFAULT_TAU, help="disparity threshold of the verdict")
    s.add_argument("--correction", choices=("none", "calibration"), default="none",
                   help="calibration: also report attenuation-corrected estimates M^-1 Num beside the "
                        "weighted ones (ero, output, mqos-ndcg, pot; docs/metrics/README.md)")
    s.add_argument("--result-recipient", choices=("client", "tester"), default="client",
                   help="who may learn the result: the Test-Client (default) or only the Tester")
    s.add_argument("--json", action="store_true", help="print exactly one JSON object")
    from ppre.report import report_directory
    s.add_argument("--report", metavar="DIR", type=report_directory,
                   help="after a successful audit also write DIR/report.html (the result as a page to read at a "
                        "glance) and DIR/report.json (the --json object); DIR is created, the paths go to stderr")
    s.add_argument("--local", action="store_true", help="start both services on loopback for this audit")
    s.add_argument("--tester-probabilities", help="--local: the Tester's probability table")
    s.add_argument("--client-data", help="--local: the Test-Client's dataset file")
    s.add_argument("--history", metavar="FILE",
                   help="--local: keep the result (aggregates only) in this run history, read with `ppre runs` "
                        "(default: $XDG_DATA_HOME/ppre/history.sqlite, else ~/.local/share/ppre/history.sqlite; "
                        "'none': keep nothing); the run id goes to stderr")
    s.add_argument("--tester-members", help="--local: members file (BISG + Self-ID + clipping per audit), "
                                            "instead of --tester-probabilities")
    add_preparation_arguments(s, prefix="tester-")
    from ppre.columns import add_column_arguments  # --tester-id-column, --tester-column, --client-...
    add_column_arguments(s, "tester-", env=False, whose="--local: the Tester's files")
    add_column_arguments(s, "client-", env=False, whose="--local: the Test-Client's --client-data")
    add_release_arguments(s, local=True)
    from tester_service.server import AUDIT_DEADLINE_S
    s.add_argument("--timeout", type=float, default=AUDIT_DEADLINE_S, metavar="SECONDS",
                   help=f"how long to wait for the whole audit (default {AUDIT_DEADLINE_S:.0f}, as long as the "
                        "Tester lets an audit run; a stalled peer is caught much sooner by the services' peer timeout, "
                        "PPRE_PEER_TIMEOUT)")
    add_executor_argument(s)
    add_log_arguments(s)
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


#: after Ctrl-C with --local: how long the two services get to drop the cancelled session
CANCEL_DRAIN_S = 5.0


def _progress(args):
    """Progress on stderr (ppre.progress): live bars on a terminal, plain `[  1.23s] PHASE:
    message` lines elsewhere, only the audit id with --json (stdout stays one object)."""
    from ppre.progress import for_stream
    return for_stream(sys.stderr, as_json=args.json)


def run(args: argparse.Namespace) -> int:
    """Ctrl-C cancels the audit on both services (the Tester sees the call cancelled,
    aborts the Test-Client's session) and exits 130 after one line, "cancelled"."""
    from ppre.commands import setup_logging

    setup_logging(args, "local" if args.local else "operator")
    with quiet_logs(args.json and not args.verbose):
        return _run_reporting(args)


def _run_reporting(args: argparse.Namespace) -> int:
    progress = _progress(args)
    try:
        return _run(args, progress)
    except PPREError as exc:
        if not args.json:
            raise
        progress.close()  # --json: the error is the one JSON object, as a refused audit's is
        print(json.dumps({"error": {"code": exc.code, "message": str(exc)}}), flush=True)
        return 2
    except KeyboardInterrupt:
        progress.close()
        if args.json:
            print(json.dumps({"error": {"code": "cancelled", "message": "cancelled by the operator (Ctrl-C)"}}),
                  flush=True)
        print("cancelled", file=sys.stderr, flush=True)
        return 130
    finally:
        progress.close()


@contextlib.contextmanager
def quiet_logs(quiet: bool):
    """`--json` without -v: no log line on stderr while the audit runs (the in-process
    services of --local log a refusal as a WARNING), which then holds only the
    `audit id:` and `run id:` lines; the outcome, an error included, is the JSON object
    on stdout."""
    import logging
    before = logging.root.manager.disable
    if quiet:
        logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(before)


#: the threads that run one audit's session in the Tester and in the Test-Client
SESSION_THREADS = ("ppre-audit", "ppre-session")


def _drain(services, seconds: float = CANCEL_DRAIN_S) -> None:
    """--local, after Ctrl-C: wait (bounded) until both services dropped the session and
    its threads have ended (their last log lines written)."""
    import threading
    import time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and (
            services.tester_servicer.active_sessions or services.client_servicer.active_sessions
            or any(t.name in SESSION_THREADS for t in threading.enumerate())):
        time.sleep(0.05)


def _run(args: argparse.Namespace, progress) -> int:
    from client_service.datasets import DatasetRegistry
    from common.tables import prefixed_mapping
    from ppre.local import local_services
    from tester_service.inputs import read_probability_table
    from tester_service.server import run_audit

    if args.local:
        if bool(args.tester_probabilities) == bool(args.tester_members) or not args.client_data:
            raise InputError("--local needs --client-data and one of --tester-probabilities, --tester-members",
                             parameter="--local")
        from ppre.columns import client_columns, tester_columns
        columns = tester_columns(args, "tester-")
        if args.tester_probabilities:
            path, mapping = args.tester_probabilities, preparation_config(args).group_mapping
            load = lambda: read_probability_table(path, mapping, columns)  # noqa: E731
        else:
            from tester_service.server import prepare_from_files
            members, self_id, preparation = args.tester_members, args.self_id, preparation_config(args)
            load = lambda: prepare_from_files(members, self_id, preparation, columns)  # noqa: E731
        load = in_context(load, prefixed_mapping("tester-"))
        prepared = load()  # fail fast, before any service starts
        registry = DatasetRegistry(named={LOCAL_DATASET: args.client_data}, columns=client_columns(args, "client-"),
                                   how=prefixed_mapping("client-"))
        refuse_no_match(prepared, args.client_data, registry.columns,
                        args.tester_members or args.tester_probabilities)
        request = build_request(args, LOCAL_DATASET)
        # mutual TLS with a development CA made in memory for this run (--insecure: plaintext)
        if args.insecure:
            from common.net.tls import INSECURE_WARNING
            print(INSECURE_WARNING, file=sys.stderr, flush=True)
        release, accountant = local_release(args)
        history = local_history(args)
        from ppre.commands import make_executor
        executor = make_executor(args)  # one pool for both local services
        try:
            with local_services(load, registry, tls=not args.insecure, release=release,
                                accountant=accountant, executor=executor, history=history) as services:
                try:
                    event = run_audit(services.tester_address, request, timeout=args.timeout,
                                      on_progress=progress, tls=services.operator_tls)
                except KeyboardInterrupt:  # the call is cancelled: let both sessions end cleanly
                    _drain(services)
                    raise
                _drain(services)  # their last log lines are written before the logs are restored
        finally:
            executor.shutdown(wait=False)
    else:
        if getattr(args, "history", None):
            raise InputError("is for --local: a Tester keeps its own history (`ppre tester serve --history`), "
                             "read it with `ppre runs list --tester`", parameter="--history")
        if not args.tester or not args.client_dataset:
            raise InputError("give --tester and --client-dataset (or --local)", parameter="--tester")
        request = build_request(args, args.client_dataset)
        tls = tls_identity(args)
        event = run_audit(args.tester, request, timeout=args.timeout, on_progress=progress, tls=tls,
                          server_name=args.tester_identity if tls is not None else None)
        explain_wrong_service(event, args)
    progress.close()  # the live line ends before the result is printed
    return print_event(event, as_json=args.json, insecure=args.insecure,
                       report_dir=getattr(args, "report", None), tester=None if args.local else args.tester)


def refuse_no_match(prepared, client_data: str, columns: dict[str, str], tester_file: str) -> None:
    """A local run whose dataset shares no member id with the Tester's members is refused
    before any encryption, saying so plainly. The operator holds both files (docs/design.md
    §8.2's "refused" wording keeps a Test-Client from learning the intersection's size; here
    the operator is both parties and learns nothing new). A service keeps that wording:
    its Tester cannot see the Test-Client's ids before the PSI, nor say a count to it.
    A dataset the id reader refuses is left to the audit, whose reader names the problem."""
    from common.tables import ID_COLUMN, read_text_table, shown_column
    try:
        ids = read_text_table(client_data, (ID_COLUMN,), columns={k: v for k, v in columns.items() if k == ID_COLUMN})
    except (InputError, OSError):
        return
    client_ids = set(ids.column(ID_COLUMN).to_pylist())
    if client_ids.isdisjoint(prepared[ID_COLUMN].astype(str)):
        raise InputError(f"no member id matched: none of its ids is among the members of {tester_file} (after "
                         "opted-out, non-US and excluded-state members are dropped); are both files of the same "
                         "members, with the ids in the same form and column (--client-id-column, "
                         "--tester-id-column)?", file=str(client_data), column=shown_column(ID_COLUMN, columns))


def run_id_words(run_id: str, tester: str | None = None) -> str:
    """The line under ``run id: ID``: what each of an audit's two ids is for (the audit id
    names the audit in both services' logs, from its start; the run id names its result in
    the run history, once there is one: docs/operations.md)."""
    where = f" --tester {tester}" if tester else ""
    return (f"  (the run id names this result in the run history: ppre runs show {run_id}{where}; "
            "the audit id printed first names this audit in both services' log lines)")


def explain_wrong_service(event, args: argparse.Namespace) -> None:
    """A refused TLS name check (`--tester` names another service's address): the error
    says whose service answered there and what --tester needs (`common.net.tls.wrong_service`)."""
    from common.net.tls import HOSTNAME_CHECK_FAILED, wrong_service
    if event.WhichOneof("event") == "error" and HOSTNAME_CHECK_FAILED in event.error.message:
        event.error.message = wrong_service(args.tester, args.tester_identity, "--tester", "the Tester",
                                            "--tester-identity")


def in_context(load, how):
    """`load`, whose missing-column errors say how to map a column in `how`'s words
    (`common.tables.MissingColumn`)."""
    from common.tables import MissingColumn

    def loaded():
        try:
            return load()
        except MissingColumn as exc:
            raise exc.in_context(how) from None
    return loaded


def local_release(args: argparse.Namespace):
    """`--local`'s release controls and privacy accountant: the flags' policy, and with
    the controls on the budget of this pair of input files (`release.local_accountant`:
    keyed by their contents, kept in --privacy-ledger or the user's data directory), or
    of the one identity --privacy-identity names."""
    from tester_service.release import local_accountant
    release, accountant = release_settings(args, local=True)
    if args.no_release_controls:
        return release, accountant
    tester_inputs = (args.tester_probabilities, None) if args.tester_probabilities else \
        (args.tester_members, args.self_id)
    if args.privacy_identity:
        from tester_service.release import PrivacyAccountant, local_ledger_path
        settings = ("--privacy-budget sets the budget, --privacy-ledger FILE keeps it in another file; "
                    f"--privacy-identity charges every audit to '{args.privacy_identity}' (without it, each pair "
                    "of input files has its own budget)")
        from tester_service.release import population_key
        return release, PrivacyAccountant(release.budget, args.privacy_ledger or local_ledger_path(),
                                          identity=args.privacy_identity, settings=settings,
                                          population=population_key(tester_inputs),
                                          population_budget=args.population_budget,
                                          max_population_refusals=args.max_population_refusals)
    return release, local_accountant(release.budget, tester_inputs, args.client_data, args.privacy_ledger,
                                     population_budget=args.population_budget,
                                     max_population_refusals=args.max_population_refusals)


def local_history(args: argparse.Namespace):
    """`--local`'s run history (tester_service.history), opened now so that a bad file
    fails before any service starts; None with `--history none`."""
    from tester_service.history import RunHistory, local_history_path
    if (args.history or "").strip().lower() == "none":
        return None
    return RunHistory(args.history or local_history_path())


#: what an --insecure audit's result says about its link (`info.transport`)
INSECURE_TRANSPORT = "insecure: plaintext gRPC, peers not authenticated"


def print_event(event, *, as_json: bool, insecure: bool = False, report_dir: str | None = None,
                tester: str | None = None) -> int:
    from common.stats.results import AuditReport
    from ppre.report.text import render_text

    if event.WhichOneof("event") == "error":
        if as_json:
            print(json.dumps({"error": {"code": event.error.code, "message": event.error.message}}))
        else:
            print(f"ppre audit: error ({event.error.code}): {event.error.message}", file=sys.stderr)
        return 2
    report = AuditReport.from_proto(event.result)
    if insecure:
        report.info["transport"] = INSECURE_TRANSPORT
    print(report.to_json() if as_json else render_text(report))
    if event.result.run_id:  # kept in the Tester's run history: stderr, so that --json stays one object
        print(f"run id: {event.result.run_id}", file=sys.stderr, flush=True)
        print(run_id_words(event.result.run_id, tester), file=sys.stderr, flush=True)
    if insecure and not as_json:
        print(f"WARNING: this audit ran over {INSECURE_TRANSPORT} (--insecure)")
    if report_dir:  # --report DIR: the page and exactly the --json object (ppre/report/)
        from ppre.report import write_report
        try:
            paths = write_report(report, report_dir, run_id=getattr(event.result, "run_id", "") or None)
        except OSError as exc:
            raise InputError(f"cannot write the report into {report_dir}: {exc.strerror or exc}",
                             parameter="--report") from None
        if not as_json:
            print("report: " + "  ".join(str(path) for path in paths), file=sys.stderr, flush=True)
    return 0
