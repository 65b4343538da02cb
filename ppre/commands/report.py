"""`ppre report RUN_ID DIR`: the HTML and JSON report of a run kept in the run history
(`ppre.report`), from the local history file or from a Tester (`ppre runs`' sources)."""
from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from ppre.commands.runs import add_source_arguments

    s = sub.add_parser("report", help="write report.html and report.json of a run from the history")
    s.add_argument("run_id", metavar="RUN_ID", help="the run's id (`ppre runs list`)")
    s.add_argument("directory", metavar="DIR", help="where to write report.html and report.json (created)")
    add_source_arguments(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from common.stats.results import AuditReport
    from ppre.commands.runs import get_run
    from ppre.report import write_report

    record = get_run(args)
    html, data = write_report(AuditReport.from_json(record.report_json), args.directory, run_id=record.run_id,
                              generated=audit_time(record),
                              correction=str(record.parameters.get("correction") or ""))
    if getattr(args, "json", False):  # --json: exactly one JSON object on stdout
        print(json.dumps({"run_id": record.run_id, "html": str(html), "json": str(data)}))
    else:
        print(f"report: {html}  {data}", file=sys.stderr)
    return 0


def audit_time(record) -> "datetime.datetime | None":
    """When the run's audit finished (its history record), the time its report is dated
    at; None (render time) for a record without a readable time."""
    import datetime
    raw = (record.finished_at or record.started_at or "").strip()
    try:
        moment = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=datetime.timezone.utc)
