"""The report page in HTML: one function per section (verdict, estimates by group, pair
cells, curves, pools, differences, parameters, counts, provenance, and a receipt's one
section), the tables and definition lists they are made of, the style sheet (`CSS`, with
the verdict's severity colours), and `render_html`, which puts the sections, the contents
and the footer into one self-contained page (inline CSS and SVG, no script). Cells are
HTML already escaped (`ppre.report.escape`). It may import `ppre.report.model` (what
each section says) and `ppre.report.plots` (the charts and their colours).
"""
from __future__ import annotations

import datetime as _dt
import re
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ppre.report.escape import esc
from ppre.report.model import (
    AGGREGATES_ONLY, PHASE_TOTAL, PREPARATION_WORDS, PROVENANCE, PROVENANCE_TABLE, RULE_WORDS, ci_text,
    attenuation_text, clipped_text, correction_words, count_text, finite, intervals_words, joined_rows_text,
    left_out_reason, members_heading, metric_description, metric_title, num, plain_words, rank_order, receipt_line,
    release_words, result_notes, signed_text, verdict_words,
)
from ppre.report.plots import CORRECTED_COLOUR, OVERALL_COLOUR, WEIGHTED_COLOUR, curve_charts, forest_legend, forest_plot

if TYPE_CHECKING:  # pragma: no cover
    from common.stats.results import AuditReport


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
POSITIVE_RGB = (33, 102, 172)   # matrix cells above 0
NEGATIVE_RGB = (178, 24, 43)    # matrix cells below 0


def _mix(rgb: tuple[int, int, int], share: float) -> str:
    r, g, b = (round(255 + (c - 255) * share) for c in rgb)
    return f"#{r:02x}{g:02x}{b:02x}"


#: a cell that holds a number, an interval or n/a: right-aligned, never wrapped
_NUMERIC = re.compile(r"[\[\]0-9.,+e\s\u2212\u2014-]+|n/a")


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, caption: str = "", cls: str = "",
           row_classes: Sequence[str] | None = None) -> str:
    """A table; `headers` are escaped here, cells must already be HTML (escaped)."""
    out = [f'<div class="table-wrap"><table class="{cls}">']
    if caption:
        out.append(f"<caption>{caption}</caption>")
    out.append("<thead><tr>" + "".join(f'<th scope="col">{esc(h)}</th>' for h in headers) + "</tr></thead><tbody>")
    for i, row in enumerate(rows):
        rc = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        out.append(f"<tr{rc}>" + "".join(
            (f'<th scope="row">{c}</th>' if j == 0 else
             f'<td class="n">{c}</td>' if _NUMERIC.fullmatch(c) else f"<td>{c}</td>")
            for j, c in enumerate(row)) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _list(items: Sequence[str], limit: int = 24) -> str:
    shown = ", ".join(esc(s) for s in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def verdict_section(report: "AuditReport") -> str:
    v = report.verdict
    headline, explain = verdict_words(report)
    sev_class = "sev-" + re.sub(r"[^a-z0-9-]", "", v.severity.replace(" ", "-"))
    facts = []
    if v.compared:
        c = v.compared
        facts.append(f"<li><strong>Compared:</strong> {esc(c.get('label'))} = {esc(signed_text(c.get('estimate')))}; "
                     f"{report.confidence:.0%} interval {esc(ci_text(c.get('ci_low'), c.get('ci_high')))}; "
                     f"simultaneous band {esc(ci_text(c.get('band_low'), c.get('band_high')))}</li>")
    if v.significant_comparisons:
        facts.append(f"<li><strong>Significant ({len(v.significant_comparisons)}):</strong> "
                     f"{_list(list(v.significant_comparisons))}</li>")
    if v.non_overlapping:
        facts.append("<li><strong>Groups whose intervals do not overlap</strong> (shown, not used for the "
                     f"verdict): {_list([f'{a} / {b}' for a, b in v.non_overlapping])}</li>")
    clipped = clipped_text(report)
    if clipped:  # the estimates are of the clipped values: said beside the verdict, as the table says it
        facts.append(f'<li class="warn"><strong>Clipped values:</strong> {esc(clipped)}</li>')
    facts += [f'<li class="warn"><strong>Note:</strong> {esc(note)}</li>' for note in result_notes(report.info)]
    if v.excluded_groups:
        facts.append(f"<li><strong>Left out of the verdict</strong> ({esc(left_out_reason(report))}; marked \u2020): "
                     f"{_list(list(v.excluded_groups))}</li>")
    if v.mdd is not None:
        facts.append(f"<li><strong>Minimum detectable difference</strong> (80% power, these settings): "
                     f"{esc(num(v.mdd))}</li>")
    if v.uninformative:
        facts.append(f"<li><strong>Not informative</strong> (interval half-width above \u03c4/2): "
                     f"{_list(list(v.uninformative))}</li>")
    if v.attenuation:
        facts.append(f"<li><strong>Attenuation:</strong> {esc(attenuation_text(v.attenuation))}</li>")
    tau = "" if v.rule == "inclusion" else f"; \u03c4 = {v.tau:g}"
    facts.append(f"<li><strong>Rule:</strong> {esc(v.rule)}: {esc(RULE_WORDS.get(v.rule, ''))}{esc(tau)}</li>")
    return (f'<section class="verdict {esc(sev_class)}" id="verdict" aria-labelledby="verdict-h">'
            f'<p class="sev-badge">Severity: {esc(v.severity)}</p>'
            f'<h2 id="verdict-h">{esc(headline)}</h2>'
            f'<p class="explain">{esc(explain)}</p>'
            f'<ul class="facts">{"".join(facts)}</ul>'
            f'<p class="message"><span class="label">Verdict in full:</span> {esc(v.message)}</p></section>')


def groups_section(report: "AuditReport") -> str:
    if not report.groups:
        return ""
    corrected = bool(report.correction)
    unidentifiable = set(report.correction.get("unidentifiable", ())) if corrected else set()
    excluded = set(report.verdict.excluded_groups)
    suppressed = set(report.release.get("suppressed", ()))
    sizes = {k: (max(0.0, finite(v)) if finite(v) is not None else v)
             for k, v in (report.release.get("effective_sizes") or {}).items()}
    intervals = any(finite(g.ci_low) is not None for g in report.groups)
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
            notes.append(f"\u2020 left out of the verdict ({left_out_reason(report)})")
        if g.group in suppressed:
            notes.append("withheld by the release controls")
        elif finite(g.estimate) is None:
            notes.append("not defined")
        row = [esc(g.group) + (" \u2020" if g.group in excluded else ""), esc(num(g.estimate))]
        if intervals:
            row.append(esc(ci_text(g.ci_low, g.ci_high)))
        if corrected:
            if g.group == "overall":
                row += ["\u2014", "\u2014"]
            elif g.group in unidentifiable:
                row += ['<span class="muted">not identifiable at this size</span>', "\u2014"]
            else:
                row += [esc(num(g.corrected_estimate)), esc(ci_text(g.corrected_ci_low, g.corrected_ci_high))]
        if sizes:
            row.append(esc(count_text(sizes.get(g.group))) if g.group in sizes else "\u2014")
        row.append(esc("; ".join(notes)))
        rows.append(row)
        classes.append("overall" if g.group == "overall" else "")
    figure_caption = ("Each row: the group's estimate (point) and its interval (whisker); an arrow means the "
                      "interval goes on beyond the axis (the table gives it in full).")
    if report.verdict.rule == "inclusion":
        figure_caption = ("Each row: the group's Pr(N \u2265 T) over all pools together; the dashed line is the "
                          "inclusion level.")
    return (f'<section id="groups" aria-labelledby="groups-h"><h2 id="groups-h">Estimates by group</h2>'
            f'{forest_legend(report)}<figure class="figure">{forest_plot(report)}<figcaption>{esc(figure_caption)}</figcaption></figure>'
            + _table(headers, rows, caption=esc(f"{report.metric} by group: {intervals_words(report)}"),
                     row_classes=classes) + "</section>")


def _cell_style(value: float | None, tau: float, vmax: float) -> str:
    if value is None:
        return ""
    scale = max(2 * tau, vmax * 0.5 if vmax else 0, 1e-12)
    share = 0.12 + 0.5 * min(1.0, abs(value) / scale) if value != 0 else 0.0
    return f' style="background:{_mix(POSITIVE_RGB if value > 0 else NEGATIVE_RGB, share)}"'


def cells_section(report: "AuditReport") -> str:
    """Pair metrics (LOT, POT's DTI) as coloured matrices, one per rank pair: row group
    against column group, each cell its estimate and interval."""
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
    defined = [abs(c.estimate) for c in report.cells if finite(c.estimate) is not None]
    vmax = max(defined) if defined else 0.0
    lot = report.metric == "lot"
    out = [_cells_intro(report, lot)]
    for rank in sorted(by_rank, key=rank_order):
        out.append(_matrix(report, rank, by_rank[rank], groups, lot, vmax))
    out.append("</div></section>")
    return "".join(out)


def _cells_intro(report: "AuditReport", lot: bool) -> str:
    """The section's heading and how to read a matrix (what a cell is, its colours and marks)."""
    what = ("LOT cell: mean signed relevance gap, row group's member ranked above the column group's; "
            "below 0 (red) the lower-ranked member was more relevant" if lot else
            "DTI of the row group minus the column group: weighted mean gap of their curves (red below 0, "
            "blue above 0)")
    return (f'<section id="pairs" aria-labelledby="pairs-h"><h2 id="pairs-h">Pair cells</h2>'
            f'<p>{esc(what)}; the deeper the colour, the larger the value (full at 2\u03c4 or half the largest '
            f'value). Each cell prints the estimate and, small, its {report.confidence:.0%} interval (also in the '
            f'cell\u2019s tooltip). A heavy outline and * mark a significant cell, a yellow frame the compared '
            f'one; \u201cwithheld\u201d cells were suppressed or are not defined.</p><div class="matrices">')


def _matrix(report: "AuditReport", rank: str | None, cells: dict[tuple[str, str], Any], groups: list[str],
            lot: bool, vmax: float) -> str:
    """One rank pair's matrix (all pairs pooled, or POT's DTI, when `rank` is None)."""
    corner = ('<span class="sr">row group ranked above column group</span>'
              '<span aria-hidden="true">above \u2193 / below \u2192</span>' if lot else
              '<span class="sr">row group minus column group</span><span aria-hidden="true">row \u2212 column</span>')
    title = ("all rank pairs (pooled)" if lot else "DTI") if rank is None else f"rank pair {rank}"
    rows_here = [g for g in groups if any(k[0] == g for k in cells)]
    cols_here = [g for g in groups if any(k[1] == g for k in cells)]
    out = [f'<div class="table-wrap matrix-wrap"><table class="matrix"><caption>{esc(title)}</caption>'
           f'<thead><tr><th scope="col">{corner}</th>'
           + "".join(f'<th scope="col">{esc(g)}</th>' for g in cols_here) + "</tr></thead><tbody>"]
    for a in rows_here:
        out.append(f'<tr><th scope="row">{esc(a)}</th>')
        for b in cols_here:
            c = cells.get((a, b))
            if c is None:
                out.append('<td class="none" title="not compared">\u2014</td>')
                continue
            out.append(_matrix_cell(report, f"{a}>{b}" + (f"@{rank}" if rank else ""), c, vmax))
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _matrix_cell(report: "AuditReport", label: str, c: Any, vmax: float) -> str:
    """One cell: its estimate and interval, coloured by value, marked when significant or
    compared; \u201cwithheld\u201d when it has no estimate."""
    significant = set(report.verdict.significant_comparisons)
    compared = (report.verdict.compared or {}).get("label")
    est = finite(c.estimate)
    classes = ["sig"] if label in significant else []
    if label == compared:
        classes.append("compared")
    tip = f"{label}: {num(est)}, {report.confidence:.0%} interval {ci_text(c.ci_low, c.ci_high)}"
    if label in significant:
        tip += " (significant)"
    if est is None:
        return f'<td class="withheld" title="{esc(tip)}">withheld</td>'
    return (f'<td class="{" ".join(classes)}"{_cell_style(est, report.tau, vmax)} title="{esc(tip)}">'
            f'<span class="v">{esc(signed_text(est))}{" *" if label in significant else ""}</span>'
            f'<span class="ci">{esc(ci_text(c.ci_low, c.ci_high))}</span></td>')


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
    rows = [[esc(c.group), esc(num(c.score, 4)), esc(num(c.estimate)), esc(ci_text(c.ci_low, c.ci_high))]
            + ([esc(num(c.corrected_estimate)), esc(ci_text(c.corrected_ci_low, c.corrected_ci_high))]
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
    t = plain_words(report.params.get("count_threshold"))
    level = plain_words(report.params.get("inclusion_level"))
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
           f'<p>Each cell: Pr(N \u2265 {esc(t)}), the probability that the pool holds at least {esc(t)} '
           f'member(s) of the group, and whether it reaches the inclusion level {esc(level)} '
           f'(\u2713 included, \u2717 not included), and the expected count E[N].</p>'
           '<div class="table-wrap"><table class="pools"><caption>Pr(N \u2265 T) by pool and group</caption>'
           '<thead><tr><th scope="col">pool</th><th scope="col">'
           + esc(members_heading(report.info)) + '</th>'
           + "".join(f'<th scope="col">{esc(g)}</th>' for g in groups) + "</tr></thead><tbody>"]
    for pool in pools:
        out.append(f'<tr><th scope="row">{esc(pool)}</th><td>{esc(count_text(members[pool]))}</td>')
        for g in groups:
            p = cells.get((pool, g))
            if p is None:
                out.append("<td>\u2014</td>")
            elif finite(p.prob_at_least) is None:
                out.append(f'<td class="withheld" title="{esc(f"{pool}/{g}: withheld")}">withheld</td>')
            else:
                tip = (f"{pool}/{g}: Pr(N \u2265 {t}) {num(p.prob_at_least)}, expected count "
                       f"{num(p.expected_count, 3)}, {'included' if p.included else 'NOT included'}")
                mark = "\u2713 included" if p.included else "\u2717 not included"
                expected = finite(p.expected_count)
                out.append(f'<td class="{"inc" if p.included else "exc"}" title="{esc(tip)}">'
                           f'<span class="v">{esc(num(p.prob_at_least))}</span><span class="ci">{esc(mark)}</span>'
                           f'<span class="ci">E[N] {esc("n/a" if expected is None else f"{expected:.4g}")}</span></td>')
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
        lo, hi = finite(d.ci_low), finite(d.ci_high)
        excludes = "n/a" if lo is None or hi is None else ("yes" if lo > 0 or hi < 0 else "no")
        in_verdict = (plain in significant or flipped in significant
                      or f"overall - {d.a}" in significant and d.b == "overall")
        rows.append([esc(label), esc("between groups" if d.kind == "between" else "to overall"),
                     esc(signed_text(d.estimate)), esc(ci_text(d.ci_low, d.ci_high)), esc(excludes),
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
    return '<dl class="kv">' + "".join(f"<dt>{esc(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


_MAPPING_KEYS = ("group_mapping", "mapping", "groups_mapping")


def parameters_section(report: "AuditReport", *, requested_correction: str = "") -> str:
    """The audit's parameters. A receipt holds no correction (the Test-Client applied
    it, design §3.7): its line names the one the request asked for where that is known."""
    items = [("metric", esc(metric_title(report))),
             ("metric option", esc(report.metric_option or "default")),
             ("intervals", esc(intervals_words(report))),
             ("confidence", esc(f"{report.confidence:.0%}")),
             ("\u03c4 (disparity threshold)", esc(f"{report.tau:g}")),
             ("verdict rule", esc(f"{report.verdict.rule}: {RULE_WORDS.get(report.verdict.rule, '')}")),
             ("result recipient", esc("the Test-Client" if report.result_recipient == "client" else
                                     "the Tester only" if report.result_recipient == "tester" else
                                     report.result_recipient))]
    prep = report.preparation
    if "epsilon" in prep:
        items.append(("Self-ID randomized response \u03b5", esc(f"{prep['epsilon']:g}")))
    if "threshold" in prep:
        items.append(("clipping threshold T", esc(f"{prep['threshold']:.4g}")))
    if report.group_mapping:
        items.append(("group mapping", esc(report.group_mapping)))
    for source in () if report.group_mapping else (report.params, report.info):
        for key in _MAPPING_KEYS:
            if key in source:
                items.append(("group mapping", esc(plain_words(source[key]))))
                break
        else:
            continue
        break
    params = [(k, v) for k, v in report.params.items() if k not in _MAPPING_KEYS]
    if params:
        items.append(("metric parameters", "; ".join(f"{esc(k)} = {esc(plain_words(v))}" for k, v in params)))
    facts = [(k, v) for k, v in report.info.items() if k not in _MAPPING_KEYS and k != "transport"]
    if facts:
        items.append(("dataset facts", "; ".join(f"{esc(k)} = {esc(plain_words(v))}" for k, v in facts)))
    if "transport" in report.info:
        items.append(("link", f'<span class="warn">{esc(report.info["transport"])}</span>'))
    items.append(("release controls", esc(release_words(report.release))))
    rel = report.release
    if rel.get("controls", True) and rel:
        if rel.get("rho"):
            items.append(("noise", esc(f"Gaussian, \u03c1 = {rel['rho']:g} this audit (\u03b5 = "
                                      f"{finite(rel.get('epsilon')) or 0:.3g} at \u03b4 = {rel.get('delta', 0):g}); "
                                      f"estimate noise sd {finite(rel.get('sigma_estimate')) or 0:.3g} member(s)")))
        if "budget_left" in rel:
            items.append(("privacy budget left", esc(f"\u03c1 = {rel['budget_left']:g}")))
        items.append(("minimum sizes", esc(f"intersection {rel.get('min_intersection', 'n/a')}, effective size "
                                          f"{rel.get('min_effective_size', 'n/a')}")))
        if rel.get("suppressed"):
            items.append((f"suppressed cells ({len(rel['suppressed'])})", _list(list(rel["suppressed"]), 40)))
    if report.is_receipt:
        asked = requested_correction if requested_correction not in ("", "none") else ""
        items.append(("correction", esc(f"{asked} requested: applied by the Test-Client, which holds the result"
                                        if asked else "applied by the Test-Client where the request asked for one "
                                                      "(its copy of the result says)")))
    else:
        items.append(("correction", esc(correction_words(report.correction))))
    return (f'<section id="parameters" aria-labelledby="parameters-h"><h2 id="parameters-h">Parameters</h2>'
            f"{_dl(items)}</section>")


def counts_section(report: "AuditReport") -> str:
    items: list[tuple[str, str]] = []
    joined = "adjacent pairs joined" if report.metric == "lot" else "joined rows (intersection)"
    items.append((joined, esc(joined_rows_text(report))))
    prep = dict(report.preparation)
    if prep:
        read = prep.get("members_read")
        dropped = sum(v for k, v in prep.items() if k.startswith("dropped_"))
        if read is not None:
            items.append(("members read", esc(count_text(read))))
            items.append(("members prepared", esc(count_text(read - dropped))))
        for key, value in prep.items():
            if key in ("members_read", "threshold", "epsilon"):
                continue
            items.append((PREPARATION_WORDS.get(key, key.replace("_", " ")), esc(count_text(value))))
    out = [f'<section id="counts" aria-labelledby="counts-h"><h2 id="counts-h">Counts</h2>', _dl(items)]
    if not prep:
        out.append(f"<p>{esc(PROVENANCE_TABLE)}</p>")
    sizes = report.release.get("effective_sizes") or {}
    if sizes:
        floor = finite(report.release.get("min_effective_size"))
        rows = []
        for g, s in sizes.items():
            notes = []
            if finite(s) is not None and finite(s) < 30:
                notes.append("below 30: left out of verdicts")
            if floor and finite(s) is not None and finite(s) < floor:
                notes.append("below the release minimum: withheld")
            rows.append([esc(g), esc(count_text(s)), esc("; ".join(notes))])
        out.append(_table(["group", "effective size \u03a3 p", "note"], rows,
                          caption="Effective size per group among the joined rows"))
    phases = report.phase_seconds
    if phases:
        total = phases.get(PHASE_TOTAL)
        rows = [[esc(k.replace("_", " ")), esc(f"{v:.2f}")] for k, v in phases.items()]
        out.append(f'<details><summary>Run time{f" ({total:.1f} s)" if total is not None else ""}</summary>'
                   + _table(["phase", "seconds"], rows) + "</details>")
    out.append("</section>")
    return "".join(out)


def provenance_section(report: "AuditReport") -> str:
    return (f'<section id="provenance" aria-labelledby="provenance-h"><h2 id="provenance-h">Data provenance</h2>'
            f"<p>{esc(PROVENANCE)}</p>"
            + ("" if report.preparation else f"<p>{esc(PROVENANCE_TABLE)}</p>")
            + f"<p>{esc(AGGREGATES_ONLY)}</p></section>")


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


def _joined_rows_span(report: "AuditReport") -> str:
    """The page head's joined rows: "5,000 joined rows", or whose count it is."""
    words = joined_rows_text(report)
    return f"{words} joined rows" if words[:1].isdigit() or words == "n/a" else f"joined rows {words}"


def render_html(report: "AuditReport", *, run_id: str | None = None,
                generated: _dt.datetime | None = None, correction: str = "") -> str:
    """The whole page as one string (escaped, self-contained, no script). `correction`:
    the correction the request asked for, named on a receipt's page (`write_report`)."""
    generated = generated or _dt.datetime.now(_dt.timezone.utc)
    when = generated.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    day = generated.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d")
    title = metric_title(report)
    desc = metric_description(report.metric)
    if report.is_receipt:  # result recipient client: the result is the Test-Client's (design §3.7)
        sections = [receipt_section(report), parameters_section(report, requested_correction=correction),
                    counts_section(report)]
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
    return ('<section class="verdict" id="receipt" aria-labelledby="receipt-h">'
            '<h2 id="receipt-h">Result delivered to the Test-Client</h2>'
            f'<p class="explain">{esc(receipt_line(report))}</p></section>')


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
    meta = [f"<span>{esc(when)}</span>",
            f"<span>{esc(_joined_rows_span(report))}</span>",
            f"<span>{esc(intervals_words(report))}</span>"]
    if run_id:
        meta.append(f"<span>run id <code>{esc(run_id)}</code></span>")
    try:
        from importlib.metadata import version
        generator = f"ppre {version('ppre')}"
    except Exception:  # noqa: BLE001 - not installed as a package
        generator = "ppre"
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="{esc(generator)}">'
        f"<title>Fairness audit: {esc(title)} \u2014 {esc(day)}</title>"
        f"<style>{CSS}</style></head><body><main>"
        f'<header><h1>Fairness audit: {esc(title)}</h1>'
        + (f'<p class="subtitle">{esc(desc)}</p>' if desc else "")
        + f'<p class="meta">{" ".join(meta)}</p></header>'
        + sections[0]
        + '<nav class="toc" aria-label="Contents">'
        + " ".join(f'<a href="#{sid}">{esc(words)}</a>' for sid, words in toc[1:]) + "</nav>"
        + "".join(sections[1:])
        + f"<footer>Generated by {esc(generator)} on {esc(when)}. {esc(AGGREGATES_ONLY)}</footer>"
        "</main></body></html>\n")
