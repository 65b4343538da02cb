"""Benchmark: ERO's intervals under the default release controls (second moments, `common.stats.moments`).

    .venv/bin/python bench/bench_intervals.py [--metric ero|output] [--sizes 10000,100000] [--datasets 400]
                                              [--bootstrap 1000] [--power 10000:0.05,100000:0.02] [--seed 1]

A plaintext twin of the release (`tester_service.release_items`, step 6 under the
default `ReleasePolicy`, correction on): per group the noised aggregates Num_j = Σ q_ij·f_i and
Den_j = Σ q_ij·d_i (q the quantised probabilities, 2^32 per row), "overall" their sum, and the
pair items Σ w_ab·f, Σ w_ab·d on the pair weights `common.stats.correction.pair_weights`, each slot with
Gaussian noise of the policy's σ₀ (group items) or σ_m (pair items) times 2^32 (a member's largest
contribution), the group items whose noised effective size Σ_i p_ij is below the minimum
suppressed; then the same finishing code as both parties (`common.stats.moments.finish_release`, with
the correction) and the real `common.stats.results.finish()`.

Data: the prepared BISG probabilities of `ppre synth` members (`bench_null.probability_pool`),
each dataset a fresh sample of n members, their true race drawn from their probability row (the
probabilities are calibrated), y_true ~ Bernoulli(0.3), a negative predicted positive with 0.1
(+ gap for black members). Counted per setting: the verdict's flag rate (significant) with its
Monte Carlo sd, and the rate at which the 95% simultaneous band of some gap between two groups
excludes 0 (the intervals' family-wise error, without the verdict's informative-group rules);
per group, the coverage of the weighted interval (of the weighted estimator's large-sample
value, from 2 million members) and of the corrected interval (of the true-race
rate), the median widths, and how often the corrected value was withheld; for the power rows,
the share of datasets whose verdict is significant with black in the compared difference.

`--metric output`: the output metric (common/metrics/output.py) on an outcome
y = clip(N(1.0 + gap·[race = black], 0.5), −1, 3), declared range −1:3. Its release
carries three components in fixed point (2^-24, the metric's own `components` and
`quantize`): f = y − c (c = 1, the range's centre), 1 and f², packed as with a 2048-bit key
(4 slots on one ciphertext: the group items' f² slot is released at σ_m, as the Tester's
`square_scales` does), noise `moment_sigmas(2, squares=1)` times each slot's sensitivity
(`Metric.slot_sensitivity`: the component's bound × 2^32); then `finish_release` with the
correction bounded to the range and `finish()` with the metric's parameters and tau 0.05
(the CLI's default; the output metric's tau is in the outcome's units). Truths: the
weighted estimator's large-sample value Σ_r E[p_j·p_r]·μ_r / E[p_j] and the true-race
means μ_r of the clipped normal.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402

from common.stats import bootstrap as boot  # noqa: E402
from common.stats import correction, moments  # noqa: E402
from common.crypto import encoding  # noqa: E402
from common.metrics.base import SECOND_MOMENTS, Item, Layout  # noqa: E402
from common.metrics.ero import METRIC as ERO  # noqa: E402
from common.metrics.output import METRIC as OUTPUT  # noqa: E402
from common.races import RACES  # noqa: E402
from common.stats.intervals import simultaneous_bands  # noqa: E402
from common.stats.left_out import MIN_EFFECTIVE_SIZE  # noqa: E402
from common.stats.results import finish  # noqa: E402
from tester_service.release import ReleasePolicy  # noqa: E402

POSITIVE_RATE, TPR, BASE_FPR = 0.30, 0.80, 0.10
SCALE = float(1 << encoding.PROBABILITY_BITS)
GROUPS = list(RACES)
K = len(GROUPS)
#: the output metric's setting: outcome mean and sd per member, the declared range, the key
OUTCOME_MEAN, OUTCOME_SD, OUTCOME_RANGE, MODULUS_BITS = 1.0, 0.5, (-1.0, 3.0), 2048
OUTPUT_PARAMS = {"outcome_range": OUTCOME_RANGE, "out_of_range": "clip", SECOND_MOMENTS: True}
TAU = 0.05
#: MQOS-NDCG's setting: each query's NDCG mean and sd, the parameters (K = 5, the default)
NDCG_MEAN, NDCG_SD = 0.9, 0.1
NDCG_PARAMS = {"max_queries_per_viewer": 5}


def pool_cached(size: int = 300_000) -> np.ndarray:
    cache = Path("/tmp/ppre-bench-pool.npy")
    if cache.exists():
        return np.load(cache)
    from bench_null import probability_pool
    pool = probability_pool(size)
    np.save(cache, pool)
    return pool


def draw(pool: np.ndarray, n: int, rng: np.random.Generator, gap: float):
    p = pool[rng.choice(len(pool), size=n, replace=False)]
    race = (np.cumsum(p, axis=1) <= rng.random(n)[:, None] * p.sum(axis=1)[:, None]).sum(axis=1)
    race = np.minimum(race, K - 1)
    y = rng.random(n) < POSITIVE_RATE
    fpr = BASE_FPR + gap * (race == GROUPS.index("black"))
    yhat = np.where(y, rng.random(n) < TPR, rng.random(n) < fpr)
    return p, (yhat & ~y).astype(np.int64), (~y).astype(np.int64)


def truths(pool: np.ndarray, gap: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(weighted estimator's large-sample values, true-race rates) per group."""
    rates = np.full(K, BASE_FPR)
    rates[GROUPS.index("black")] += gap
    big = pool[rng.choice(len(pool), size=2_000_000)]
    # E[p_j f] / E[p_j d] with f = d·Bernoulli(rate of the true race), race ~ p: Σ_r E[p_j p_r] rate_r / E[p_j]
    weighted = (big.T @ big @ rates) / big.sum(axis=0)
    return weighted, rates


def release(p, f, d, policy: ReleasePolicy, rng: np.random.Generator):
    """(plan, moments plan, decoded row, noise_sd, withheld items) as the Test-Client decodes them."""
    q = encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS)
    plan, pairs_plan = correction.extend(ERO.plan(GROUPS, (), Layout(64, 2, 2), "fpr", {}, {}), GROUPS)
    sigma0, sigma_m = policy.moment_sigmas(2)
    pw = np.column_stack(correction.pair_weights(q)).astype(np.float64)
    qf = q.astype(np.float64)
    group = np.column_stack([qf.T @ f, qf.T @ d])                      # (k, 2) exact (float64: ~1e-16 rel.)
    pair = np.column_stack([pw.T @ f, pw.T @ d])                        # (pairs, 2)
    sd0, sdm = sigma0 * SCALE, sigma_m * SCALE
    noisy_group = np.rint(group + rng.normal(0, sd0, group.shape)).astype(np.int64)
    noisy_pair = np.rint(pair + rng.normal(0, sdm, pair.shape)).astype(np.int64)
    overall = noisy_group.sum(axis=0)
    row = [list(map(int, r)) for r in noisy_group] + [list(map(int, overall))] + [list(map(int, r)) for r in noisy_pair]
    n_items = len(plan.items)
    per_item = [sd0] * K + [sd0 * math.sqrt(K)] + [sdm] * (n_items - K - 1)
    noise_sd = [s for s in per_item for _ in range(2)] + [0.0] * (2 * n_items)
    effective = p.sum(axis=0)
    measured = effective + rng.normal(0, policy.threshold_sigma(), K)
    withheld = [j for j in range(K) if not measured[j] >= policy.min_effective_size]
    # as the Tester decides under noise: by the noised sizes (below the minimum, or withheld)
    small = [g for j, g in enumerate(GROUPS) if not measured[j] >= MIN_EFFECTIVE_SIZE or j in withheld]
    return plan, pairs_plan, row, noise_sd, withheld, small


def one(pool, n, policy, bootstrap, rng, gap):
    p, f, d = draw(pool, n, rng, gap)
    plan, pairs_plan, row, noise_sd, withheld, small = release(p, f, d, policy, rng)
    values, corrected = moments.finish_release(plan, pairs_plan, row, noise_sd, bootstrap, withheld=withheld,
                                               correct=True, bounds=ERO.estimate_range)
    report = finish(ERO, plan, values, option="fpr", confidence=0.95, tau=0.05, params={}, info={},
                    replicates=bootstrap, small_groups=small, interval="percentile", corrected=corrected,
                    noisy=True)
    return report, band_flag(values, small)


def band_flag(values: np.ndarray, small) -> bool:
    """Whether the 95% simultaneous (max-|t|) band of some gap between two groups (of
    effective size >= MIN_EFFECTIVE_SIZE, estimate defined) excludes 0: the intervals'
    own family-wise error, without the verdict's further rules (informative groups, tau)."""
    cols = [j for j, g in enumerate(GROUPS) if g not in small and np.isfinite(values[0, j])]
    fam = np.column_stack([values[:, a] - values[:, b] for i, a in enumerate(cols) for b in cols[i + 1:]])
    low, high = simultaneous_bands(fam, 0.95, "percentile")
    return bool(np.any((low > 0) | (high < 0)))


# ------------------------------------------------------------------ the output metric
def clipped_normal_mean(mean: float, sd: float, lo: float, hi: float) -> float:
    """E[clip(X, lo, hi)] for X ~ N(mean, sd²)."""
    a, b = (lo - mean) / sd, (hi - mean) / sd
    cdf = lambda z: 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))  # noqa: E731
    pdf = lambda z: math.exp(-z * z / 2.0) / math.sqrt(2.0 * math.pi)  # noqa: E731
    return lo * cdf(a) + hi * (1.0 - cdf(b)) + mean * (cdf(b) - cdf(a)) + sd * (pdf(a) - pdf(b))


def draw_output(pool: np.ndarray, n: int, rng: np.random.Generator, gap: float):
    """(p, y): n members' probabilities and outcomes, their true race drawn as in `draw`."""
    p = pool[rng.choice(len(pool), size=n, replace=False)]
    race = (np.cumsum(p, axis=1) <= rng.random(n)[:, None] * p.sum(axis=1)[:, None]).sum(axis=1)
    race = np.minimum(race, K - 1)
    mean = OUTCOME_MEAN + gap * (race == GROUPS.index("black"))
    return p, np.clip(rng.normal(mean, OUTCOME_SD), *OUTCOME_RANGE)


def truths_output(pool: np.ndarray, gap: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(weighted estimator's large-sample values, true-race means) per group, as `truths`
    with d = 1: Σ_r E[p_j p_r]·μ_r / E[p_j], μ_r the clipped normal's mean."""
    means = np.full(K, clipped_normal_mean(OUTCOME_MEAN, OUTCOME_SD, *OUTCOME_RANGE))
    means[GROUPS.index("black")] = clipped_normal_mean(OUTCOME_MEAN + gap, OUTCOME_SD, *OUTCOME_RANGE)
    big = pool[rng.choice(len(pool), size=2_000_000)]
    return (big.T @ big @ means) / big.sum(axis=0), means


def moments_plan(metric, params: dict, info: dict, n: int):
    """(components, layout, plan, moments plan) of a second-moments release with a 2048-bit
    key (one ciphertext: f, d and, where the rows carry it, the square)."""
    comps = metric.components("default", params, info)
    layout = metric.layout("default", params, info, n_rows=n, n_units=n, recipient="client",
                           modulus_bits=MODULUS_BITS)
    assert layout.n_ciphertexts == 1 and layout.slots >= len(comps), layout
    plan = metric.plan(GROUPS, (), layout, "default", params, info)
    plan, pairs_plan = correction.extend(plan, GROUPS, **metric.moment_shape("default", params, info, layout))
    return comps, layout, plan, pairs_plan


def release_output(p, y, policy: ReleasePolicy, rng: np.random.Generator):
    """The output metric's release: the rows (f, 1, f²), f = y − c (the range's centre)."""
    centre = (OUTCOME_RANGE[0] + OUTCOME_RANGE[1]) / 2.0
    return release_moments(OUTPUT, OUTPUT_PARAMS, {}, p, (y - centre, np.ones_like(y), (y - centre) ** 2),
                           policy, rng)


def release_moments(metric, params: dict, info: dict, p, columns, policy: ReleasePolicy,
                    rng: np.random.Generator):
    """As `release`, for a metric with real-valued components: group items (f, d and the
    square where the rows carry one) with σ₀ on f and d and σ_m on the square
    (`tester_service.release_items.square_scales`), overall their sum, pair items with σ_m on every slot;
    each slot's sd the multiplier times its sensitivity (bound × 2^32)."""
    n = len(columns[0])
    comps, layout, plan, pairs_plan = moments_plan(metric, params, info, n)
    values = np.column_stack([c.quantize(v) for c, v in zip(comps, columns)]).astype(np.float64)
    values = np.hstack([values, np.zeros((n, layout.slots - len(comps)))])
    q = encoding.quantize_probabilities(p, encoding.PROBABILITY_BITS)
    pw = np.column_stack(correction.pair_weights(q)).astype(np.float64)
    group = q.astype(np.float64).T @ values                             # (k, 4); float64 ~1e-16 rel.
    pair = pw.T @ values                                                # (pairs, 4)
    sigma0, sigma_m = policy.moment_sigmas(metric.sensitivity_components("default", params, info),
                                           squares=metric.moment_components("default", params))
    sens = np.array(metric.slot_sensitivity(Item(0, 0), layout, comps, 1), dtype=np.float64)
    first_square = len(comps) - metric.moment_components("default", params)
    group_sd = np.where(np.arange(layout.slots) >= first_square, sigma_m, sigma0) * sens
    pair_sd = sigma_m * sens
    # the sums pass 2^63 (q·f² ~ 2^58 per row): Python ints, from float64 (ulp ≪ the noise's sd)
    noisy_group = [[int(x) for x in r] for r in np.rint(group + rng.normal(0, 1, group.shape) * group_sd)]
    noisy_pair = [[int(x) for x in r] for r in np.rint(pair + rng.normal(0, 1, pair.shape) * pair_sd)]
    overall = [sum(r[s] for r in noisy_group) for s in range(layout.slots)]
    row = noisy_group + [overall] + noisy_pair
    per_item = [group_sd] * K + [group_sd * math.sqrt(K)] + [pair_sd] * len(pair)
    noise_sd = [float(x) for sd in per_item for x in sd]
    noise_sd += [0.0] * len(noise_sd)
    withheld, small = suppression(p, policy, rng)
    return plan, pairs_plan, row, noise_sd, withheld, small


def suppression(p, policy: ReleasePolicy, rng: np.random.Generator):
    """(withheld items, small groups) decided on the noised effective sizes, as in `release`."""
    measured = p.sum(axis=0) + rng.normal(0, policy.threshold_sigma(), K)
    withheld = [j for j in range(K) if not measured[j] >= policy.min_effective_size]
    small = [g for j, g in enumerate(GROUPS) if not measured[j] >= MIN_EFFECTIVE_SIZE or j in withheld]
    return withheld, small


def one_output(pool, n, policy, bootstrap, rng, gap):
    p, y = draw_output(pool, n, rng, gap)
    plan, pairs_plan, row, noise_sd, withheld, small = release_output(p, y, policy, rng)
    values, corrected = moments.finish_release(plan, pairs_plan, row, noise_sd, bootstrap, withheld=withheld,
                                               correct=True, bounds=OUTCOME_RANGE)
    report = finish(OUTPUT, plan, values, option="default", confidence=0.95, tau=TAU, params=OUTPUT_PARAMS,
                    info={"rows_clipped": int(np.sum((y <= OUTCOME_RANGE[0]) | (y >= OUTCOME_RANGE[1])))},
                    replicates=bootstrap, small_groups=small, interval="percentile", corrected=corrected,
                    noisy=True)
    return report, band_flag(values, small)


def draw_ndcg(pool: np.ndarray, n: int, rng: np.random.Generator, gap: float):
    """(p, f, d): n viewers' probabilities, NDCG sums around ½ and query counts (1 or 2, as
    in `bench_null_groups`), each query's NDCG ~ Beta with mean `NDCG_MEAN` (− gap for
    black viewers, their true race drawn as in `draw`) and sd about `NDCG_SD`."""
    p = pool[rng.choice(len(pool), size=n, replace=False)]
    race = (np.cumsum(p, axis=1) <= rng.random(n)[:, None] * p.sum(axis=1)[:, None]).sum(axis=1)
    race = np.minimum(race, K - 1)
    mean = NDCG_MEAN - gap * (race == GROUPS.index("black"))
    d = 1 + (rng.random(n) < 0.5)
    strength = mean * (1 - mean) / NDCG_SD ** 2 - 1
    ndcg = rng.beta(np.repeat(mean * strength, 2).reshape(n, 2), np.repeat((1 - mean) * strength, 2).reshape(n, 2))
    f = np.where(d == 2, ndcg.sum(axis=1), ndcg[:, 0]) - 0.5 * d
    return p, f, d.astype(np.float64)


def truths_ndcg(pool: np.ndarray, gap: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """As `truths_output` (d is independent of race, so the query weighting drops out)."""
    means = np.full(K, NDCG_MEAN)
    means[GROUPS.index("black")] = NDCG_MEAN - gap
    big = pool[rng.choice(len(pool), size=2_000_000)]
    return (big.T @ big @ means) / big.sum(axis=0), means


def one_ndcg(pool, n, policy, bootstrap, rng, gap):
    from common.metrics.mqos_ndcg import METRIC as NDCG, spread_facts
    p, f, d = draw_ndcg(pool, n, rng, gap)
    info = {"queries": int(d.sum()), "viewers": n, "zero_idcg_queries": 0, "queries_dropped": 0, "viewers_capped": 0,
            **spread_facts(f, d)}
    plan, pairs_plan, row, noise_sd, withheld, small = release_moments(NDCG, NDCG_PARAMS, info, p, (f, d),
                                                                       policy, rng)
    values, corrected = moments.finish_release(plan, pairs_plan, row, noise_sd, bootstrap, withheld=withheld,
                                               correct=True, bounds=(0.0, 1.0))
    report = finish(NDCG, plan, values, option="default", confidence=0.95, tau=TAU, params=NDCG_PARAMS,
                    info=info, replicates=bootstrap, small_groups=small, interval="percentile",
                    corrected=corrected, noisy=True)
    return report, band_flag(values, small)


# ------------------------------------------------------------------ LOT
#: LOT's setting: ranks per query, each query's relevances Ỹ ~ N(LOT_MEAN, LOT_SD) clipped to
#: [0, 1] (hsm members' raised by the gap), the hsm/non_hsm split of the races
LOT_RANKS, LOT_MEAN, LOT_SD = 10, 0.3, 0.1
HSM = [GROUPS.index(g) for g in ("black", "hispanic", "aian")]
LOT_GROUPS = ["hsm", "non_hsm"]


def draw_lot(pool: np.ndarray, n: int, rng: np.random.Generator, gap: float):
    """n members in n/10 queries of 10 ranks (each member once), their hsm/non_hsm
    probabilities, true race drawn from them, relevance N(LOT_MEAN + gap·[hsm], LOT_SD)
    clipped to [0, 1]: (higher member's p, lower member's p, rank pair, ΔỸ) per row."""
    p = pool[rng.choice(len(pool), size=n, replace=n > len(pool))]
    hsm = p[:, HSM].sum(axis=1)
    two = np.column_stack([hsm, 1.0 - hsm])
    is_hsm = rng.random(n) < hsm
    y = np.clip(rng.normal(LOT_MEAN + gap * is_hsm, LOT_SD), 0.0, 1.0).reshape(-1, LOT_RANKS)
    probs = two.reshape(-1, LOT_RANKS, 2)
    delta = (y[:, :-1] - y[:, 1:]).ravel()
    stratum = np.tile(np.arange(LOT_RANKS - 1), len(y))
    return probs[:, :-1].reshape(-1, 2), probs[:, 1:].reshape(-1, 2), stratum, delta


def truths_lot(pool: np.ndarray, gap: float, rng: np.random.Generator) -> dict:
    """Each cell's large-sample value Σ w·ΔỸ / Σ w (2 million members), by label."""
    pa, pb, stratum, delta = draw_lot(pool, 2_000_000, rng, gap)
    out = {}
    for a, b in ((0, 1), (1, 0)):
        w = pa[:, a] * pb[:, b]
        label = f"{LOT_GROUPS[a]}>{LOT_GROUPS[b]}"
        out[label] = float((w * delta).sum() / w.sum())
        for s in range(LOT_RANKS - 1):
            rows = stratum == s
            out[f"{label}@{s + 1}-{s + 2}"] = float((w[rows] * delta[rows]).sum() / w[rows].sum())
    return out


def release_lot(pa, pb, stratum, delta, policy: ReleasePolicy, rng: np.random.Generator):
    """LOT's release of second moments (`Lot.moment_plan`): per item (cells per rank pair,
    pooled cells as their sums, pair items per rank pair) Σ W·v in the slots' units (a cell's
    weight at 2^64, a component at 2^32), each slot noised with the policy's σ₀ or σ_m times
    its sensitivity (`Metric.slot_sensitivity`, with the Tester's row count m: each member is
    in at most two rows, of two rank pairs, so m = √2)."""
    from common.metrics.base import sensitivity_rows
    from common.metrics.lot import METRIC as LOT, SPREAD_INFO, gap_spreads
    labels = [f"{s + 1}-{s + 2}" for s in range(LOT_RANKS - 1)]
    info = {SPREAD_INFO: gap_spreads(delta, stratum, len(labels))}
    comps = LOT.components("idcg", {}, info)
    layout = Layout(160, 4, len(comps))
    plan = LOT.plan(LOT_GROUPS, labels, layout, "idcg", {}, info)
    plan, pairs_plan = LOT.moment_plan(plan, LOT_GROUPS, "idcg", {}, info, layout)
    cells = [pa[:, a] * pb[:, b] for a, b in ((0, 1), (1, 0))]
    pair_cells = [cells[a] * cells[b] for a, b in correction.pairs(2)]
    unit = float(1 << 96)
    members = np.arange(len(delta)) + np.arange(len(delta)) // (LOT_RANKS - 1)
    m = sensitivity_rows(np.column_stack([members, members + 1]), stratum)
    sigma0, sigma_m = policy.moment_sigmas(LOT.sensitivity_components("idcg", {}, info))
    sens = np.array(LOT.slot_sensitivity(Item(0, 0), layout, comps, m), dtype=np.float64)
    row, noise_sd, base = [], [], pairs_plan.first_item
    for i, item in enumerate(plan.items):
        w = cells[item.weight] if i < base else pair_cells[item.weight - len(cells)]
        rows = slice(None) if item.stratum is None else stratum == item.stratum
        exact = np.array([(w[rows] * delta[rows]).sum(), w[rows].sum(), 0.0, 0.0]) * unit
        if item.stratum is None:  # pooled: the Tester's product of its rank pairs' noised items
            row.append(None)
            noise_sd.append(sens * sigma0 * math.sqrt(len(labels)))
            continue
        sd = sens * (sigma0 if i < base else sigma_m)
        row.append([int(x) for x in np.rint(exact + rng.normal(0, 1, 4) * sd)])
        noise_sd.append(sd)
    for i, item in enumerate(plan.items):
        if row[i] is None:
            parts = [j for j, it in enumerate(plan.items[:base]) if it.weight == item.weight and it.stratum is not None]
            row[i] = [sum(row[j][s] for j in parts) for s in range(4)]
    sds = [float(x) for sd in noise_sd for x in sd]
    return plan, pairs_plan, row, sds + [0.0] * len(sds), info


def one_lot(pool, n, policy, bootstrap, rng, gap):
    from common.metrics.lot import METRIC as LOT
    pa, pb, stratum, delta = draw_lot(pool, n, rng, gap)
    plan, pairs_plan, row, noise_sd, info = release_lot(pa, pb, stratum, delta, policy, rng)
    values, _ = moments.finish_release(plan, pairs_plan, row, noise_sd, bootstrap)
    report = finish(LOT, plan, values, option="idcg", confidence=0.95, tau=TAU, params={}, info=info,
                    replicates=bootstrap, small_groups=[], interval="percentile", noisy=True)
    low, high = simultaneous_bands(values, 0.95, "percentile")  # every cell at once, both sides
    return report, bool(np.any((low > 0) | (high < 0)))


def run_lot(pool, n, datasets, bootstrap, seed, gap, policy) -> dict:
    """Flag rate (a cell significantly below 0; under the null every cell's value is 0),
    the rate at which the simultaneous band of some cell excludes its value 0 (null only:
    the band's two-sided family-wise error), and per cell the coverage of its large-sample
    value and the median width."""
    rng = np.random.default_rng([seed, n, int(round(gap * 1e6)), 7])
    truth = truths_lot(pool, gap, rng)
    flags, bands, covered, widths = 0, 0, {k: 0 for k in truth}, {k: [] for k in truth}
    for _ in range(datasets):
        rep, band = one_lot(pool, n, policy, bootstrap, rng, gap)
        flags += bool(rep.verdict.significant)
        bands += band
        for c in rep.cells:
            label = f"{c.higher}>{c.lower}" + (f"@{c.rank_pair}" if c.rank_pair else "")
            if c.ci_low is not None and c.ci_high is not None:
                covered[label] += c.ci_low <= truth[label] <= c.ci_high
                widths[label].append(c.ci_high - c.ci_low)
    return {"flag": flags / datasets, "band": bands / datasets, "truth": truth,
            "coverage": {k: covered[k] / max(len(widths[k]), 1) for k in truth},
            "width": {k: float(np.median(w)) if w else float("nan") for k, w in widths.items()}}


def main_lot(args, policy, pool, settings) -> int:
    lines = ["| members | gap (hsm relevance) | datasets | verdict flagged | MC sd | band excludes 0 "
             "| coverage: pooled (2 cells) | coverage: rank-pair cells (min–max) | median width: pooled "
             "| median width: rank pairs (min–max) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for n, gap in settings:
        t = time.time()
        s = run_lot(pool, n, args.datasets, args.bootstrap, args.seed, gap, policy)
        sd = math.sqrt(max(s["flag"] * (1 - s["flag"]), 1e-12) / args.datasets)
        pooled = [k for k in s["truth"] if "@" not in k]
        ranks = [k for k in s["truth"] if "@" in k]
        cov_r = [s["coverage"][k] for k in ranks]
        wid_r = [s["width"][k] for k in ranks]
        cov_p = " / ".join(f"{s['coverage'][k]:.2f}" for k in pooled)
        wid_p = " / ".join(f"{s['width'][k]:.4f}" for k in pooled)
        band = f"{s['band']:.1%}" if gap == 0 else "—"
        lines.append(f"| {n:,} | {gap:g} | {args.datasets} | {s['flag']:.1%} | {sd:.1%} | {band} | {cov_p} "
                     f"| {min(cov_r):.2f}–{max(cov_r):.2f} | {wid_p} | {min(wid_r):.4f}–{max(wid_r):.4f} |")
        print(lines[-1], f"({time.time() - t:.0f} s)", flush=True)
    print("\n".join(lines))
    return 0


#: per metric: (truths, one dataset's report and band flag)
SETTINGS = {"ero": (truths, one),
            "output": (truths_output, one_output),
            "mqos-ndcg": (truths_ndcg, one_ndcg)}


def run(pool, n, datasets, bootstrap, seed, gap, policy, metric="ero"):
    rng = np.random.default_rng([seed, n, int(round(gap * 1e6))])
    truth_of, one_of = SETTINGS[metric]
    weighted_truth, rates = truth_of(pool, gap, rng)
    flags = black = bands = 0
    cov = {k: np.zeros(K) for k in ("w", "c")}
    seen = {k: np.zeros(K) for k in ("w", "c")}
    widths = {k: [[] for _ in range(K)] for k in ("w", "c")}
    withheld = np.zeros(K)
    for _ in range(datasets):
        rep, band = one_of(pool, n, policy, bootstrap, rng, gap)
        bands += band
        v = rep.verdict
        flags += bool(v.significant)
        black += bool(v.significant) and "black" in (v.compared or {}).get("label", "").split(" - ")
        for j, g in enumerate(GROUPS):
            e = rep.group(g)
            for key, lo, hi, truth in (("w", e.ci_low, e.ci_high, weighted_truth[j]),
                                       ("c", e.corrected_ci_low, e.corrected_ci_high, rates[j])):
                if lo is None or hi is None:
                    continue
                seen[key][j] += 1
                cov[key][j] += lo <= truth <= hi
                widths[key][j].append(hi - lo)
            withheld[j] += e.corrected_estimate is None
    return {"flag": flags / datasets, "black": black / datasets, "band": bands / datasets,
            "coverage": {k: cov[k] / np.maximum(seen[k], 1) for k in cov}, "seen": {k: seen[k] > 0 for k in seen},
            "width": {k: [float(np.median(w)) if w else float("nan") for w in widths[k]] for k in widths},
            "withheld": withheld / datasets}


def main(argv=None) -> int:
    import argparse
    from bench_null import simulation_arguments
    pick = argparse.ArgumentParser(add_help=False)
    pick.add_argument("--metric", choices=sorted(SETTINGS) + ["lot"], default="ero")
    args = chosen = simulation_arguments(__doc__, argv, parents=[pick])
    policy = ReleasePolicy()
    pool = pool_cached()
    settings = [(int(s), 0.0) for s in args.sizes.split(",") if s]
    settings += [(int(s), float(g)) for s, g in (x.split(":") for x in args.power.split(",") if x)]
    if chosen.metric == "lot":
        return main_lot(args, policy, pool, settings)
    head = " | ".join(GROUPS)
    lines = [f"| members | gap | datasets | verdict flagged | MC sd | black detected | band excludes 0 | kind "
             f"| coverage ({head}) | median width ({head}) | corrected withheld |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for n, gap in settings:
        t = time.time()
        s = run(pool, n, args.datasets, args.bootstrap, args.seed, gap, policy, chosen.metric)
        sd = math.sqrt(max(s["flag"] * (1 - s["flag"]), 1e-12) / args.datasets)
        for key, name in (("w", "weighted"), ("c", "corrected")):
            cov = " / ".join(f"{x:.2f}" if shown else "—" for x, shown in zip(s["coverage"][key], s["seen"][key]))
            wid = " / ".join(f"{x:.3f}" if math.isfinite(x) else "—" for x in s["width"][key])
            held = " / ".join(f"{x:.0%}" for x in s["withheld"]) if key == "c" else ""
            lines.append(f"| {n:,} | {gap:g} | {args.datasets} | {s['flag']:.1%} | {sd:.1%} | {s['black']:.1%} "
                         f"| {s['band']:.1%} | {name} | {cov} | {wid} | {held} |")
        print("\n".join(lines[-2:]), f"({time.time() - t:.0f} s)", flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
