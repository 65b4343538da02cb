"""Bootstrap percentile confidence intervals for ratio estimators (SPEC.md section 4).

Method: **random-bucket (cluster) bootstrap.** P1 partitions the joined rows at
random into M buckets of (almost) equal size and aggregates each bucket once under
HE. A replicate resamples M buckets with replacement (multinomial counts c_bm) and is
Num*_b = sum_m c_bm Num_m, Den*_b likewise, so the B replicates cost B*M ciphertext
multiplications instead of B passes of scalar multiplications over every row.

Why it agrees with the row bootstrap: rows are i.i.d., so bucket sums are i.i.d.
with mean (n/M)mu and variance (n/M)sigma^2; resampling M of them reproduces the
row-level bootstrap variance n*sigma^2 and, the bucket sums being near normal, its
percentile intervals. When n <= M every bucket is one row and the method *is* the
row bootstrap. `row_bootstrap_ratios` is the plain reference it is tested against.
"""
from __future__ import annotations

import numpy as np

DEFAULT_REPLICATES = 1000
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BUCKETS = 128


def assign_buckets(n_rows: int, n_buckets: int, rng: np.random.Generator) -> list[np.ndarray]:
    """A random partition of range(n_rows) into min(n_rows, n_buckets) near-equal buckets."""
    m = max(1, min(n_rows, n_buckets))
    perm = rng.permutation(n_rows)
    return [np.sort(perm[i::m]) for i in range(m)]


def resample_counts(n_buckets: int, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """(B, M) multinomial counts: how often each bucket is drawn in each replicate."""
    return rng.multinomial(n_buckets, np.full(n_buckets, 1.0 / n_buckets), size=replicates)


def ratios(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1), np.nan)


def percentile_interval(replicates: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile CI per column of a (B, k) replicate array (NaN replicates ignored)."""
    alpha = 1.0 - confidence
    reps = np.asarray(replicates, dtype=np.float64)
    low = np.full(reps.shape[1], np.nan)
    high = np.full(reps.shape[1], np.nan)
    for j in range(reps.shape[1]):
        col = reps[:, j][~np.isnan(reps[:, j])]
        if col.size:
            low[j], high[j] = np.quantile(col, [alpha / 2, 1 - alpha / 2])
    return low, high


def bucket_bootstrap_ratios(num_rows: np.ndarray, den_rows: np.ndarray, buckets: list[np.ndarray],
                            counts: np.ndarray) -> np.ndarray:
    """Plain-arithmetic twin of the HE computation: (B, k) replicate ratios."""
    num_b = np.stack([num_rows[idx].sum(axis=0) for idx in buckets])  # (M, k)
    den_b = np.stack([den_rows[idx].sum(axis=0) for idx in buckets])
    return ratios(counts @ num_b, counts @ den_b)


def row_bootstrap_ratios(num_rows: np.ndarray, den_rows: np.ndarray, replicates: int,
                         rng: np.random.Generator) -> np.ndarray:
    """The classic row-resampling bootstrap, in plaintext: (B, k) replicate ratios."""
    n = num_rows.shape[0]
    w = rng.multinomial(n, np.full(n, 1.0 / n), size=replicates)  # (B, n)
    return ratios(w @ num_rows, w @ den_rows)
