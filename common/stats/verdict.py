"""The verdict: what it holds and the rules that reach it (design §5.10).

A disparity is *significant* only when the compared difference's simultaneous interval
excludes 0 (a max-|t| band over the compared family, `common.stats.intervals`, so that
picking the largest of many gaps does not manufacture significance); severity is "none"
(not significant, a gap of τ was detectable, and no group was left out), "inconclusive"
(not significant, and one of those fails), "low" (significant, |gap| < τ), "moderate"
(at least τ) or "high" (at least 2τ), read off the estimate; where the band's end nearer
0 reads milder, the message says how small the band lets the gap be (a wide band's
finding is of a gap, not of its size). Rules per metric: "range" (ERO, output metric:
every pair of groups; the largest significant gap), "below_overall" (MQOS: overall −
group > 0), "negative_cells" (LOT: a cell significantly below 0, the lower-ranked member
more relevant), "nonzero_pairs" (POT: DTI ≠ 0), "inclusion" (probabilistic count:
Pr(N_j ≥ T) below the inclusion level in some pool; severity "none" or "flagged", which
the metric decides itself). Groups too small for their intervals to be trusted take no
part in the verdict (`excluded_groups`, `common.stats.left_out`).

Severity "inconclusive": nothing significant, and either the minimum detectable
difference (MDD, `common.stats.intervals`) exceeds τ or some group (pair cell) is not
informative at the overall's value (`uninformative`), so the audit could not have shown
a gap of τ; `members_factor` ≈ (MDD/τ)² (or the uninformative groups'
(half-width/(τ/2))², the larger) is how many times the members would make it conclusive
(the MDD shrinks as 1/√n). The simultaneous bands are clipped to the compared
differences' range [lo − hi, hi − lo] (post-processing: the true gap lies in it); an MDD
beyond the largest gap the metric can take (hi − lo) means no gap is detectable at this
size: the verdict then states neither an MDD nor a factor of members (noise, not
sampling, dominates such an interval, and it does not shrink as 1/√n). "none" (green)
therefore means: not significant, a gap of τ would have been found, and no group was
left out. A comparison that involves an uninformative group counts as significant only
when its band clears τ itself (a small group's bootstrap interval can under-cover);
under release noise the intervals come from the released aggregates' own variances
(`common.stats.moments`, or random groups), which cover at small sizes too, so there a
comparison counts at the band's level (null flag rate at nominal: bench/RESULTS.md).
Either way the compared pair is the most adverse significant comparison between
informative groups, if there is one. With a correction, `verdict.attenuation` holds the
compared pair's corrected gap and whether the weighted gap understates it.

The verdict's test: without release noise the verdict (`verdict.compared`'s intervals
and the MDD, not the group and difference intervals reported) takes each group's spread
at the overall's value (`common.stats.intervals.null_scaled`). On `ppre synth` ERO data
(`bench/bench_null.py`, `bench/RESULTS.md`) the null flag rate was 12.6% at 10,000
members, 5.1% with this and the Kish rule (5.5% at 100,000 members, was 6.2%; 800
datasets each); power for a black gap of 0.05 at 10,000 members unchanged.

The verdict's words are `common.stats.wording`'s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from common.stats import wording
from common.stats.intervals import (INFORMATIVE_SHARE, clip, detectable_differences, difference_range,
                                    estimate_intervals, finite_or_none, is_informative, simultaneous_bands)

#: "flagged" is the inclusion rule's (probabilistic count) only
SEVERITIES = ("none", "low", "moderate", "high", "inconclusive", "insufficient data", "flagged")


@dataclass(frozen=True)
class Verdict:
    rule: str
    tau: float
    severity: str
    significant: bool
    flagged: bool
    #: the compared difference: label, estimate, its interval and its simultaneous band
    compared: dict[str, Any] | None
    significant_comparisons: tuple[str, ...] = ()
    non_overlapping: tuple[tuple[str, str], ...] = ()
    message: str = ""
    #: groups left out of the verdict (effective size below MIN_EFFECTIVE_SIZE)
    excluded_groups: tuple[str, ...] = ()
    #: the minimum detectable difference at these settings (`common.stats.intervals`), None when undefined
    mdd: float | None = None
    #: groups (or pair cells) not compared because not informative; any makes "none" impossible
    uninformative: tuple[str, ...] = ()
    #: inconclusive only: about how many times the joined members would make the audit conclusive
    members_factor: float | None = None
    #: with a correction: the compared pair's corrected gap and whether the weighted one understates it
    attenuation: dict[str, Any] | None = None
    #: where the Test-Client clipped a large share of its rows into a declared range: how many,
    #: of how many, and the parameter that declares it (`common.stats.declared_range`)
    clipped: dict[str, Any] | None = None
    #: whether every compared difference's simultaneous band lies within ±τ (in the direction
    #: the rule judges): the equivalence test a "none" rests on; None where no band is defined
    equivalent: bool | None = None
    #: a significant gap read as "low" whose band's far end, corrected value or attenuation
    #: allowance reaches τ: it may be τ or more (the message says which)
    may_reach_tau: bool = False


@dataclass(frozen=True)
class Bands:
    """A compared family's intervals, per difference: the marginal ones (`low`, `high`), the
    simultaneous band (clipped to the differences' range), the MDD, and whether the
    difference does not vary across the replicates (`flat`: a band but no MDD,
    `common.stats.intervals.detectable_differences`)."""

    low: np.ndarray
    high: np.ndarray
    band_low: np.ndarray
    band_high: np.ndarray
    mdds: np.ndarray
    flat: np.ndarray

    @classmethod
    def of(cls, values: np.ndarray, confidence: float, method: str, span: tuple[float, float] | None) -> "Bands":
        low, high = estimate_intervals(values, confidence, method)
        band_low, band_high = (np.clip(b, *span) if span is not None else b
                               for b in simultaneous_bands(values, confidence, method))
        mdds = detectable_differences(values, confidence, method)  # NaN where no power is stated
        return cls(low, high, band_low, band_high, mdds,
                   np.isnan(mdds) & np.isfinite(band_low) & np.isfinite(band_high))


# ----------------------------------------------------------------------------------
# The verdict over a compared family
# ----------------------------------------------------------------------------------
def verdict_from(rule: str, labels: Sequence[str], values: np.ndarray, confidence: float, method: str,
                 tau: float, groups: Sequence = (), *, left_out: Sequence[str] = (),
                 left_out_factor: float | None = None, left_out_widest: str | None = None,
                 strict: Sequence[bool] | None = None,
                 excluded: Sequence[str] = (), noisy: bool | None = None, metric: str = "",
                 strict_significance: bool = True, span: tuple[float, float] | None = None) -> Verdict:
    """The verdict over a family of compared differences (`values`: (R+1, C), row 0 the
    estimates), by `rule` (module docstring). `groups`: the groups' results (their
    marginal intervals' overlaps are named). `left_out`: the groups (or cells) that
    could not take part as not informative; `excluded`: the groups left out of the
    verdict for their size or withheld (`common.stats.left_out`): with any of
    either, no verdict is "none"; `left_out_factor`: how many times the members they
    would need (`left_out_widest`: the one that needs it); `noisy`: whether release
    noise was on (what the advice names); `metric`: the metric's name (which size rule
    left groups out); `strict_significance`: whether a comparison with an uninformative
    group must clear tau to count (without release noise; module docstring) — either way
    the compared pair is picked among the informative groups' comparisons first."""
    non_overlap = _non_overlapping(groups)
    est = values[0] if values.size else np.empty(0)
    excluded_words = wording.excluded_words(excluded, noisy, metric)
    if not np.isfinite(est).any():
        return _nothing_comparable(rule, tau, non_overlap, left_out, excluded, excluded_words,
                                   _with_excluded(left_out_factor, excluded), left_out_widest, noisy)
    bands = Bands.of(values, confidence, method, span)
    adverse, significant = _significance(rule, est, bands, tau, strict, strict_significance)
    banded = _banded(bands, strict)
    mdd, mdd_widest = _largest_mdd(bands.mdds, banded, labels)
    beyond_range = mdd is not None and _detectable(mdd, span) is None
    factor, widest = _members_needed(mdd, mdd_widest, beyond_range, tau, (left_out_factor, left_out_widest),
                                     excluded)
    flat = [labels[i] for i in np.flatnonzero(banded & bands.flat)]
    within = _within_tau(rule, bands, tau)
    equivalent = bool(banded.any() and within[banded].all()) if banded.any() else None
    not_ruled_out = [labels[i] for i in np.flatnonzero(banded & ~within)]
    conclusive = (not left_out and not excluded and bool(banded.all()) and not flat and bool(equivalent))
    if not conclusive and not beyond_range:  # what the equivalence test needs, beside the MDD's
        factor, widest = max([f for f in ((factor, widest), _equivalence_factor(rule, est, bands, banded & ~within,
                                                                                 labels, tau))
                              if f[0] is not None], default=(None, None), key=lambda f: f[0])
        if factor is not None and factor <= 1.0:  # inconclusive with the members it has: how many more is unknown
            factor = None
    pick, severity = _compared_pick(significant, adverse, banded, strict, tau, conclusive)
    needed = (wording.FLAT_NEEDED if flat and factor is None and not left_out and not excluded
              else wording.needed_words(factor, noisy, widest))
    far = far_end(rule, est[pick], bands.band_low[pick], bands.band_high[pick])
    message = _message(severity, rule, labels[pick], est[pick], bands, pick, confidence, tau, span,
                       mdd=mdd, beyond_range=beyond_range, significant=significant, compared=len(labels),
                       left_out=left_out, strict_significance=strict_significance, excluded_words=excluded_words,
                       needed=needed, flat=flat, banded=int(banded.sum()), not_ruled_out=not_ruled_out,
                       noisy=noisy, far=far)
    message += wording.non_overlapping_words(non_overlap, bool(significant.any()))
    return Verdict(rule, tau, severity, bool(significant.any()), severity in ("moderate", "high"),
                   _compared_entry(labels, est, bands, pick, tau, span),
                   tuple(labels[i] for i in np.flatnonzero(significant)), tuple(non_overlap), message,
                   excluded_groups=tuple(excluded), mdd=_detectable(mdd, span),
                   members_factor=_round_factor(factor) if severity == "inconclusive" else None,
                   uninformative=tuple(left_out), equivalent=equivalent,
                   may_reach_tau=severity == "low" and far >= tau)


def _within_tau(rule: str, bands: Bands, tau: float) -> np.ndarray:
    """Per compared difference, whether its simultaneous band lies within ±τ in the
    direction `rule` judges (the equivalence test: a gap of τ or more is ruled out at the
    band's confidence, Schuirmann's two one-sided tests with the family's band)."""
    low, high = bands.band_low, bands.band_high
    with np.errstate(invalid="ignore"):
        if rule == "below_overall":
            return np.isfinite(high) & (high < tau)
        if rule == "negative_cells":
            return np.isfinite(low) & (low > -tau)
        return np.isfinite(low) & np.isfinite(high) & (low > -tau) & (high < tau)


def _equivalence_factor(rule: str, est: np.ndarray, bands: Bands, short: np.ndarray, labels: Sequence[str],
                        tau: float) -> tuple[float | None, str | None]:
    """How many times the members would bring the bands of the differences `short` of
    equivalence within ±τ, their estimates staying where they are: ((half-width /
    (τ − |estimate|))², the half-width shrinking as 1/√n), the largest, and the one that
    needs it; None where an estimate itself reaches τ/2 (its distance to τ is too
    uncertain to extrapolate: more members decide that one either way, and the MDD's
    factor stands)."""
    best: tuple[float | None, str | None] = (None, None)
    for i in np.flatnonzero(short):
        magnitude = {"below_overall": est[i], "negative_cells": -est[i]}.get(rule, abs(est[i]))
        half = (bands.band_high[i] - bands.band_low[i]) / 2.0
        if not (np.isfinite(magnitude) and np.isfinite(half)) or max(magnitude, 0.0) >= tau / 2.0:
            continue
        f = (half / (tau - max(magnitude, 0.0))) ** 2
        if best[0] is None or f > best[0]:
            best = (float(f), labels[i])
    return best


def _non_overlapping(groups: Sequence) -> list[tuple[str, str]]:
    """The pairs of groups (not overall) whose marginal intervals do not overlap."""
    out = []
    defined = [g for g in groups if g.group != "overall" and g.ci_low is not None]
    for i, a in enumerate(defined):
        for b in defined[i + 1:]:
            if a.ci_high < b.ci_low or b.ci_high < a.ci_low:
                out.append((a.group, b.group))
    return out


def _nothing_comparable(rule: str, tau: float, non_overlap, left_out: Sequence[str], excluded: Sequence[str],
                        excluded_words: str, factor: float | None, widest: str | None,
                        noisy: bool | None) -> Verdict:
    """No compared difference has a defined estimate: inconclusive where groups were left
    out (more members might make them comparable), else insufficient data."""
    if left_out or excluded:
        message = wording.nothing_comparable_message(tau, left_out, excluded_words,
                                                     wording.needed_words(factor, noisy, widest), noisy)
        return Verdict(rule, tau, "inconclusive", False, False, None, (), tuple(non_overlap), message,
                       excluded_groups=tuple(excluded), uninformative=tuple(left_out),
                       members_factor=_round_factor(factor))
    return Verdict(rule, tau, "insufficient data", False, False, None, (), tuple(non_overlap),
                   wording.TOO_FEW_ESTIMATES)


def _significance(rule: str, est: np.ndarray, bands: Bands, tau: float, strict: Sequence[bool] | None,
                  strict_significance: bool) -> tuple[np.ndarray, np.ndarray]:
    """(how adverse each difference is in the direction `rule` judges, -inf where
    undefined; whether its band excludes 0 in that direction)."""
    band_low, band_high = bands.band_low, bands.band_high
    if rule == "below_overall":
        adverse, significant = est, band_low > 0
    elif rule == "negative_cells":
        adverse, significant = -est, band_high < 0
    else:  # "range", "nonzero_pairs"
        adverse, significant = np.abs(est), (band_low > 0) | (band_high < 0)
    adverse = np.where(np.isfinite(adverse), adverse, -np.inf)
    significant = significant & np.isfinite(est)
    if strict is not None and np.any(strict) and strict_significance:
        # a comparison with a group left out as not informative counts only when its band
        # clears tau itself (its interval may under-cover: module docstring)
        beyond = {"below_overall": band_low > tau, "negative_cells": band_high < -tau}.get(
            rule, (band_low > tau) | (band_high < -tau))
        significant = significant & (~np.asarray(strict) | beyond)
    return adverse, significant


def _banded(bands: Bands, strict: Sequence[bool] | None) -> np.ndarray:
    """The differences whose band is defined, those between informative groups only where
    there are some."""
    banded = np.isfinite(bands.band_low) & np.isfinite(bands.band_high)
    if strict is not None and np.any(strict) and not np.all(strict):
        banded = banded & ~np.asarray(strict)
    return banded


def _largest_mdd(mdds: np.ndarray, banded: np.ndarray, labels: Sequence[str]) -> tuple[float | None, str | None]:
    """The verdict's MDD, the largest over the banded differences, and the one that has it."""
    finite_mdd = mdds[banded & np.isfinite(mdds)]
    mdd = float(finite_mdd.max()) if finite_mdd.size else None
    widest = labels[int(np.nanargmax(np.where(banded & np.isfinite(mdds), mdds, np.nan)))] \
        if mdd is not None else None
    return mdd, widest


def _members_needed(mdd: float | None, mdd_widest: str | None, beyond_range: bool, tau: float,
                    left_out: tuple[float | None, str | None],
                    excluded: Sequence[str]) -> tuple[float | None, str | None]:
    """How many times the members would make the audit conclusive, and the comparison or
    group that needs it: the larger of (MDD/τ)² and the left-out groups' factor."""
    factor, widest = max([f for f in (((mdd / tau) ** 2 if mdd is not None and not beyond_range else None,
                                       mdd_widest), left_out) if f[0] is not None],
                         default=(None, None), key=lambda f: f[0])
    return _with_excluded(factor, excluded), widest


def _compared_pick(significant: np.ndarray, adverse: np.ndarray, banded: np.ndarray,
                   strict: Sequence[bool] | None, tau: float, conclusive: bool) -> tuple[int, str]:
    """(the compared difference, the severity): the most adverse significant one, between
    informative groups where there is one; with none significant, the most adverse
    difference whose band is defined (one without a band cannot be read as "includes
    0"), else the most adverse one."""
    if significant.any():
        preferred = significant & ~np.asarray(strict, dtype=bool) if strict is not None else significant
        pick = int(np.argmax(np.where(preferred if preferred.any() else significant, adverse, -np.inf)))
        return pick, severity_of(float(adverse[pick]), tau)
    pick = int(np.argmax(np.where(banded, adverse, -np.inf))) if banded.any() else int(np.argmax(adverse))
    return pick, "none" if conclusive else "inconclusive"


def _compared_entry(labels: Sequence[str], est: np.ndarray, bands: Bands, pick: int, tau: float,
                    span: tuple[float, float] | None) -> dict[str, Any]:
    """The verdict's `compared`: the picked difference with its intervals and MDD."""
    return {"label": labels[pick], "estimate": finite_or_none(est[pick]), "ci_low": finite_or_none(bands.low[pick]),
            "ci_high": finite_or_none(bands.high[pick]), "band_low": finite_or_none(bands.band_low[pick]),
            "band_high": finite_or_none(bands.band_high[pick]),
            "informative": is_informative(bands.low[pick], bands.high[pick], tau),
            "mdd": _detectable(bands.mdds[pick], span)}


def _message(severity: str, rule: str, label: str, estimate: float, bands: Bands, pick: int, confidence: float,
             tau: float, span: tuple[float, float] | None, *, mdd: float | None, beyond_range: bool,
             significant: np.ndarray, compared: int, left_out: Sequence[str], strict_significance: bool,
             excluded_words: str, needed: str, flat: Sequence[str] = (), banded: int = 0,
             not_ruled_out: Sequence[str] = (), noisy: bool | None = None, far: float = math.nan) -> str:
    """The verdict's message for its severity (`common.stats.wording`), the groups left out
    for their size included; `flat`: the banded differences (of `banded`) that do not
    vary, of which no power is stated; `not_ruled_out`: those whose band reaches ±τ;
    `far`: the compared band's far end (`far_end`)."""
    phrase = wording.rule_phrase(rule, estimate)
    band = (bands.band_low[pick], bands.band_high[pick])
    detectable = wording.detectable_words(mdd, beyond_range, span, flat, banded)
    if severity == "none":
        return wording.no_disparity_message(phrase, label, estimate, confidence, band, tau, detectable) \
            + excluded_words
    if severity == "inconclusive":
        return wording.inconclusive_message(phrase, label, estimate, confidence, band, tau, detectable, mdd,
                                            beyond_range, left_out, excluded_words, needed, flat=bool(flat),
                                            not_ruled_out=not_ruled_out, strict_significance=strict_significance,
                                            noisy=noisy)
    return wording.significant_message(severity, phrase, label, estimate, confidence, band, tau,
                                       int(significant.sum()), compared,
                                       _uncertain_size(severity, _nearer_end(rule, estimate, *band), tau)
                                       + _may_reach(severity, far, tau),
                                       left_out, strict_significance) + excluded_words


def severity_of(magnitude: float, tau: float) -> str:
    """The severity of a significant gap of this size: "high" from 2τ, "moderate" from τ."""
    if magnitude >= 2 * tau:
        return "high"
    if magnitude >= tau:
        return "moderate"
    return "low"


def _nearer_end(rule: str, estimate: float, band_low: float, band_high: float) -> float:
    """The end of a significant comparison's band nearer 0, as an adverse magnitude (the
    smallest gap the band allows, in the direction the rule judges)."""
    if rule == "below_overall":
        return float(band_low)
    if rule == "negative_cells":
        return float(-band_high)
    return float(band_low) if estimate >= 0 else float(-band_high)


def far_end(rule: str, estimate: Any, band_low: Any, band_high: Any) -> float:
    """The end of a comparison's band farther from 0, as an adverse magnitude (the largest
    gap the band allows, in the direction the rule judges); NaN where that end is undefined."""
    low, high = (math.nan if x is None else float(x) for x in (band_low, band_high))
    if rule == "below_overall":
        return high
    if rule == "negative_cells":
        return -low
    return high if estimate is not None and estimate >= 0 else -low


def _may_reach(severity: str, far: float, tau: float) -> str:
    """Words for a significant gap read as "low" whose band reaches τ: below τ is the
    estimate's reading, not what the band rules out."""
    if severity != "low" or not math.isfinite(far) or far < tau:
        return ""
    return wording.may_reach_words(far, severity_of(far, tau), tau)


def _uncertain_size(severity: str, nearer: float, tau: float) -> str:
    """Words for a significant gap whose band reaches into a milder severity than its
    estimate's, "" where the band's nearer end reads as the estimate does."""
    if not math.isfinite(nearer) or severity_of(nearer, tau) == severity:
        return ""
    return wording.uncertain_size_words(nearer, severity_of(nearer, tau))


def _detectable(mdd: Any, span: tuple[float, float] | None) -> float | None:
    """An MDD as the verdict states it: None where undefined or beyond the largest gap the
    compared differences can take (`span`'s upper end: no gap is detectable; module docstring)."""
    mdd = finite_or_none(mdd)
    return None if mdd is None or (span is not None and mdd > span[1]) else mdd


def _with_excluded(factor: float | None, excluded: Sequence[str]) -> float | None:
    """How many times the members would make the audit conclusive, None (unknown) where
    groups left out for their size say more members are needed but not how many."""
    return None if excluded and (factor is None or factor <= 1.0) else factor


def _round_factor(factor: float | None) -> float | None:
    factor = finite_or_none(factor)
    return None if factor is None else round(max(factor, 1.0), 1)


# ----------------------------------------------------------------------------------
# The verdict of a result: its compared family, the groups left out of it
# ----------------------------------------------------------------------------------
def verdict_of(rule: str, cells: Sequence, groups: Sequence, pairs: Sequence, index: dict[str, int],
               diff_labels: Sequence[tuple[str, str, str]], diffs: np.ndarray | None, values: np.ndarray, *,
               small: set[str], confidence: float, method: str, tau: float, bounds, pair_bounds,
               noisy: bool | None, metric: str, corrected=None, clipped: dict[str, Any] | None = None) -> Verdict:
    """The verdict of a result being finished (`common.stats.results.finish`): its rule's
    compared family among `cells` (the groups' and pair cells' results `groups` and
    `pairs`, the groups' columns `index`, the differences `diffs` labelled `diff_labels`,
    the cells' `values`), with the groups in `small` left out for their size, the
    attenuation-corrected gap beside the weighted one where a correction was asked for,
    and what the clipping into a declared range leaves of it (`clipped`: `with_clipping`)."""
    labels, fam, left_out, (factor, widest), strict = compared_family(rule, cells, groups, pairs, index,
                                                                      diff_labels, diffs, values, small, tau,
                                                                      bounds)
    excluded = tuple(g.group for g in groups if g.group in small)
    factor, widest = max([f for f in ((factor, widest),
                                      widest_factor([(g.group, g.ci_low, g.ci_high) for g in groups
                                                     if g.group in small], tau, bounds))
                          if f[0] is not None], default=(None, None), key=lambda f: f[0])
    if fam.shape[1] == 0 and not left_out and not excluded:
        verdict = Verdict(rule, tau, "insufficient data", False, False, None, (), (), wording.NOTHING_TO_COMPARE)
    else:
        verdict = verdict_from(rule, labels, fam, confidence, method, tau,
                               [g for g in groups if g.group not in small], left_out=left_out, left_out_factor=factor,
                               left_out_widest=widest, strict=strict, excluded=excluded, noisy=noisy, metric=metric,
                               strict_significance=not noisy, span=pair_bounds)
    if corrected is not None and verdict.compared and rule in ("range", "below_overall"):
        verdict = with_attenuation(verdict, corrected, index, confidence, method, bounds, groups)
    elif verdict.significant and rule in ("range", "below_overall"):
        verdict = replace(verdict, message=verdict.message + wording.ATTENUATION_UNKNOWN)
    return with_clipping(verdict, clipped, confidence)


def with_clipping(verdict: Verdict, clipped: dict[str, Any] | None, confidence: float) -> Verdict:
    """The verdict where the Test-Client clipped rows into a declared range
    (`common.stats.declared_range`): where the share is large (at least CLIPPED_SHARE of its rows, overall) the result describes the
    range's ends more than the data: a verdict with nothing significant ("none" or
    "inconclusive") is "inconclusive" for that reason (no gap between clipped values is
    a finding either way, and more members would not change it: no factor of members);
    any other keeps its severity (a significant one read off the clipped values) with a
    message that says so and which range to declare. A smaller
    share leaves the verdict as it is (the pages warn beside it, from the dataset facts).
    The facts go with the verdict it changed (`clipped`)."""
    if not clipped or not clipped.get("large"):
        return verdict
    if verdict.severity in ("none", "inconclusive"):
        c = verdict.compared or {}
        label, estimate = str(c.get("label", "")), c.get("estimate")
        phrase = wording.rule_phrase(verdict.rule, estimate if finite_or_none(estimate) is not None else 0.0)
        message = wording.clipped_message(phrase, label, estimate, confidence,
                                          (c.get("band_low"), c.get("band_high")), clipped)
        return replace(verdict, severity="inconclusive", message=message, members_factor=None,
                       clipped=dict(clipped))
    return replace(verdict, message=verdict.message + wording.clipped_clause(clipped), clipped=dict(clipped))


def _eligible(g, overall, bounds, tau: float) -> bool:
    """Whether a group takes part in the verdict: informative at the overall's value.
    For a bounded metric the group's half-width is rescaled from its own estimate's
    binomial-type spread (x − lo)(hi − x) to the overall's, so that a group is not picked
    because its estimate happens to sit near a bound (few events: a narrow interval
    around a low rate, the case in which its interval under-covers); unbounded metrics
    use the half-width as it is."""
    if not g.informative and bounds is None:
        return False
    if g.ci_low is None or g.ci_high is None or g.estimate is None:
        return False
    half = (g.ci_high - g.ci_low) / 2.0
    if bounds is not None and overall is not None and overall.estimate is not None:
        lo, hi = bounds
        spread = (g.estimate - lo) * (hi - g.estimate)
        at_overall = (overall.estimate - lo) * (hi - overall.estimate)
        if spread <= 0:
            return False
        half *= math.sqrt(at_overall / spread)
    return half <= INFORMATIVE_SHARE * tau + 1e-12


def compared_family(rule, cells, groups, pairs, index, diff_labels, diffs, values, small, tau, bounds=None):
    """The compared family (labels, (R+1, C) values), the groups or cells left out of it
    (not informative, or withheld) and how many times the members would make them
    informative ((half-width / (INFORMATIVE_SHARE·τ))², the largest)."""
    empty = np.empty((values.shape[0], 0))
    if rule in ("range", "below_overall"):
        judged = [g for g in groups if g.group != "overall" and g.group not in small]
        overall = next((g for g in groups if g.group == "overall"), None)
        ok = {g.group for g in judged if _eligible(g, overall, bounds, tau)}
        left = [g for g in judged if g.group not in ok]
        if rule == "below_overall" and "overall" in index and not any(
                g.informative for g in groups if g.group == "overall"):
            left += [g for g in judged if g.informative]
            ok = set()
        left_labels = [g.group for g in left]
    else:
        left = [p for p in pairs if not p.informative]
        left_labels = [pair_label(p.higher, p.lower, p.rank_pair) for p in left]
    factor = widest_factor([(label, x.ci_low, x.ci_high) for label, x in zip(left_labels, left)], tau,
                           bounds if rule in ("range", "below_overall") else difference_range(bounds))
    named = {g.group for g in groups if g.group != "overall" and g.group not in small}
    if rule == "range":
        family = [i for i, (kind, a, b) in enumerate(diff_labels) if kind == "between" and a in named and b in named]
        labels, cols = [], []
        for i in family:  # every gap oriented as max − min by its estimate: the compared one reads positive
            _, a, b = diff_labels[i]
            flip = bool(diffs[0, i] < 0)
            labels.append(f"{b} - {a}" if flip else f"{a} - {b}")
            cols.append(-diffs[:, i] if flip else diffs[:, i])
        fam = np.column_stack(cols) if cols else empty
        strict = [not (diff_labels[i][1] in ok and diff_labels[i][2] in ok) for i in family]
        return labels, fam, [g.group for g in left], factor, strict
    if rule == "below_overall":
        family = [i for i, (kind, a, _) in enumerate(diff_labels) if kind == "to_overall" and a in named]
        labels = [f"overall - {diff_labels[i][1]}" for i in family]
        fam = -diffs[:, family] if family else empty
        return labels, fam, [g.group for g in left], factor, [diff_labels[i][1] not in ok for i in family]
    if rule in ("negative_cells", "nonzero_pairs"):
        pair_cells = [c for c, cell in enumerate(cells) if cell.kind == "pair"]
        labels = [_label(cells[c]) for c in pair_cells]
        fam = values[:, pair_cells] if pair_cells else empty
        return (labels, fam, [_label(cells[c]) for c, p in zip(pair_cells, pairs) if not p.informative], factor,
                [not p.informative for p in pairs])
    raise ValueError(f"unknown verdict rule {rule}")


def widest_factor(entries, tau: float, span: tuple[float, float] | None = None) -> tuple[float | None, str | None]:
    """(how many times the members would make the widest of `entries` ((label, low, high))
    informative, its label): ((half-width / (INFORMATIVE_SHARE·τ))², the largest). An
    interval that fills its whole range `span` was clipped: its true width, and so the
    factor, is unknown (inf: "more members", no number)."""
    widths = [((hi - lo) / 2.0, label) for label, lo, hi in entries if lo is not None and hi is not None]
    if not widths:
        return None, None
    width, label = max(widths, key=lambda w: w[0])
    if span is not None and 2.0 * width >= (span[1] - span[0]) - 1e-12:
        return math.inf, label
    return (width / (INFORMATIVE_SHARE * tau)) ** 2, label


def with_attenuation(verdict: Verdict, corrected, index, confidence, method, bounds, groups) -> Verdict:
    """What attenuation does to the verdict (design §5.9), from the correction
    (`common.stats.correction.Corrected`: asked for, or computed off the released second
    moments for this statement alone): the compared pair's corrected gap and its interval
    where both groups are identifiable, and the gap's attenuation factor from the mixing
    M̃ (`attenuation_factor`), both beside the weighted gap the verdict judges. A
    significant gap says whether the weighted gap understates the true-race one and by how
    much it could; "low" says when the corrected gap or the factor reaches τ
    (`Verdict.may_reach_tau`). A verdict with nothing significant names the groups the
    weighted estimates see little of (their weight mostly on members of other races)."""
    if not verdict.significant:
        words = wording.unseen_groups_words(_own_race_shares(corrected), SEEN_LITTLE)
        return replace(verdict, message=verdict.message + words) if words else verdict
    label = verdict.compared["label"]
    a, _, b = label.partition(" - ")
    weighted = verdict.compared["estimate"]
    gap, low, high = _corrected_gap(corrected, a, b, index, confidence, method, bounds, groups)
    factor = attenuation_factor(corrected, a, b)
    if gap is None and factor is None:
        return verdict
    up_to = None if factor is None or weighted is None else weighted * factor
    understates = bool(weighted is not None and (
        (gap is not None and abs(gap) > abs(weighted) and gap * weighted >= 0)
        or (gap is None and factor is not None and factor > 1.0)))
    shares = _own_race_shares(corrected)
    facts = {"pair": label, "weighted": weighted, "corrected": None if gap is None else round(gap, 12),
             "corrected_ci_low": low, "corrected_ci_high": high, "understates": understates,
             "factor": None if factor is None else round(factor, 3),
             "up_to": None if up_to is None else round(up_to, 12),
             "own_race_share": {g: round(shares[g], 4) for g in (a, b) if g in shares},
             "reported": corrected.reported}
    # the corrected gap where identifiable (the better estimate), else the factor's allowance
    reaches = [x for x in ((gap,) if gap is not None else (up_to,)) if x is not None and abs(x) >= verdict.tau
               and (weighted is None or x * weighted >= 0)]
    milder = verdict.severity == "low" and bool(reaches)
    words = wording.attenuation_words(label, gap, confidence, (low, high) if low is not None else None,
                                      understates, factor=factor, up_to=up_to, shares=facts["own_race_share"],
                                      unidentifiable=gap is None,
                                      may_be=severity_of(max(abs(x) for x in reaches), verdict.tau) if milder else None)
    return replace(verdict, attenuation=facts, message=verdict.message + words,
                   may_reach_tau=verdict.may_reach_tau or milder)


def _corrected_gap(corrected, a: str, b: str, index, confidence, method, bounds,
                   groups) -> tuple[float | None, float | None, float | None]:
    """The compared pair's corrected gap and its interval (None where a group has no
    corrected value: not identifiable, dropped)."""
    width = corrected.values.shape[1]
    col = {g: c for g, c in index.items() if c < width}
    unidentifiable = set(corrected.unidentifiable)
    by_name = {g.group: g for g in groups}
    if a in unidentifiable or b in unidentifiable:
        return None, None, None
    if a == "overall" and b in col:
        ga = by_name["overall"].estimate if "overall" in by_name else None
        gb = float(corrected.values[0, col[b]])
        series = None
    elif a in col and b in col:
        ga, gb = float(corrected.values[0, col[a]]), float(corrected.values[0, col[b]])
        series = corrected.values[:, col[a]] - corrected.values[:, col[b]]
    else:
        return None, None, None
    if ga is None or not (math.isfinite(ga) and math.isfinite(gb)):
        return None, None, None
    gap = ga - gb
    if series is None:
        return gap, None, None
    lo, hi = estimate_intervals(np.column_stack([np.r_[gap, series[1:]]]), confidence, method)
    rng = difference_range(bounds)
    return gap, clip(lo[0], rng), clip(hi[0], rng)


def attenuation_factor(corrected, a: str, b: str) -> float | None:
    """By how much the weighted gap between `a` and `b` understates the true-race gap, were
    the difference in one of the two races alone (design §5.9): with M̃ the mixing
    (`Corrected.mixing`), a rate μ₀ for every race but r = μ₀ + Δ gives the weighted gap
    ``(M̃_ar − M̃_br)·Δ`` against the true ``±Δ``, so the factor is ``1/(M̃_aa − M̃_ba)``
    (the difference in a) or ``1/(M̃_bb − M̃_ab)`` (in b), the larger; against overall
    (``overall − b``: weighted ``(s_b − M̃_bb)·Δ``, true ``(s_b − 1)·Δ``, s_b the group's
    share) ``(1 − s_b)/(M̃_bb − s_b)``. None where the mixing is unknown or a divisor is
    not positive (the weighted gap does not follow the true one at all)."""
    mixing, names = corrected.mixing, corrected.groups
    if mixing is None or b not in names or (a != "overall" and a not in names):
        return None
    sd = _mixing_sd(corrected)
    j = names.index(b)
    if a == "overall":
        if corrected.shares is None:
            return None
        s_b = float(corrected.shares[j])
        divisor, over = float(mixing[j, j]) - s_b, 1.0 - s_b
        if not _readable(divisor, sd[j, j]):
            return None
        factor = over / divisor
    else:
        i = names.index(a)
        divisors = [(float(mixing[i, i] - mixing[j, i]), math.hypot(sd[i, i], sd[j, i])),
                    (float(mixing[j, j] - mixing[i, j]), math.hypot(sd[j, j], sd[i, j]))]
        if not all(_readable(d, e) for d, e in divisors):
            return None
        factor = 1.0 / min(d for d, _ in divisors)
    return None if not math.isfinite(factor) else max(factor, 1.0)


#: a share of the mixing is read only where the release noise leaves it this many sd
#: clear of 0 (a divisor) or within this sd (a share: `MAX_SHARE_SD`)
READABLE_SDS = 3.0
MAX_SHARE_SD = 0.05


def _mixing_sd(corrected) -> np.ndarray:
    """`Corrected.mixing_sd`, zeros where unknown (no noise)."""
    if corrected.mixing_sd is None:
        return np.zeros(np.shape(corrected.mixing))
    return np.where(np.isfinite(corrected.mixing_sd), corrected.mixing_sd, np.inf)


def _readable(divisor: float, sd: float) -> bool:
    """Whether a divisor of the attenuation factor is told apart from 0 by the release
    noise (a noised M can make a group look unmixed, or wholly mixed: neither is a finding)."""
    return math.isfinite(divisor) and divisor > 0 and divisor > READABLE_SDS * sd


#: below this share of its weight on members of its own race a group is "seen little" by
#: the weighted estimates (`with_attenuation`, verdicts with nothing significant)
SEEN_LITTLE = 0.5


def _own_race_shares(corrected) -> dict[str, float]:
    """Each group's share of its weight on members of its own race, ``M̃_jj``, where known
    and the release noise leaves it within MAX_SHARE_SD (a noised 0% is no finding)."""
    mixing, names = corrected.mixing, corrected.groups
    if mixing is None:
        return {}
    sd = _mixing_sd(corrected)
    return {g: float(mixing[j, j]) for j, g in enumerate(names)
            if math.isfinite(float(mixing[j, j])) and sd[j, j] <= MAX_SHARE_SD}


def _label(cell) -> str:
    """How the verdict names a cell of the plan: a group, or a pair cell ("a>b@rank")."""
    return pair_label(cell.group, cell.other, cell.rank_pair) if cell.kind == "pair" else cell.group


def pair_label(higher: str, lower: str, rank_pair: str | None) -> str:
    return f"{higher}>{lower}" + (f"@{rank_pair}" if rank_pair else "")
