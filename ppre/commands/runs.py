"""`ppre runs list` and `ppre runs show ID`: the run history of finished audits (aggregates only).

Against a Tester started with `--history FILE` (`--tester HOST:PORT`, with the same TLS
options as `ppre audit`; only allow-listed operators may read it: its `ListRuns` and
`GetRun` RPCs), or a history file directly (`--history FILE`; default the one
`ppre audit --local` keeps in the user's data directory). `tester_service.history`
describes what a run holds.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from common.errors import InputError, PPREError
from ppre.commands import add_tls_arguments, tls_identity


class RunsError(PPREError):
    """A Tester refused or failed a ListRuns / GetRun call: `code` is its gRPC status in lower case."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("runs", help="the run history of finished audits (aggregates only)")
    actions = parser.add_subparsers(dest="action", required=True)
    ls = actions.add_parser("list", help="finished audits, newest first")
    ls.add_argument("--metric", help="only this metric")
    ls.add_argument("--dataset", help="only this client dataset name")
    ls.add_argument("--since", metavar="DATE", help="started on or after: YYYY-MM-DD or an ISO date and time "
                                                    "(UTC unless it says otherwise)")
    ls.add_argument("--until", metavar="DATE", help="started on or before (a date: until the end of that day)")
    ls.add_argument("--limit", type=int, default=None, metavar="N", help="at most N runs (default 50)")
    add_source_arguments(ls)
    ls.set_defaults(func=run_list)
    show = actions.add_parser("show", help="one finished audit's result, as `ppre audit` printed it")
    show.add_argument("run_id", metavar="ID", help="the run id (`ppre runs list`, or printed by `ppre audit`)")
    add_source_arguments(show)
    show.set_defaults(func=run_show)


def add_source_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--json", action="store_true", help="print exactly one JSON object")
    s.add_argument("--history", metavar="FILE",
                   help="read this history file (default, without --tester: $XDG_DATA_HOME/ppre/history.sqlite, "
                        "else ~/.local/share/ppre/history.sqlite, where `ppre audit --local` keeps its runs)")
    s.add_argument("--tester", metavar="HOST:PORT", help="ask this Tester (started with --history) instead")
    s.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS")
    add_tls_arguments(s, "operator")
    s.add_argument("--tester-identity", default=os.environ.get("PPRE_TESTER_IDENTITY", "tester.ppre.local"),
                   metavar="NAME", help="the identity the Tester's certificate must carry, whatever address "
                                        "--tester names (env PPRE_TESTER_IDENTITY, default tester.ppre.local)")


# --------------------------------------------------------------------------- where the runs come from

def _local(args: argparse.Namespace):
    """The history file (None: the default file does not exist yet, so no runs)."""
    from tester_service.history import RunHistory, local_history_path
    if args.history:
        return RunHistory(args.history, create=False)
    path = local_history_path()
    return RunHistory(path, create=False) if path.exists() else None


def _stub(args: argparse.Namespace):
    """(channel, TesterStub) for --tester, with the operator's TLS identity (or --insecure)."""
    from common.net import channels
    from proto import ppre_pb2_grpc as pb_grpc
    if args.history:
        raise InputError("give --tester or --history, not both", parameter="--history")
    tls = tls_identity(args)
    channel = channels.make_channel(args.tester, tls=tls, server_name=args.tester_identity if tls else None)
    return channel, pb_grpc.TesterStub(channel)


def _remote_error(exc, address: str, identity: str | None = None) -> RunsError:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    name = code.name.lower() if code is not None else "unavailable"
    details = exc.details() if callable(getattr(exc, "details", None)) else ""
    from common.net.tls import HOSTNAME_CHECK_FAILED, wrong_service
    if identity and HOSTNAME_CHECK_FAILED in (details or ""):
        return RunsError(name, wrong_service(address, identity, "--tester", "the Tester", "--tester-identity"))
    if name == "unavailable":
        return RunsError(name, f"Tester at {address}: cannot be reached or went away ({details or 'no details'})")
    return RunsError(name, f"Tester at {address}: {details or name}")


def list_runs(args: argparse.Namespace):
    """The runs asked for (RunRecords without their results), newest first."""
    import grpc

    from tester_service.history import RunRecord
    if args.limit is not None and args.limit < 1:
        raise InputError("must be at least 1", parameter="--limit")
    if not args.tester:
        history = _local(args)
        if history is None:
            return []
        return history.list(metric=args.metric, dataset=args.dataset, since=args.since, until=args.until,
                            limit=args.limit)
    from proto import ppre_pb2 as pb
    channel, stub = _stub(args)
    with channel:
        try:
            reply = stub.ListRuns(pb.ListRunsRequest(metric=args.metric or "", dataset=args.dataset or "",
                                                     since=args.since or "", until=args.until or "",
                                                     limit=args.limit or 0), timeout=args.timeout)
        except grpc.RpcError as exc:
            raise _remote_error(exc, args.tester, args.tester_identity) from None
    return [RunRecord.from_proto(summary) for summary in reply.runs]


def get_run(args: argparse.Namespace):
    """One run with its result (RunNotFound / a "not_found" RunsError naming the id)."""
    import grpc

    from tester_service.history import RunNotFound, RunRecord
    if not args.tester:
        history = _local(args)
        if history is None:
            raise RunNotFound(args.run_id)
        return history.get(args.run_id)
    from proto import ppre_pb2 as pb
    channel, stub = _stub(args)
    with channel:
        try:
            return RunRecord.from_proto(stub.GetRun(pb.GetRunRequest(run_id=args.run_id), timeout=args.timeout))
        except grpc.RpcError as exc:
            raise _remote_error(exc, args.tester, args.tester_identity) from None


# --------------------------------------------------------------------------- printing

def _errors_as_json(command):
    """With --json, an error is `{"error": {code, message}}` on stdout (exit 2), as `ppre audit` does."""
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except PPREError as exc:
            if not args.json:
                raise
            print(json.dumps({"error": {"code": exc.code, "message": str(exc)}}))
            return 2
    return run


def _when(stamp: str) -> str:
    """'2026-03-01T12:00:05.123456Z' -> '2026-03-01 12:00:05Z'."""
    return stamp[:19].replace("T", " ") + "Z" if len(stamp) >= 19 else stamp


def format_table(runs) -> str:
    head = f"{'id':<14}{'date (UTC)':<22}{'metric':<22}{'dataset':<20}{'n_matched':>10}  severity"
    lines = [head]
    for r in runs:
        metric = f"{r.metric} ({r.metric_option})" if r.metric_option else r.metric
        lines.append(f"{r.run_id:<14}{_when(r.started_at):<22}{metric:<22}{r.dataset:<20}{r.n_matched:>10}  "
                     f"{r.severity}")
    return "\n".join(lines)


@_errors_as_json
def run_list(args: argparse.Namespace) -> int:
    runs = list_runs(args)
    if args.json:
        print(json.dumps({"runs": [r.summary() for r in runs]}))
    elif runs:
        print(format_table(runs))
    else:
        print("no runs", file=sys.stderr)
    return 0


@_errors_as_json
def run_show(args: argparse.Namespace) -> int:
    from common.stats.results import AuditReport
    from ppre.report.text import render_text

    record = get_run(args)
    if args.json:
        print(record.report_json)  # exactly the result the operator received
        return 0
    params = ", ".join(f"{k} {v}" for k, v in sorted(record.parameters.items())
                       if v is not None and k != "metric_params")
    metric_params = record.parameters.get("metric_params") or {}
    if metric_params:
        params += ", metric params " + ", ".join(f"{k}={v}" for k, v in sorted(metric_params.items()))
    print(f"run {record.run_id}: started {_when(record.started_at)}, finished {_when(record.finished_at)}")
    print(f"operator {record.operator or '-'}; Test-Client {record.client or '-'}; dataset {record.dataset}")
    if params:
        print(f"request: {params}")
    print(render_text(AuditReport.from_json(record.report_json)))
    return 0
