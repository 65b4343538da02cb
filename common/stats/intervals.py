"""Intervals, ranges and detectable differences: the numbers a verdict is read from
(design §5.10). It works on (R+1, C) arrays: row 0 the estimates, rows 1.. the bootstrap
replicates, the parametric draws under release noise or the random groups.

Intervals: bootstrap percentile intervals (B replicates, or parametric draws under
release noise), or for random groups (MQOS-AUC: exact without release noise, sampled
always) the t interval est ± t_{G−1}·sd/√G over G random groups (`marginal_intervals`);
the verdict compares a family at once with simultaneous bands (`simultaneous_bands`: a
max-|t| band over the family, so that picking the largest of many gaps does not
manufacture significance). Without release noise the verdict's test takes each group's
spread at the overall's value, as a score test (or Wilson's interval) takes the variance
at the null: replicates widened by √(spread(overall)/spread(est)), spread(x) =
(x − lo)(hi − x) on the metric's range, for groups nearer a bound than the overall
(`null_scaled`); a low rate's bootstrap spread is small exactly when the low estimate is
a false finding (`common.stats.verdict`, "The verdict's test"). The verdict rules that read
these numbers are in `common.stats.verdict`.

Ranges (post-processing of released values, no privacy cost): every reported estimate,
interval end, difference and corrected value is clipped to its range, `value_range`:
the metric's declared one (`Metric.value_range`), [0, 1] for rates, AUC, NDCG and
probabilities (and LOT's normalised relevances), else the declared `outcome_range`;
differences and pair cells to [lo − hi, hi − lo]. Estimates are clipped before the
differences are formed; the replicates are not (they measure the noise as it is).

Resolution (`resolved`): a value the Test-Client finishes is a masked ratio
(Num + u₁)/(Den + u₂), u below one fixed-point unit (`common.crypto.masking`, design
§4.7), so the estimate and every replicate each carry their own rounding, up to about
RESOLUTION (2⁻³², one unit of one member's weight) of the value's size. Where a cell
does not vary (every value equal: all clipped to one bound, a constant outcome), that
rounding is all that is left: zeros read as 1e-33, and the replicates' quantiles,
which are the spread of their own rounding, excluded the estimate's in about
1 − confidence of such cells. So a value within RESOLUTION of 0 is 0 and a replicate
within RESOLUTION of its estimate is the estimate, before any interval is formed; and
a reported interval holds its estimate by construction (`estimate_intervals`). A compared
difference whose standard error is within RESOLUTION (`degenerate`) supports no
statement of power: its MDD is undefined (`detectable_differences`), as is an MDD below
STATED_MDD (it would read 0.0000: the rounding of a cell of a tiny effective size).

Informative: an estimate or difference is *informative* when its interval's half-width
is at most INFORMATIVE_SHARE·τ (τ/2), measured before clipping (`informative` in the
JSON of every group, cell, curve point and difference; `corrected_informative` for the
corrected values). Minimum detectable difference (MDD, `verdict.mdd`): per compared
difference h + z_0.8·se (h the simultaneous band's half-width, se the standard error
the intervals come from: the replicates' sd, or sd/√G over random groups): the true gap
found significant with 80% power; the verdict's MDD is the largest over its family.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from common.stats.quantiles import t_quantile

#: an estimate or difference is informative when its interval's half-width is at most this share of τ
INFORMATIVE_SHARE = 0.5
#: the power at which the minimum detectable difference is stated, and its normal quantile
POWER = 0.8
Z_POWER = 0.8416212335729143
#: metrics whose group estimates are rates, AUCs, NDCGs or probabilities: [0, 1]
UNIT_RANGE_METRICS = ("ero", "mqos-auc", "mqos-ndcg", "prob-count")
#: the precision of a finished value, relative to max(1, |value|): a masked ratio is exact
#: to one fixed-point unit, 2^-32 of one member's weight (`common.crypto.masking`); values
#: closer than this are the same value (module docstring, "Resolution")
RESOLUTION = 2.0 ** -32
#: the MDD is stated to 4 decimals: one below half a unit of the last reads 0.0000 and
#: states nothing (a standard error that small is a masked ratio's rounding in a cell of
#: a tiny effective size, not sampling): treated as a difference that does not vary
STATED_MDD = 0.5e-4


def finite_or_none(x: Any) -> float | None:
    """`x` as a float, None where it is missing or not finite (NaN, ±inf)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# ----------------------------------------------------------------------------------
# Resolution
# ----------------------------------------------------------------------------------
def tolerance(estimates: np.ndarray) -> np.ndarray:
    """Per column, how close two values are to be the same: RESOLUTION·max(1, |estimate|)."""
    est = np.asarray(estimates, dtype=np.float64)
    return RESOLUTION * np.maximum(1.0, np.where(np.isfinite(est), np.abs(est), 1.0))


def resolved(values: np.ndarray) -> np.ndarray:
    """`values` ((R+1, C)) at the precision a finished value has (module docstring,
    "Resolution"): a value within RESOLUTION of 0 is 0, and a replicate within
    RESOLUTION·max(1, |estimate|) of its column's estimate is the estimate. NaN stays NaN."""
    out = np.array(values, dtype=np.float64, copy=True)
    if out.size == 0:
        return out
    with np.errstate(invalid="ignore"):
        out[np.abs(out) <= RESOLUTION] = 0.0
        est = out[0]
        near = np.abs(out[1:] - est) <= tolerance(est)
    out[1:] = np.where(near & np.isfinite(est), est, out[1:])
    return out


def degenerate(values: np.ndarray, method: str) -> np.ndarray:
    """Per column of `values` ((R+1, C)): whether its standard error is within the
    resolution of its estimate (module docstring): a difference that does not vary across
    the replicates, of which no power can be stated."""
    se = standard_errors(values, method)
    with np.errstate(invalid="ignore"):
        return np.isfinite(se) & (se <= tolerance(values[0]))


# ----------------------------------------------------------------------------------
# Intervals
# ----------------------------------------------------------------------------------
def marginal_intervals(values: np.ndarray, confidence: float, method: str) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) per column of `values` ((R+1, C): row 0 the estimate, rows 1.. the
    bootstrap replicates or the random groups); NaN replicates are ignored. The t
    interval est ± t·sd/√G holds its estimate; a percentile interval is the replicates'
    quantiles, which need not (`estimate_intervals`)."""
    alpha = 1.0 - confidence
    reps = values[1:]
    c = values.shape[1]
    low, high = np.full(c, np.nan), np.full(c, np.nan)
    for j in range(c):
        col = reps[:, j][~np.isnan(reps[:, j])]
        if not np.isfinite(values[0, j]) or col.size == 0:
            continue
        if method == "percentile":
            low[j], high[j] = np.quantile(col, [alpha / 2, 1 - alpha / 2])
        elif col.size >= 2:
            half = t_quantile(1 - alpha / 2, col.size - 1) * col.std(ddof=1) / math.sqrt(col.size)
            low[j], high[j] = values[0, j] - half, values[0, j] + half
    return low, high


def estimate_intervals(values: np.ndarray, confidence: float, method: str) -> tuple[np.ndarray, np.ndarray]:
    """The intervals a result reports around its estimates: `marginal_intervals`, whose
    ends reach to the estimate where they stop short of it. A percentile interval is the
    replicates' quantiles and need not hold the estimate, which is no replicate: where a
    cell's spread is the masked ratio's rounding alone (module docstring, "Resolution",
    beyond `resolved`'s reach in a cell of less than one member's weight) or the
    bootstrap distribution lies off the estimate (a ratio of few rows); an interval
    reported around an estimate holds it. The t interval is unchanged (it holds it)."""
    low, high = marginal_intervals(values, confidence, method)
    est = values[0] if values.size else np.empty(0)
    defined = np.isfinite(low) & np.isfinite(high) & np.isfinite(est)
    return np.where(defined, np.minimum(low, est), low), np.where(defined, np.maximum(high, est), high)


def simultaneous_bands(values: np.ndarray, confidence: float, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Bands that hold for every column at once: est ± q·s_c, with s_c the replicates'
    standard deviation and q the confidence quantile of max_c |rep − est|/s_c
    (bootstrap), or Bonferroni t quantiles over the distinct tests (random groups,
    `distinct_tests`)."""
    est = values[0]
    reps = values[1:]
    c = values.shape[1]
    low, high = np.full(c, np.nan), np.full(c, np.nan)
    ok = np.isfinite(est) & (np.sum(np.isfinite(reps), axis=0) >= 2)
    if not ok.any():
        return low, high
    with np.errstate(invalid="ignore"):
        sd = np.nanstd(reps[:, ok], axis=0, ddof=1)
    if method == "percentile":
        safe = np.where(sd > 0, sd, np.inf)
        dev = np.abs(reps[:, ok] - est[ok]) / safe
        dev = np.where(np.isnan(dev), 0.0, dev)
        q = float(np.quantile(dev.max(axis=1), confidence))
        half = q * sd
    else:
        counts = np.sum(np.isfinite(reps[:, ok]), axis=0)
        alpha = 1.0 - confidence
        tests = distinct_tests(values[:, ok])
        q = np.array([t_quantile(1 - alpha / (2 * tests), int(n) - 1) for n in counts])
        half = q * sd / np.sqrt(counts)
    low[ok], high[ok] = est[ok] - half, est[ok] + half
    return low, high


def distinct_tests(values: np.ndarray) -> int:
    """How many different tests the columns of `values` ((R+1, C)) make: a column that is
    another's negative in every row (POT's DTI a/b and b/a, a gap and its reverse) tests
    the same hypothesis with the same two-sided band, so Bonferroni counts it once."""
    seen: list[np.ndarray] = []
    for col in values.T:
        if not any(np.array_equal(col, s, equal_nan=True) or np.array_equal(-col, s, equal_nan=True)
                   for s in seen):
            seen.append(col)
    return max(1, len(seen))


def standard_errors(values: np.ndarray, method: str) -> np.ndarray:
    """Per column: the replicates' standard deviation (bootstrap), or sd/√G (random
    groups): the standard error the intervals are built from; NaN where fewer than two
    replicates are defined."""
    reps = values[1:]
    counts = np.sum(np.isfinite(reps), axis=0)
    se = np.full(values.shape[1], np.nan)
    ok = counts >= 2
    if ok.any():
        with np.errstate(invalid="ignore"):
            se[ok] = np.nanstd(reps[:, ok], axis=0, ddof=1)
        if method != "percentile":
            se[ok] = se[ok] / np.sqrt(counts[ok])
    return se


def detectable_differences(values: np.ndarray, confidence: float, method: str) -> np.ndarray:
    """Per compared difference, the minimum detectable difference (MDD): the true gap the
    simultaneous band detects with probability POWER, h + z_POWER·se, h the band's
    half-width (q·se) and se the difference's standard error (module docstring); NaN
    where the difference does not vary (`degenerate`): a standard error of 0, or of the
    masked values' rounding alone, states no power, nor does one below STATED_MDD."""
    band_low, band_high = simultaneous_bands(values, confidence, method)
    se = standard_errors(values, method)
    mdd = (band_high - band_low) / 2.0 + Z_POWER * se
    with np.errstate(invalid="ignore"):
        return np.where(degenerate(values, method) | (mdd < STATED_MDD), np.nan, mdd)


# ----------------------------------------------------------------------------------
# Ranges and informativeness
# ----------------------------------------------------------------------------------
def value_range(metric, option: str, params: dict[str, Any]) -> tuple[float, float] | None:
    """The range a group's (or curve point's) estimate lies in: the metric's declared one
    (`Metric.value_range`), else [0, 1] for the rate metrics and LOT's normalised
    relevances, else the operator's declared outcome range (`outcome_range`), else None."""
    declared = metric.value_range(option, params)
    if declared is not None:
        return float(declared[0]), float(declared[1])
    if metric.name in UNIT_RANGE_METRICS or (metric.name == "lot" and option != "raw"):
        return 0.0, 1.0
    return _outcome_range(params.get("outcome_range"))


def _outcome_range(value: Any) -> tuple[float, float] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        lo_text, _, hi_text = value.partition(":")
        value = (lo_text, hi_text)
    try:
        lo, hi = float(value[0]), float(value[1])
    except (TypeError, ValueError, IndexError):
        return None
    return (lo, hi) if math.isfinite(lo) and math.isfinite(hi) and lo < hi else None


def difference_range(bounds: tuple[float, float] | None) -> tuple[float, float] | None:
    """The range of a − b for a, b in `bounds`."""
    return None if bounds is None else (bounds[0] - bounds[1], bounds[1] - bounds[0])


def clip(x: Any, bounds: tuple[float, float] | None) -> float | None:
    """`x` inside `bounds` (None: unbounded); None where `x` is not finite."""
    x = finite_or_none(x)
    if x is None or bounds is None:
        return x
    return min(max(x, bounds[0]), bounds[1])


def is_informative(low: Any, high: Any, tau: float) -> bool:
    """An estimate is informative when its interval's half-width is at most
    INFORMATIVE_SHARE·τ (module docstring); an undefined interval is not."""
    low, high = finite_or_none(low), finite_or_none(high)
    return low is not None and high is not None and (high - low) / 2.0 <= INFORMATIVE_SHARE * tau + 1e-12


def null_scaled(values: np.ndarray, index: dict[str, int], bounds: tuple[float, float] | None) -> np.ndarray:
    """`values` with each group's replicates spread as they would be at the overall's value:
    rep ← est + (rep − est)·s, s = max(1, √(spread(overall)/spread(est))), spread(x) =
    (x − lo)(hi − x) the binomial-type variance on the range [lo, hi] (module
    docstring, "Intervals"). The verdict's test is of "no gap", under which every group's value is
    the overall's; a group whose estimate sits nearer a bound than the overall's (few
    events: a low rate) has a bootstrap spread that is too small exactly when its
    estimate is far from the truth, which is how a small group makes false findings.
    Only widens; unbounded metrics and groups at a bound are left as they are."""
    if bounds is None or "overall" not in index:
        return values
    lo, hi = bounds
    overall = values[0, index["overall"]]
    at_overall = (overall - lo) * (hi - overall) if np.isfinite(overall) else 0.0
    if not at_overall > 0:
        return values
    out = values.copy()
    for group, c in index.items():
        x = values[0, c]
        spread = (x - lo) * (hi - x) if np.isfinite(x) else 0.0
        if group != "overall" and 0 < spread < at_overall:
            out[1:, c] = x + (values[1:, c] - x) * math.sqrt(at_overall / spread)
    return out

