"""Audit reports people read at a glance: `report.html` and `report.json`.

`write_report(report, directory)` writes, each atomically (a temporary file in the same
directory, then a rename; the directory is created):

* ``report.json``: exactly `AuditReport.to_dict()`, byte for byte what
  ``ppre audit --json`` prints;
* ``report.html``: one self-contained page (inline CSS and inline SVG; no script, no
  font, image or style sheet from anywhere else) with the verdict in words and colour
  near the top, the per-group estimates as a table and a forest plot, pair metrics as a
  coloured matrix, POT's curves as line charts with their interval bands, the
  probabilistic count's pools with inclusion flags, the differences, the parameters,
  the counts and the data's provenance.

The page shows only what the result holds, and the result holds aggregates only (no
member id, probability or test value: `common.stats.results`). Every string from the result
is escaped (`html.escape`) before it goes into the page, in the HTML and in the SVG.

``ppre audit ... --report DIR`` calls `write_report` after a successful audit;
``python -m ppre.report RESULT.json DIR`` renders a saved ``--json`` result.

The package is in three layers, each a module: `ppre.report.model` (what the page says:
the words and numbers computed from an `AuditReport`, no markup), `ppre.report.plots`
(the inline SVG charts; may import the model) and `ppre.report.html` (the sections and
the page; may import the model and the plots), with `ppre.report.escape` under the last
two; beside them `ppre.report.text`, the result as the plain-text tables the commands
print (`render_text`; may import the model). This module writes the files and re-exports the names other code imports from
``ppre.report``.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from ppre.report.html import (
    CSS, NEGATIVE_RGB, POSITIVE_RGB, SEVERITY_COLOURS, cells_section, counts_section, curves_section,
    differences_section, groups_section, parameters_section, pools_section, provenance_section, receipt_section,
    render_html, verdict_section,
)
from ppre.report.model import (
    AGGREGATES_ONLY, METRIC_TITLES, PHASE_TOTAL, PREPARATION_WORDS, PROVENANCE, PROVENANCE_TABLE, RULE_WORDS,
    intervals_words,
)
from ppre.report.plots import (
    BAND_COLOUR, CORRECTED_COLOUR, GRID_COLOUR, MUTED_COLOUR, OVERALL_COLOUR, WEIGHTED_COLOUR, curve_charts,
    forest_legend, forest_plot,
)
from ppre.report.text import render_text

if TYPE_CHECKING:  # pragma: no cover
    from common.stats.results import AuditReport

__all__ = [
    "AGGREGATES_ONLY", "BAND_COLOUR", "CORRECTED_COLOUR", "CSS", "GRID_COLOUR", "HTML_NAME", "JSON_NAME",
    "METRIC_TITLES", "MUTED_COLOUR", "NEGATIVE_RGB", "OVERALL_COLOUR", "PHASE_TOTAL", "POSITIVE_RGB",
    "PREPARATION_WORDS", "PROVENANCE", "PROVENANCE_TABLE", "RULE_WORDS", "SEVERITY_COLOURS", "WEIGHTED_COLOUR",
    "cells_section", "counts_section", "curve_charts", "curves_section", "differences_section",
    "forest_legend", "forest_plot", "groups_section", "intervals_words", "main", "parameters_section",
    "pools_section", "provenance_section", "receipt_section", "render_html", "render_text", "report_directory",
    "verdict_section", "write_report",
]


HTML_NAME = "report.html"
JSON_NAME = "report.json"


def write_report(report: "AuditReport", directory, *, run_id: str | None = None,
                 generated: _dt.datetime | None = None, correction: str = "") -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.json`` into `directory` (created if missing) and
    return their paths (html, json). `generated`: the time the page is dated at (default
    now; a run from the history: the audit's own time). `correction`: the correction
    the request asked for (a run from the history), which a receipt's page names since
    the receipt itself holds none (design §3.7). Each file is written to a
    temporary file in the same directory and renamed into place, so a reader never sees
    half a file; on any error the temporary files are removed and the error is raised
    (OSError for the disk)."""
    from client_service.results import kept_json
    from ppre.report.model import is_client_copy
    directory = Path(directory)
    page = render_html(report, run_id=run_id, generated=generated,
                       correction=correction)  # render first: an error leaves no file
    data = (kept_json(report) if is_client_copy(report) else report.to_json()) + "\n"  # the count: the Tester's
    directory.mkdir(parents=True, exist_ok=True)
    html_path, json_path = directory / HTML_NAME, directory / JSON_NAME
    temps: list[str] = []
    try:
        html_tmp = _write_temp(directory, HTML_NAME, page, temps)
        json_tmp = _write_temp(directory, JSON_NAME, data, temps)
        os.replace(html_tmp, html_path)
        temps.remove(html_tmp)
        try:
            os.replace(json_tmp, json_path)
        except BaseException:
            html_path.unlink(missing_ok=True)  # never half a pair from one run
            raise
        temps.remove(json_tmp)
    finally:
        for name in temps:
            try:
                os.unlink(name)
            except OSError:
                pass
    return html_path, json_path


def _write_temp(directory: Path, name: str, text: str, temps: list[str]) -> str:
    """A new hidden file beside `name` holding `text`, flushed to disk; created with mode
    0666 less the umask, as `> file` would (not mkstemp's 0600: a report is for reading)."""
    for _ in range(100):
        tmp = str(directory / f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover
        raise FileExistsError(f"no free temporary name in {directory}")
    temps.append(tmp)
    with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp


def report_directory(value: str) -> str:
    """argparse type of ``--report DIR``: the directory, or the nearest folder above it
    that exists, must be a writable directory; checked before the audit runs, so that a
    typo does not cost an audit (and its privacy budget)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("give a directory")
    path = Path(value).expanduser()
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        where = "is not a directory" if probe == path else f"cannot be created: {probe} is not a directory"
        raise argparse.ArgumentTypeError(f"{value} {where}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{value} is not writable ({probe} does not allow writing)")
    try:  # what the permission bits promise root, a file system (/proc, read-only) may still refuse
        os.rmdir(tempfile.mkdtemp(prefix=".ppre-report-probe-", dir=probe))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{value} is not writable ({probe}: {exc.strerror or exc})") from None
    return str(path)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ppre.report RESULT.json DIR``: a report from a saved ``--json`` result."""
    parser = argparse.ArgumentParser(prog="python -m ppre.report", description=main.__doc__)
    parser.add_argument("result", help="a result as `ppre audit --json` printed it")
    parser.add_argument("directory", type=report_directory, help="where to write report.html and report.json")
    parser.add_argument("--run-id", help="the run id to show")
    args = parser.parse_args(argv)
    from common.errors import PPREError
    from client_service.results import read_kept
    try:
        text = Path(args.result).read_text(encoding="utf-8")
        report = read_kept(text)  # also a Test-Client's copy, whose joined rows are the Tester's
        paths = write_report(report, args.directory, run_id=args.run_id)
    except (OSError, PPREError) as exc:
        print(f"ppre report: error: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0
