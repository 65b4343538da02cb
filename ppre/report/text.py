"""The result as plain text: the tables `ppre audit`, `ppre demo` and `ppre runs show`
print (`render_text`). Every column is as wide as its longest value, so columns never run
together; the verdict, the correction, the release controls, the group mapping and the
preparation counts follow, one line each; where the Test-Client clipped rows into a
declared range, a warning beside the verdict says how many and which range to declare.
It reads the result (`common.stats.results`) and says what the page says
(`ppre.report.model`), without markup.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

from common.stats.intervals import INFORMATIVE_SHARE
from common.stats.results import preparation_in_order, release_clean
from common.stats.wording import correction_summary, release_summary, result_notes, score_bins_words
from ppre.report.model import clipped_text, joined_rows_text, members_heading, receipt_line

if TYPE_CHECKING:  # pragma: no cover
    from common.stats.results import AuditReport


def render_text(report: "AuditReport") -> str:
    """The result as plain-text tables: every column as wide as its longest value
    (columns never run together); `inf.` marks an informative estimate (interval
    half-width at most INFORMATIVE_SHARE·τ) with "yes", else "no". A receipt is one
    line: where the result went."""
    if report.is_receipt:
        return receipt_line(report)
    pct = f"{report.confidence:.0%}"
    how = (f"{pct} CIs from the released second moments ({report.bootstrap} parametric draws)"
           if report.intervals_from_moments else
           f"bootstrap B={report.bootstrap}, {pct} percentile CIs" if report.interval == "percentile" else
           f"{report.bootstrap} random groups, {pct} t intervals" if report.interval == "random_groups" else
           "exact (no resampling)")
    option = f" ({report.metric_option}{score_bins_words(report.info, '; ')})" if report.metric_option else ""
    lines = [f"metric: {report.metric}{option}   joined rows: {joined_rows_text(report)}   {how}"]
    unidentifiable = set(report.correction.get("unidentifiable", ())) if report.correction else set()

    def corrected(part) -> list[str]:
        if part.group == "overall":
            return ["", "", "", ""]
        if part.group in unidentifiable:
            return ["not identifiable at this size", "", "", ""]
        return [_num(part.corrected_estimate), _num(part.corrected_ci_low), _num(part.corrected_ci_high),
                _yes(part.corrected_informative)]
    if report.groups:
        head = ["group", "estimate", "ci_low", "ci_high", "inf."]
        rows = [[g.group, _num(g.estimate), _num(g.ci_low), _num(g.ci_high), _yes(g.informative)]
                + (corrected(g) if report.correction else []) for g in report.groups]
        if report.correction:
            head += ["corrected", "ci_low", "ci_high", "inf."]
            lines.append("weighted (paper) estimates, then corrected (calibration) ones")
        lines += _columns(head, rows)
    if report.cells:
        lines += _columns(["higher", "lower", "ranks", "estimate", "ci_low", "ci_high", "inf."],
                          [[c.higher, c.lower, c.rank_pair or "all", _num(c.estimate), _num(c.ci_low),
                            _num(c.ci_high), _yes(c.informative)] for c in report.cells])
    if report.curves:
        lines += _columns(["group", "score", "estimate", "ci_low", "ci_high", "inf."],
                          [[c.group, f"{c.score:.4g}", _num(c.estimate), _num(c.ci_low), _num(c.ci_high),
                            _yes(c.informative)] for c in report.curves])
    if report.pools:
        lines += _columns(["pool", "group", members_heading(report.info), "expected", "P(N>=T)", "included"],
                          [[p.pool, p.group, str(p.members), f"{p.expected_count:.3f}",
                            _num(p.prob_at_least), "yes" if p.included else "NO"]
                           if p.expected_count is not None else
                           [p.pool, p.group, str(p.members), "suppressed", "", "unknown"] for p in report.pools])
    if report.curves and report.correction:
        lines += _columns(["group", "score", "corrected", "ci_low", "ci_high", "inf."],
                          [[c.group, f"{c.score:.4g}", *corrected(c)] for c in report.curves
                           if c.group != "overall"])
    if any(True for _ in (report.groups or report.cells or report.curves)) and report.verdict.rule != "inclusion":
        lines.append(f"inf.: informative, the interval's half-width at most {INFORMATIVE_SHARE:g} tau "
                     f"= {INFORMATIVE_SHARE * report.tau:g}")
    v = report.verdict
    clipped = clipped_text(report)
    if clipped:  # the estimates are of the clipped values: say so beside the verdict
        lines.append(f"warning: {clipped}")
    over_cap = int(report.info.get("rows_over_cap") or 0)
    if over_cap:  # the Test-Client left out rows beyond the declared rows per member (common.metrics.lot)
        lines.append(f"note: {over_cap:,} rows were left out before encryption: they would have put a member in "
                     f"more than rows_per_member = {report.params.get('rows_per_member')} rows (the release noise "
                     f"grows in proportion to it: raise it if many rows are left out)")
    lines += [f"note: {note}" for note in result_notes(report.info)]
    lines.append(f"verdict: {v.message}")
    if v.severity == "inconclusive" and v.members_factor is not None and report.n_matched:
        lines.append(f"conclusive from about {math.ceil(v.members_factor * report.n_matched):,} joined members "
                     f"at these settings (the detectable gap shrinks as 1/sqrt(members))")
    if report.correction:
        lines.append("correction: " + correction_summary(report.correction))
    if report.release:
        lines.append("release controls: " + release_summary(release_clean(report.release)))
    if report.group_mapping:
        lines.append("groups: " + report.group_mapping.replace(",", ", "))
    if report.preparation:
        lines.append("preparation: " + ", ".join(
            f"{name.replace('_', ' ')} {value:.4g}" if name in ("threshold", "epsilon") else
            f"{name.replace('_', ' ')} {int(value)}" for name, value in preparation_in_order(report.preparation)))
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return f"{x:.4f}" if x is not None and abs(x) < 1e6 else (f"{x:.4g}" if x is not None else "n/a")


def _yes(flag: bool | None) -> str:
    return "" if flag is None else ("yes" if flag else "no")


def _columns(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows of text cells as aligned lines: each column as wide as its longest cell, two
    spaces between columns; the first columns (names) left-aligned, numbers right-aligned."""
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    numeric = [i > 0 and all(_is_number(r[i]) for r in rows) for i in range(len(head))]
    out = []
    for r in [head, *rows]:
        out.append("  ".join(str(c).rjust(w) if num else str(c).ljust(w)
                             for c, w, num in zip(r, widths, numeric)).rstrip())
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text in ("n/a", "")
    return True
