"""Bootstrap percentile CIs: the random-bucket method against the row-resampling bootstrap."""
from __future__ import annotations

import numpy as np

from common.stats import bootstrap as boot
from common.stats.intervals import marginal_intervals


def ratios(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1), np.nan)


def bucket_bootstrap_ratios(num_rows, den_rows, buckets, counts) -> np.ndarray:
    """Plain-arithmetic twin of the HE computation: (B, k) replicate ratios."""
    num_b = np.stack([num_rows[idx].sum(axis=0) for idx in buckets])  # (M, k)
    den_b = np.stack([den_rows[idx].sum(axis=0) for idx in buckets])
    return ratios(counts @ num_b, counts @ den_b)


def row_bootstrap_ratios(num_rows, den_rows, replicates: int, rng) -> np.ndarray:
    """The classic row-resampling bootstrap, in plaintext: (B, k) replicate ratios."""
    n = num_rows.shape[0]
    w = rng.multinomial(n, np.full(n, 1.0 / n), size=replicates)  # (B, n)
    return ratios(w @ num_rows, w @ den_rows)


def percentile_interval(replicates: np.ndarray, confidence: float):
    """The production percentile interval (common.stats.intervals) of a (B, k) replicate array."""
    estimate = np.zeros((1, replicates.shape[1]))
    return marginal_intervals(np.vstack([estimate, replicates]), confidence, "percentile")


def _data(n: int, seed: int):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(6, 0.6), n)
    y = rng.integers(0, 2, n)
    yhat = (rng.random(n) < np.where(y == 1, 0.8, 0.2 + 0.1 * p[:, 1])).astype(int)
    f = ((yhat == 1) & (y == 0)).astype(float)
    d = (y == 0).astype(float)
    return p * f[:, None], p * d[:, None]


def test_bucket_bootstrap_intervals_agree_with_row_bootstrap():
    """Same data, B = 2000: endpoints agree within a fifth of the interval width (all groups)."""
    num, den = _data(5000, 11)
    rng = np.random.default_rng(5)
    row = row_bootstrap_ratios(num, den, 2000, rng)
    buckets = boot.assign_buckets(5000, boot.DEFAULT_BUCKETS, rng)
    counts = boot.resample_counts(len(buckets), 2000, rng)
    bucket = bucket_bootstrap_ratios(num, den, buckets, counts)
    lo_r, hi_r = percentile_interval(row, 0.95)
    lo_b, hi_b = percentile_interval(bucket, 0.95)
    width = hi_r - lo_r
    assert (np.abs(lo_b - lo_r) < 0.2 * width).all(), (lo_b, lo_r)
    assert (np.abs(hi_b - hi_r) < 0.2 * width).all(), (hi_b, hi_r)
    # and the widths agree on average across groups to within 10%
    assert abs(np.mean((hi_b - lo_b) / width) - 1) < 0.10


def test_coverage_of_bucket_intervals_matches_nominal():
    """Over repeated samples from a known population, the 90% bucket CIs cover ~90% of the time.

    200 samples of 2,000 rows, all 6 groups: one group's coverage is a binomial
    proportion with standard deviation sqrt(0.9 * 0.1 / 200) = 0.021, so a correct
    method lands in [0.80, 0.97] per group and, pooled over the groups, in [0.85, 0.94]
    (percentile intervals run slightly short of nominal at this n). Intervals half as
    wide as they should be cover ~60%, twice as wide ~99.9%: both fail.
    """
    rng = np.random.default_rng(2)
    truth_num, truth_den = _data(400_000, 99)
    truth = truth_num.sum(0) / truth_den.sum(0)
    trials = 200
    covered = np.zeros(len(truth))
    for _ in range(trials):
        idx = rng.integers(0, 400_000, 2000)
        num, den = truth_num[idx], truth_den[idx]
        buckets = boot.assign_buckets(2000, 128, rng)
        reps = bucket_bootstrap_ratios(num, den, buckets, boot.resample_counts(len(buckets), 400, rng))
        lo, hi = percentile_interval(reps, 0.90)
        covered += (lo <= truth) & (truth <= hi)
    coverage = covered / trials
    assert ((0.80 <= coverage) & (coverage <= 0.97)).all(), coverage
    assert 0.85 <= coverage.mean() <= 0.94, coverage


def test_small_samples_are_the_row_bootstrap_exactly():
    rng = np.random.default_rng(0)
    buckets = boot.assign_buckets(50, 128, rng)
    assert len(buckets) == 50 and all(len(b) == 1 for b in buckets)


def test_encrypted_bootstrap_equals_its_plaintext_twin():
    """The HE aggregation computes exactly the plaintext bucket bootstrap (same buckets, counts)."""
    from common.crypto import encoding, paillier
    from common.crypto.masking import masked_ratio
    from tester_service import aggregation

    key = paillier.generate_keypair(1024, allow_insecure=True)
    pub, slot = key.public, encoding.SlotLayout(200, 2)
    rng = np.random.default_rng(8)
    n = 60
    p = rng.dirichlet(np.ones(3), n)
    f = rng.integers(0, 2, n)
    d = np.maximum(f, rng.integers(0, 2, n))
    q = encoding.quantize_probabilities(p)
    cts = paillier.encrypt_chunk(pub.n, pub.h, [int(a) + (int(b) << 200) for a, b in zip(f, d)])
    buckets = boot.assign_buckets(n, 8, rng)
    counts = boot.resample_counts(len(buckets), 30, rng)
    sums = aggregation.bucket_sums_chunk(
        pub.n, [([cts[i] for i in idx], [q[idx, j].tolist() for j in range(3)]) for idx in buckets])
    from common.crypto.masking import RatioMask
    masks = [[(m.r, m.e_num + (m.e_den << 200)) for m in (RatioMask.draw() for _ in range(3))] for _ in counts]
    reps = aggregation.replicate_chunk(pub.n, [[s[j] for s in sums] for j in range(3)], counts.tolist())
    out = aggregation.mask_chunk(pub.n, pub.h, reps, [m for row in masks for m in row], None)
    he = np.array([masked_ratio(*slot.unpack(encoding.decode_signed(m, key.p)))
                   for m in key.decrypt_mod_p(out)]).reshape(len(counts), 3)
    qf = q / 2**32
    plain = bucket_bootstrap_ratios(qf * f[:, None], qf * d[:, None], buckets, counts)
    # the ratio mask's noise (below r: one fixed-point unit of 2^-32) is all that differs
    assert np.allclose(he, plain, rtol=0, atol=1e-9, equal_nan=True)


def test_percentile_interval_ignores_undefined_replicates():
    reps = np.array([[1.0, np.nan], [2.0, np.nan], [3.0, np.nan]])
    lo, hi = percentile_interval(reps, 0.5)
    assert lo[0] == 1.5 and hi[0] == 2.5 and np.isnan(lo[1]) and np.isnan(hi[1])
    assert lo.dtype == hi.dtype == np.float64


def test_ratio_of_a_zero_denominator_is_undefined():
    """A replicate whose Den is zero has no ratio (NaN), never Num itself."""
    r = ratios(np.array([[3.0, 2.0, 0.0]]), np.array([[0.0, 1.0, 4.0]]))
    assert np.isnan(r[0, 0]) and r[0, 1] == 2.0 and r[0, 2] == 0.0


def test_replicate_chunk_equals_one_multi_exponentiation_per_replicate():
    """`aggregation.replicate_chunk` shares work across the replicates of a chunk: every
    output equals the plain multi-exponentiation of its counts, for random counts, all
    zeros, and counts of 2^16 and above."""
    import secrets as _secrets

    from common.crypto import paillier
    from tester_service.aggregation import replicate_chunk
    n = (2 ** 127 - 1) * (2 ** 89 - 1)
    n2 = n * n
    rng = np.random.default_rng(3)
    for m, rows in ((1, 3), (5, 40), (23, 70), (64, 9)):
        columns = [[_secrets.randbelow(n2 - 2) + 2 for _ in range(m)] for _ in range(3)]
        counts = rng.integers(0, 6, size=(rows, m))
        counts[0] = 0
        counts[-1] = rng.integers(2 ** 16, 2 ** 20, size=m)
        out = replicate_chunk(n, columns, counts.tolist())
        expected = [paillier.multi_exp(col, list(r), n2) for r in counts.tolist() for col in columns]
        assert out == expected
