"""The result in English: the verdict's sentences (design §5.10) and the one-line
summaries of the correction and the release controls every report shows.

`common.stats.verdict` decides; this module says what it decided, in words that match
its numbers (an interval "includes 0" only when its numbers do, an undefined interval is
said to be undefined, never "nan"). The renderers (`ppre.report`) read the summaries and
`left_out_words` from here, so that the table, the page and the verdict's message agree.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from common.stats.declared_range import RANGE_PARAMETERS, range_flag, range_text
from common.stats.intervals import INFORMATIVE_SHARE, POWER, finite_or_none
from common.stats.left_out import MIN_EFFECTIVE_SIZE, MIN_KISH_SIZE, RATE_METRICS

#: what each verdict rule compares, as the message names the compared difference
RULE_PHRASES = {"range": "largest gap between two groups",
                "below_overall": "largest shortfall of a group below overall",
                "negative_cells": "most negative pair cell", "nonzero_pairs": "largest DTI"}
#: the message of a verdict with nothing to compare
NOTHING_TO_COMPARE = "insufficient data (nothing to compare)"
#: the message of a verdict with fewer than two defined estimates and none left out
TOO_FEW_ESTIMATES = "insufficient data (fewer than two defined estimates to compare)"


# ----------------------------------------------------------------------------------
# Summaries
# ----------------------------------------------------------------------------------
def score_bins_words(info: dict[str, Any], sep: str) -> str:
    """MQOS-AUC exact under the release controls (`info["score_bins"]`): the estimate is the
    AUC of the score in that many bins of equal counts (design §5.6), said with the
    metric's option; "" otherwise."""
    bins = info.get("score_bins")  # mqos_auc.SCORE_BINS_INFO (stats imports no metric)
    return f"{sep}AUC of the score in {int(bins)} bins" if isinstance(bins, int) and bins > 0 else ""


#: the notes a metric states in its result's `info`, shown beside the verdict on every
#: page (MQOS-AUC sampled under release noise: `common.metrics.mqos_auc.SAMPLED_NOISE_INFO`,
#: how far its estimates may lie from the exact option's and when a group has no interval)
RESULT_NOTES = ("release_noise_note",)


def result_notes(info: dict[str, Any]) -> list[str]:
    """The metric's own notes on its result (`RESULT_NOTES`), in order."""
    return [str(info[key]) for key in RESULT_NOTES if isinstance(info.get(key), str) and info[key]]


def correction_summary(correction: dict[str, Any]) -> str:
    """One line on the attenuation correction (`common.stats.correction`)."""
    cond = correction.get("condition_number")
    parts = ["calibration (M^-1 Num; assumes calibrated probabilities and no proxy effect given race)",
             f"condition number of M {cond:.3g}" if cond is not None else "M singular"]
    if correction.get("unidentifiable"):
        parts.append(f"not identifiable at this size: {', '.join(correction['unidentifiable'])}")
    if correction.get("dropped"):
        parts.append(f"left out (suppressed): {', '.join(correction['dropped'])}")
    parts.append("the verdict compares the weighted estimates")
    return "; ".join(parts)


def release_summary(release: dict[str, Any]) -> str:
    """One line on the release controls an audit ran under (noise, budget, suppression)."""
    if not release.get("controls", True):
        return "OFF (no noise, no thresholds, no budget: results are exact and unprotected)"
    parts = []
    if release.get("rho"):
        parts.append(f"Gaussian noise, rho {release['rho']:g} this audit (epsilon {release['epsilon']:.3g} at "
                     f"delta {release['delta']:g}); estimate noise sd {release['sigma_estimate']:.3g} member(s)")
    else:
        parts.append("no noise")
    if "budget_left" in release:
        parts.append(f"privacy budget left {release['budget_left']:g}")
    parts.append(f"minimum intersection {release.get('min_intersection')}, "
                 f"minimum effective size {release.get('min_effective_size')}")
    if release.get("suppressed"):
        parts.append(f"suppressed: {', '.join(release['suppressed'])}")
    return "; ".join(parts)


def left_out_words(noisy: bool | None, metric: str) -> str:
    """Why groups were left out of a verdict, in words (`common.stats.left_out`)."""
    if noisy:
        return f"noised effective size below {MIN_EFFECTIVE_SIZE:g} or below the release controls' minimum"
    if metric in RATE_METRICS:
        return f"effective sample size below {MIN_KISH_SIZE:g}"
    return f"effective size below {MIN_EFFECTIVE_SIZE:g}"


# ----------------------------------------------------------------------------------
# The verdict's parts
# ----------------------------------------------------------------------------------
def interval_words(low: Any, high: Any) -> str:
    low, high = finite_or_none(low), finite_or_none(high)
    if low is None or high is None:
        return "undefined (too few defined replicates)"
    return f"[{low:+.4f}, {high:+.4f}]"


def band_relation(low: Any, high: Any) -> str:
    """What a band says about 0, in words that match its numbers."""
    low, high = finite_or_none(low), finite_or_none(high)
    if low is None or high is None:
        return "says nothing"
    if low > 0:
        return "lies above 0"
    if high < 0:
        return "lies below 0"
    return "includes 0"


def rule_phrase(rule: str, estimate: float) -> str:
    """How the message names the compared difference under `rule`."""
    if rule == "below_overall" and estimate < 0:  # no group lies below overall: no shortfall to name
        return "group closest to overall (none lies below it)"
    return RULE_PHRASES[rule]


#: why no power is stated for compared differences that do not vary (`common.stats.intervals.degenerate`)
FLAT_WORDS = ("the compared values do not vary across the replicates (every value equal, as when all were "
              "clipped to one end of the declared range), so no detectable gap can be stated")
#: what would make an audit whose compared values do not vary conclusive
FLAT_NEEDED = "conclusive only on values that vary (check that they were not all clipped to one value)"


def detectable_words(mdd: float | None, beyond_range: bool, span: tuple[float, float] | None,
                     flat: Sequence[str] = (), compared: int = 0) -> str:
    """The minimum detectable difference in words (`common.stats.intervals`); `flat`: the
    compared differences that do not vary, of which no power is stated (of `compared`)."""
    if flat and (mdd is None or len(flat) >= compared):
        return FLAT_WORDS
    if flat:
        return (f"the smallest gap this audit detects with {POWER:.0%} power is {mdd:.4f} among the comparisons "
                f"that vary; {', '.join(flat)} do not vary across the replicates, so no power is stated for them")
    if beyond_range:
        return (f"no gap the metric can take (at most {span[1]:g}) is detectable with {POWER:.0%} power at "
                f"this size")
    if mdd is not None:
        return f"the smallest gap this audit detects with {POWER:.0%} power is {mdd:.4f}"
    return "the smallest gap this audit could detect is undefined (no defined band)"


def excluded_words(excluded: Sequence[str], noisy: bool | None, metric: str) -> str:
    """The groups left out of the verdict for their size, as a clause ("" for none)."""
    return (f"; left out of the verdict ({left_out_words(noisy, metric)}): {', '.join(excluded)}"
            if excluded else "")


def needed_words(factor: float | None, noisy: bool | None = None, widest: str | None = None) -> str:
    """What would make an inconclusive audit conclusive; the privacy budget only where
    release noise is on (`noisy` None: not known, both said); `widest`: the comparison
    or group that needs the factor `factor` (the others need fewer)."""
    known = factor is not None and math.isfinite(factor)
    more = (f"more members (about {factor:,.1f}x as many" + (f"; {widest} needs the most" if widest else "") + ")"
            if known else "more members")
    if noisy is None:
        return (f"conclusive with {more}, fewer groups (--group-mapping) or, under the release controls, "
                f"a larger privacy budget (rho)")
    if noisy:
        return f"conclusive with {more}, fewer groups (--group-mapping) or a larger privacy budget (rho)"
    return f"conclusive with {more} or fewer groups (--group-mapping)"


def uncertain_size_words(nearer: float, milder: str) -> str:
    """A significant gap whose band reaches into a milder severity than its estimate's: the
    severity is read off the estimate, and the band says the gap may be as small as its
    nearer end (`common.stats.verdict`)."""
    return (f"; the severity is the estimate's: the band allows a gap as small as {nearer:.4f} "
            f"({milder}), so how large the gap is stays uncertain")


def clipped_words(facts: dict[str, Any]) -> str:
    """How many rows were clipped into the declared range, of how many, and which range
    (`common.stats.declared_range.clipped_facts`)."""
    parameter = facts.get("parameter")
    what = RANGE_PARAMETERS.get(parameter, "values") if parameter else "normalised relevance gaps"
    rows, share = facts.get("rows"), finite_or_none(facts.get("share"))
    count = (f"{int(facts['rows_clipped']):,} of the Test-Client's {int(rows):,} {what} ({share:.0%})"
             if rows and share is not None else f"{int(facts['rows_clipped']):,} rows")
    declared = (f"the declared range ({parameter} {range_text(facts['declared'])})"
                if parameter and facts.get("declared") else "the declared range (the default)" if parameter
                else "the bound [-1, 1] of a normalised gap")
    beyond = {"below": ", below its lower end", "above": ", above its upper end",
              "both ends": ", beyond both ends"}.get(facts.get("beyond") or "", "")
    unstated = "" if rows else f" (how many {what} the Test-Client has is not stated)"
    return f"{count} lay outside {declared}{beyond} and were clipped into it before encryption{unstated}"


def range_advice(facts: dict[str, Any]) -> str:
    """What to declare so that no value is clipped: the parameter's flag and the range."""
    parameter = facts.get("parameter")
    if not parameter:
        return ("use whole-number relevance grades, or option raw with --relevance-range LO:HI covering every "
                "relevance")
    what = RANGE_PARAMETERS.get(parameter, "values")
    declared = facts.get("declared") or (0.0, 1.0)
    lo, hi = float(declared[0]), float(declared[1])
    which = {"below": f"LO at most the smallest of the {what}, below {lo:g}",
             "above": f"HI at least the largest of the {what}, above {hi:g}"}.get(
        facts.get("beyond") or "", f"LO the smallest and HI the largest value the {what} can take")
    return f"declare their range with {range_flag(parameter)} LO:HI ({which}; now {range_text(declared)})"


def _large(facts: dict[str, Any]) -> str:
    return f"at least {float(facts.get('threshold', 0.5)):.0%} of the rows"


def clipped_warning(facts: dict[str, Any]) -> str:
    """The warning beside the verdict, on every page, where rows were clipped."""
    if facts.get("large"):
        return (f"{clipped_words(facts)}, {_large(facts)}: the result describes the clipped values, not the data; "
                f"{range_advice(facts)}")
    return (f"{clipped_words(facts)}; the results describe the clipped values: {range_advice(facts)}, or refuse "
            f"such rows with --out-of-range refuse")


def clipped_clause(facts: dict[str, Any]) -> str:
    """The clause a verdict's message ends with where a large share was clipped and the
    verdict keeps its severity (a significant gap: the clipped values', its size not the data's)."""
    return (f"; the result describes clipped values: {clipped_words(facts)}, {_large(facts)}, so the gaps are "
            f"the clipped values' and their size not the data's; {range_advice(facts)}")


def clipped_message(phrase: str, label: str, estimate: Any, confidence: float, band: tuple[Any, Any],
                    facts: dict[str, Any]) -> str:
    """The message of a verdict with nothing significant on values mostly clipped
    (`common.stats.verdict.with_clipping`): inconclusive, whatever it would have been."""
    estimate = finite_or_none(estimate)
    on_clipped = (f"; on the clipped values the {phrase}, {label} = {estimate:+.4f}, has a {confidence:.0%} "
                  f"simultaneous interval {interval_words(*band)} that {band_relation(*band)}"
                  if estimate is not None else "")
    return (f"inconclusive: the result describes clipped values, not the data: {clipped_words(facts)}, "
            f"{_large(facts)}, so no gap between them is a finding either way{on_clipped}; "
            f"{range_advice(facts)} and audit again")


# ----------------------------------------------------------------------------------
# The verdict's message
# ----------------------------------------------------------------------------------
def inconclusive_words(noisy: bool | None) -> str:
    """How an inconclusive verdict begins: the privacy level is named only where release
    noise was on (or not known); without the release controls only the size limits it."""
    return "inconclusive at this size: " if noisy is False else "inconclusive at this size and privacy level: "


def nothing_comparable_message(tau: float, left_out: Sequence[str], excluded: str, needed: str,
                               noisy: bool | None = None) -> str:
    """No two groups can be compared, and some were left out (`excluded`: their clause)."""
    return (inconclusive_words(noisy) + "no two groups can be compared"
            + (f"; not informative (interval half-width above {INFORMATIVE_SHARE:g} tau = "
               f"{INFORMATIVE_SHARE * tau:g}): {', '.join(left_out)}" if left_out else "")
            + f"{excluded}; {needed}")


def no_disparity_message(phrase: str, label: str, estimate: float, confidence: float, band: tuple[Any, Any],
                         tau: float, detectable: str) -> str:
    """No disparity of τ or more: every compared difference's simultaneous band lies within
    ±τ (the equivalence test, `common.stats.verdict`), not merely a band that includes 0."""
    return (f"no disparity of tau or more (equivalence at tau {tau:g}: every compared difference's "
            f"{confidence:.0%} simultaneous interval lies within +/-{tau:g}; the {phrase}, {label} = "
            f"{estimate:+.4f}, has {interval_words(*band)}, which {band_relation(*band)}; {detectable})")


def inconclusive_message(phrase: str, label: str, estimate: float, confidence: float, band: tuple[Any, Any],
                         tau: float, detectable: str, mdd: float | None, beyond_range: bool,
                         left_out: Sequence[str], excluded: str, needed: str, flat: bool = False,
                         not_ruled_out: Sequence[str] = (), strict_significance: bool = True,
                         noisy: bool | None = None) -> str:
    """Nothing significant, and a gap of τ not ruled out (no equivalence within ±τ);
    `flat`: some compared differences do not vary, so the power statement `detectable`
    says so; `not_ruled_out`: the differences whose band reaches ±τ. The compared
    difference is named as what was observed, never as a finding; the groups not
    informative are said to be compared as they were (`strict_significance`: only for
    gaps whose band clears τ; otherwise at their band's level), never "not judged"."""
    relation = band_relation(*band)
    observed = (f"the {phrase} observed, {label} = {estimate:+.4f}, is no finding: "
                + (f"its {confidence:.0%} simultaneous interval is {interval_words(*band)}"
                   if relation == "says nothing" else
                   f"its {confidence:.0%} simultaneous interval {interval_words(*band)} {relation}"))
    if mdd is None or beyond_range or flat:
        power = f", and {detectable}"
    elif mdd > tau:
        power = f", and {detectable}, above tau {tau:g}"
    else:
        power = f"; {detectable} (tau {tau:g})"
    reach = (f"; a gap of tau or more is not ruled out (a band reaches +/-{tau:g}: "
             f"{_first_few(not_ruled_out)})" if not_ruled_out else "")
    message = (("inconclusive: " if flat else inconclusive_words(noisy)) + observed + power
               + reach)
    if left_out:
        message += (f"; not informative (interval half-width above {INFORMATIVE_SHARE:g} tau), so compared only "
                    f"for gaps whose band clears tau: {', '.join(left_out)}" if strict_significance else
                    f"; not informative (interval half-width above {INFORMATIVE_SHARE:g} tau), so no equivalence "
                    f"can be shown for them (their gaps are tested like the others): {', '.join(left_out)}")
    return message + excluded + "; " + needed


def _first_few(labels: Sequence[str], few: int = 3) -> str:
    """Up to `few` labels, and how many more."""
    shown = ", ".join(labels[:few])
    return shown + (f" and {len(labels) - few} more" if len(labels) > few else "")


def may_reach_words(far: float, reading: str, tau: float) -> str:
    """A significant gap read as "low" whose band's far end reaches τ (`common.stats.verdict`):
    its estimate is below τ, the band is not."""
    return (f"; below tau {tau:g} on its estimate only: the band allows a gap as large as {far:.4f} ({reading}), "
            f"so it may be tau or more")


def significant_message(severity: str, phrase: str, label: str, estimate: float, confidence: float,
                        band: tuple[Any, Any], tau: float, significant: int, compared: int, uncertain: str,
                        left_out: Sequence[str], strict_significance: bool) -> str:
    message = (f"significant disparity, severity {severity}: {phrase}, {label} = {estimate:+.4f}, "
               f"{confidence:.0%} simultaneous interval {interval_words(*band)} excludes 0 (tau {tau:g}; "
               f"{significant} significant of {compared} compared)")
    message += uncertain
    if left_out and strict_significance:
        message += (f"; not informative, so compared only for gaps whose band clears tau: "
                    f"{', '.join(left_out)}")
    elif left_out:
        message += (f"; not informative (interval half-width above {INFORMATIVE_SHARE:g} tau): "
                    f"{', '.join(left_out)}")
    return message


def non_overlapping_words(non_overlap: Sequence[tuple[str, str]], significant: bool) -> str:
    """The pairs of groups whose marginal intervals do not overlap, as a clause ("" for none)."""
    if not non_overlap:
        return ""
    pairs_words = ", ".join(f"{a}/{b}" for a, b in non_overlap)
    return (f"; non-overlapping group CIs: {pairs_words}" if significant else
            f"; group CIs that do not overlap (marginal intervals, not a finding: the verdict judges "
            f"the simultaneous bands): {pairs_words}")


def attenuation_words(label: str, gap: float | None, confidence: float, interval: tuple[Any, Any] | None,
                      understates: bool, *, factor: float | None = None, up_to: float | None = None,
                      shares: dict[str, float] | None = None, unidentifiable: bool = False,
                      may_be: str | None = None) -> str:
    """What attenuation does to a significant compared gap (`common.stats.verdict.with_attenuation`):
    whether the weighted gap understates the true-race one, by how much it could (the
    factor, were the difference in one race alone), the corrected gap where identifiable,
    and, for a gap read as "low", the severity it may have."""
    parts = []
    if understates:
        seen = (" (the share of each group's weight on members of its own race: "
                + ", ".join(f"{g} {x:.0%}" for g, x in shares.items()) + ")") if shares else ""
        parts.append("the weighted gap likely understates the true-race gap: BISG weights pull the groups' "
                     f"estimates towards each other{seen}")
    elif gap is not None:
        parts.append("the weighted gap does not understate the corrected one")
    if factor is not None and up_to is not None and factor > 1.0:
        parts.append(f"were the difference in one of the two races alone, the true-race gap would be about "
                     f"{factor:.1f}x the weighted one, {up_to:+.4f}")
    if gap is not None:
        parts.append(f"corrected for attenuation, {label} = {gap:+.4f}"
                     + (f" ({confidence:.0%} interval {interval_words(*interval)})" if interval is not None else ""))
    elif unidentifiable:
        parts.append("its corrected value is not identifiable at this size")
    if may_be is not None:
        parts.append(f"so the severity, low on the weighted estimate, may be {may_be} for the races themselves")
    elif understates:
        parts.append("so the severity above is a lower bound")
    return "; " + "; ".join(parts) if parts else ""


#: a significant gap where no second moments were released and no correction was asked for
ATTENUATION_UNKNOWN = ("; the weighted gap may understate the true-race gap (BISG weights pull the groups' "
                       "estimates towards each other): --correction calibration estimates by how much")


def unseen_groups_words(shares: dict[str, float], seen_little: float = 0.5) -> str:
    """The groups whose weight lies mostly on members of other races (own-race share below
    `seen_little`), which a verdict with nothing significant sees little of."""
    little = [(g, x) for g, x in shares.items() if x < seen_little]
    if not little:
        return ""
    return ("; the weighted estimates see little of " + ", ".join(f"{g} ({x:.0%} of its weight on its race)"
                                                                  for g, x in little)
            + ": a true-race gap there would show at a fraction of its size")
