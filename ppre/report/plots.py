"""The report's charts, drawn as inline SVG by hand (no plotting library, no script):
the forest plot of the per-group estimates with its key (`forest_plot`, `forest_legend`),
and POT's curves, a small panel per group with its interval band (`curve_charts`); with
them the axis scales and ticks and the colours of the weighted, corrected and overall
estimates. Every string from the result is escaped (`ppre.report.escape`) before it goes
into a chart. It may import `ppre.report.model` (the numbers and words it draws) and
`ppre.report.escape`; never `ppre.report.html`, which places the charts on the page.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Iterable, NamedTuple, Sequence

from ppre.report.escape import esc
from ppre.report.model import ci_text, finite, num, reference_line

if TYPE_CHECKING:  # pragma: no cover
    from common.stats.results import AuditReport


WEIGHTED_COLOUR = "#1f4e9c"     # the weighted (paper's) estimates: points, whiskers, curves
CORRECTED_COLOUR = "#c2410c"    # the attenuation-corrected estimates
OVERALL_COLOUR = "#333333"      # the overall row and the reference line
BAND_COLOUR = "#e3ecf7"         # the tau band around the reference
GRID_COLOUR = "#e5e7eb"
MUTED_COLOUR = "#6b7280"


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
    core = [v for v in map(finite, [*points, *extra]) if v is not None]
    wide = [v for v in map(finite, whiskers) if v is not None]
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


class _ForestFrame(NamedTuple):
    """Where the forest plot draws: the x scale, the row height and the plot's edges."""
    x: _Scale
    row_h: int
    label_w: int
    width: int
    right: int
    plot_top: int
    plot_bottom: int


def forest_plot(report: "AuditReport") -> str:
    """The per-group estimates as an inline SVG: a row per group (overall last), the
    point and its interval, the reference line and the tau band; corrected estimates
    beside the weighted ones when the result has them."""
    groups = list(report.by_group) + ([report.overall] if report.overall is not None else [])
    corrected = bool(report.correction)
    ref, ref_words, band = reference_line(report)
    lo, hi = _forest_domain(report, groups, corrected, ref, band)
    width, label_w, right = 720, 170, 24
    row_h = 40 if corrected else 30
    top, legend_h, axis_h = 6, 0, 40
    plot_top = top + legend_h
    height = plot_top + row_h * len(groups) + axis_h
    frame = _ForestFrame(_Scale(lo, hi, label_w, width - right), row_h, label_w, width, right, plot_top,
                         plot_top + row_h * len(groups))
    ticks = _nice_ticks(lo, hi, 6)
    out = _forest_head(report, groups, corrected, width, height)
    out += _forest_grid(frame, ticks, len(groups), ref, ref_words, band, report.tau)
    out += _forest_rows(report, frame, groups, corrected)
    out += _forest_axis(frame, ticks, report.metric)
    out.append("</svg>")
    return "".join(out)


def _forest_domain(report: "AuditReport", groups: list, corrected: bool, ref: float | None,
                   band: bool) -> tuple[float, float]:
    """The x range: every estimate, the intervals as far as `_domain` allows, and the
    reference with its tau band."""
    tau = report.tau
    points = [g.estimate for g in groups]
    whiskers = [x for g in groups for x in (g.ci_low, g.ci_high)]
    if corrected:
        points += [g.corrected_estimate for g in groups]
        whiskers += [x for g in groups for x in (g.corrected_ci_low, g.corrected_ci_high)]
    extra = [] if ref is None else ([ref - tau, ref + tau] if band else [ref])
    return _domain(points, whiskers, extra)


def _forest_head(report: "AuditReport", groups: list, corrected: bool, width: int, height: int) -> list[str]:
    """The opening tag, its title and its description (every row's numbers, for a screen reader)."""
    desc = "; ".join(
        f"{g.group}: {num(g.estimate)} {ci_text(g.ci_low, g.ci_high)}"
        + (f", corrected {num(g.corrected_estimate)} {ci_text(g.corrected_ci_low, g.corrected_ci_high)}"
           if corrected and g.group != "overall" else "") for g in groups)
    return [f'<svg class="chart forest" role="img" aria-labelledby="forest-title forest-desc" '
            f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg" '
            f'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif" font-size="13">',
            f'<title id="forest-title">Forest plot of {esc(report.metric)} by group</title>',
            f'<desc id="forest-desc">{esc(desc)}</desc>']


def _forest_grid(frame: _ForestFrame, ticks: list[float], rows: int, ref: float | None, ref_words: str,
                 band: bool, tau: float) -> list[str]:
    """The grid lines at the ticks, the tau band and the dashed reference line."""
    x, plot_top, plot_bottom = frame.x, frame.plot_top, frame.plot_bottom
    out = []
    for t in ticks:
        out.append(f'<line x1="{_f(x(t))}" x2="{_f(x(t))}" y1="{plot_top}" y2="{plot_bottom}" '
                   f'stroke="{GRID_COLOUR}" stroke-width="1"/>')
    if ref is not None and band:
        b0, _ = x.clip(ref - tau)
        b1, _ = x.clip(ref + tau)
        out.append(f'<rect class="tau-band" x="{_f(b0)}" y="{plot_top}" width="{_f(b1 - b0)}" '
                   f'height="{frame.row_h * rows}" fill="{BAND_COLOUR}"><title>{esc(ref_words)} \u00b1 \u03c4 '
                   f'({num(ref - tau)} to {num(ref + tau)})</title></rect>')
    if ref is not None and x.lo <= ref <= x.hi:
        out.append(f'<line class="reference" x1="{_f(x(ref))}" x2="{_f(x(ref))}" y1="{plot_top}" '
                   f'y2="{plot_bottom}" stroke="{OVERALL_COLOUR}" stroke-width="1.5" stroke-dasharray="5 4">'
                   f'<title>{esc(ref_words)}: {num(ref)}</title></line>')
    return out


def _forest_rows(report: "AuditReport", frame: _ForestFrame, groups: list, corrected: bool) -> list[str]:
    """A row per group: its label (a dagger when left out of the verdict), the weighted point and
    interval, and the corrected one below it; a withheld row says why."""
    unidentifiable = set(report.correction.get("unidentifiable", ())) if corrected else set()
    excluded = set(report.verdict.excluded_groups)
    suppressed = set(report.release.get("suppressed", ()))
    x, row_h, label_w, plot_top = frame.x, frame.row_h, frame.label_w, frame.plot_top
    out = []
    for i, g in enumerate(groups):
        cy = plot_top + row_h * i + row_h / 2
        is_overall = g.group == "overall"
        colour = OVERALL_COLOUR if is_overall else WEIGHTED_COLOUR
        mark = " \u2020" if g.group in excluded else ""
        weight = ' font-weight="600"' if is_overall else ""
        label = g.group if len(g.group) <= 22 else g.group[:21] + "\u2026"
        out.append(f'<text x="{label_w - 10}" y="{_f(cy + 4)}" text-anchor="end"{weight} fill="#111">'
                   f'{esc(label)}{mark}<title>{esc(g.group)}</title></text>')
        if i:
            out.append(f'<line x1="{label_w}" x2="{frame.width - frame.right}" y1="{plot_top + row_h * i}" '
                       f'y2="{plot_top + row_h * i}" stroke="{GRID_COLOUR}" stroke-width="0.5"/>')
        withheld = finite(g.estimate) is None
        if withheld:  # one note for the row, whatever the corrected value
            why = "withheld by the release controls" if g.group in suppressed else "not defined"
            out.append(f'<text x="{_f(x.a + 6)}" y="{_f(cy + 4)}" font-size="12" font-style="italic" '
                       f'fill="{MUTED_COLOUR}">{why}</text>')
            continue
        yw = cy - 7 if corrected and not is_overall else cy
        out.append(_whisker(x, g.estimate, g.ci_low, g.ci_high, yw, colour, "circle" if not is_overall else "square",
                            f"{g.group}: {num(g.estimate)} {ci_text(g.ci_low, g.ci_high)}"))
        if corrected and not is_overall:
            if g.group in unidentifiable:
                out.append(f'<text x="{label_w + 6}" y="{_f(cy + 11)}" font-size="11" fill="{CORRECTED_COLOUR}">'
                           f'corrected: not identifiable at this size</text>')
            else:
                out.append(_whisker(x, g.corrected_estimate, g.corrected_ci_low, g.corrected_ci_high, cy + 7,
                                    CORRECTED_COLOUR, "diamond",
                                    f"{g.group} corrected: {num(g.corrected_estimate)} "
                                    f"{ci_text(g.corrected_ci_low, g.corrected_ci_high)}"))
    return out


def _forest_axis(frame: _ForestFrame, ticks: list[float], metric: str) -> list[str]:
    """The x axis below the rows: its line, the ticks with their labels, and its title."""
    x, label_w, width, right, plot_bottom = frame.x, frame.label_w, frame.width, frame.right, frame.plot_bottom
    out = [f'<line x1="{label_w}" x2="{width - right}" y1="{plot_bottom}" y2="{plot_bottom}" '
           f'stroke="#555" stroke-width="1"/>']
    for t in ticks:
        out.append(f'<line x1="{_f(x(t))}" x2="{_f(x(t))}" y1="{plot_bottom}" y2="{plot_bottom + 5}" stroke="#555"/>'
                   f'<text x="{_f(x(t))}" y="{plot_bottom + 18}" text-anchor="middle" font-size="12" '
                   f'fill="#333">{esc(_tick_label(t, ticks))}</text>')
    out.append(f'<text x="{(label_w + width - right) / 2:.1f}" y="{plot_bottom + 35}" text-anchor="middle" '
               f'font-size="12" fill="#333">{esc(metric)} estimate</text>')
    return out


def forest_legend(report: "AuditReport") -> str:
    """The forest plot's key, as HTML above it (it wraps in a narrow window)."""
    ref, ref_words, band = reference_line(report)
    if report.verdict.rule == "inclusion":
        first = "Pr(N \u2265 T) over all pools together"
    elif report.interval == "exact":
        first = "weighted estimate (the paper\u2019s)"
    else:
        first = f"weighted estimate (the paper\u2019s) and its {report.confidence:.0%} interval"
    keys = [f'<span class="key">{_key_svg("circle", WEIGHTED_COLOUR)}{esc(first)}</span>']
    if report.correction:
        keys.append(f'<span class="key">{_key_svg("diamond", CORRECTED_COLOUR)}corrected (calibration)</span>')
    if report.overall is not None:
        keys.append(f'<span class="key">{_key_svg("square", OVERALL_COLOUR)}overall</span>')
    if ref is not None:
        keys.append(f'<span class="key">{_key_svg("ref", OVERALL_COLOUR, band)}{esc(ref_words)}'
                    + (f" \u00b1 \u03c4 ({esc(f'{report.tau:g}')})" if band else "") + "</span>")
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
    est, low, high = finite(est), finite(low), finite(high)
    if est is None:
        return (f'<text x="{_f(x.a + 6)}" y="{_f(cy + 4)}" font-size="12" font-style="italic" '
                f'fill="{MUTED_COLOUR}">withheld / not defined<title>{esc(tip)}</title></text>')
    out = [f"<g><title>{esc(tip)}</title>"]
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
    scores = [c.score for c in report.curves if finite(c.score) is not None]
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
    desc = "; ".join(f"score {num(p.score, 3)}: {num(p.estimate)} {ci_text(p.ci_low, p.ci_high)}" for p in pts)
    out = [f'<figure class="panel"><svg class="chart curve" role="img" aria-labelledby="curve-t{n} curve-d{n}" '
           f'viewBox="0 0 {w} {h}" width="{w}" height="{h}" xmlns="http://www.w3.org/2000/svg" '
           f'font-family="system-ui, -apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif" font-size="12">',
           f'<title id="curve-t{n}">{esc(metric)} curve of {esc(group)}</title><desc id="curve-d{n}">{esc(desc)}</desc>',
           f'<defs><clipPath id="{clip}"><rect x="{left}" y="{top}" width="{w - left - right}" '
           f'height="{h - top - bottom}"/></clipPath></defs>',
           f'<text x="{left}" y="17" font-size="14" font-weight="600" fill="#111">{esc(group)}</text>']
    yt = _nice_ticks(ydom[0], ydom[1], 5)
    for t in yt:
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{_f(y(t))}" y2="{_f(y(t))}" stroke="{GRID_COLOUR}"/>'
                   f'<text x="{left - 6}" y="{_f(y(t) + 4)}" text-anchor="end" fill="#333">'
                   f'{esc(_tick_label(t, yt))}</text>')
    xt = _nice_ticks(xdom[0], xdom[1], 5)
    for t in xt:
        out.append(f'<line x1="{_f(x(t))}" x2="{_f(x(t))}" y1="{h - bottom}" y2="{h - bottom + 4}" stroke="#555"/>'
                   f'<text x="{_f(x(t))}" y="{h - bottom + 16}" text-anchor="middle" fill="#333">'
                   f'{esc(_tick_label(t, xt))}</text>')
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
            v = finite(getattr(p, est))
            if v is not None:
                out.append(f'<circle cx="{_f(x(p.score))}" cy="{_f(y(v))}" r="3" fill="{colour}">'
                           f'<title>{esc(group)} at {num(p.score, 3)}: {num(v)} '
                           f'{ci_text(getattr(p, lo), getattr(p, hi))}</title></circle>')
    for run in _runs(overall, "estimate"):
        line = " ".join(f"{_f(x(p.score))},{_f(y(p.estimate))}" for p in run)
        out.append(f'<polyline points="{line}" fill="none" stroke="{OVERALL_COLOUR}" stroke-width="1.5" '
                   f'stroke-dasharray="4 3"/>')
    out.append("</g>")
    if not any(finite(p.estimate) is not None for p in pts):
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
        if all(finite(getattr(p, f)) is not None for f in fields):
            cur.append(p)
        else:
            if cur:
                runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [r for r in runs if r]
