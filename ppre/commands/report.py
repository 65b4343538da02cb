"""`ppre report RUN_ID DIR`: the HTML and JSON report of a run kept in the run history
(`ppre.report`), from the local history file or from a Tester (`ppre runs`' sources)."""
from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    from ppre.commands.runs import _source_arguments

    s = sub.add_parser("report", help="write report.html and report.json of a run from the history")
    s.add_argument("run_id", metavar="RUN_ID", help="the run's id (`ppre runs list`)")
    s.add_argument("directory", metavar="DIR", help="where to write report.html and report.json (created)")
    _source_arguments(s)
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from common.results import AuditReport
    from ppre.commands.runs import get_run
    from ppre.report import write_report

    record = get_run(args)
    html, data = write_report(AuditReport.from_json(record.report_json), args.directory, run_id=record.run_id)
    print(f"report: {html}  {data}", file=sys.stderr)
    return 0
