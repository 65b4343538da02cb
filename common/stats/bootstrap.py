"""The bootstrap's resampling plan for ratio estimators (design §4.8).

Method: **random-bucket (cluster) bootstrap.** P1 partitions the joined rows at
random into M buckets of (almost) equal size and aggregates each bucket once under
HE. A replicate resamples M buckets with replacement (multinomial counts c_bm) and is
Num*_b = sum_m c_bm Num_m, Den*_b likewise, so the B replicates cost B*M ciphertext
multiplications instead of B passes of scalar multiplications over every row.

Why it agrees with the row bootstrap: rows are i.i.d., so bucket sums are i.i.d.
with mean (n/M)mu and variance (n/M)sigma^2; resampling M of them reproduces the
row-level bootstrap variance n*sigma^2 and, the bucket sums being near normal, its
percentile intervals. When n <= M every bucket is one row and the method *is* the
row bootstrap (`tests/test_bootstrap.py` holds the plain references it is tested
against). Intervals are formed from the replicates by `common.stats.intervals`.
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
