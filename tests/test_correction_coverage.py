"""Coverage of the attenuation correction's bootstrap intervals (`common.stats.correction`) on
realistic synthetic members, in plaintext.

Data: ``ppre synth --mode calibrated`` (`ppre.synth.SynthConfig(mode="calibrated")`):
real surname frequencies and ZCTAs, each member's true race redrawn from the BISG
posterior of their surname and ZCTA, so the BISG probabilities are calibrated by
construction (the correction's assumption A1) and the ERO outcome depends on the true
race only (A2). The Tester's probabilities are `tester_service.demographics.bisg.bisg` on the members'
surnames and ZIPs, as `tester_service.demographics.preparation.prepare` computes them, but WITHOUT
the Self-ID rows and WITHOUT clipping: the privatised one-hot Self-ID rows and the
clipped rows are no longer calibrated (a clipped row's top race is more likely than its
probability says; a randomised-response row's reported race is the true one with
probability e^ε/(e^ε+k−1), not its 0/1 entry), so they would test the preparation's
effect (`bench/bench_correction.py` measures that), not the correction's intervals.

The bootstrap is the protocol's (`tester_service.protocol.TesterSession._aggregate`):
the rows in a canonical order (by probability vector), `common.stats.bootstrap.assign_buckets`
into `DEFAULT_BUCKETS` buckets, `resample_counts` for B replicates, each replicate's
sums the count-weighted bucket sums (one (B+1 × buckets) @ (buckets × items) product,
row 0 the full sample). The two estimators share every sum and differ only in the last
step: the weighted estimate is ``Num_b / Den_b``; the corrected one is what both parties'
finish computes, `common.stats.correction.CorrectionPlan.values` (``M_b⁻¹·Num_b`` by
`correction.solve`, groups below `MIN_IDENTIFYING_SIZE` held at their weighted value and
withheld). Intervals: `common.stats.intervals.marginal_intervals(..., "percentile")`.

The target is the true-race FPR of the same members (Σ f / Σ d over the members of race
r, from the hidden truth). Over 50 seeds (a fresh population and a fresh bootstrap each)
the corrected 95% intervals must cover it in at least 90% of the (seed, identifiable
group) cases, while the weighted estimator, attenuated towards the other groups' rates,
covers it clearly less often. ``pytest -s`` prints the per-group table.
"""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from common.stats import bootstrap as boot
from common.stats import correction
from common.races import RACES
from common.stats.intervals import marginal_intervals
from ppre.synth import SynthConfig, synthesize
from tester_service.demographics import bisg

K = len(RACES)
N_MEMBERS = 30_000
SEEDS = range(50)
REPLICATES = 400
CONFIDENCE = 0.95
DISPARITY = {"black": 0.08}
#: the groups that must be identifiable at N_MEMBERS in every seed (aian is too, with a
#: smaller margin; multiple never is at this size)
MUST_BE_IDENTIFIABLE = ("white", "black", "hispanic", "api")
#: pooled coverage bars: the corrected intervals' (nominal 95%) and the weighted one's
#: ceiling. Measured (2026-11-27, these settings): corrected 0.992 of the 250 (seed,
#: group) cases (1.00 for white, black, api, hispanic, 0.96 for aian: conservative, as
#: the bootstrap sees the variance around the model's rate, part of which the members'
#: realised rate shares with the estimate; 0.928 of the model's rate); weighted 0.616
#: (black 0.00, white 0.28, aian 0.80, api and hispanic 1.00). Per-seed coverage is
#: nearly deterministic for every group but white and aian, so 0.70 is ~5 sd away.
#: The table the test prints (``pytest -s``) has the rest.
MIN_CORRECTED_COVERAGE = 0.90
MAX_WEIGHTED_COVERAGE = 0.70

#: the rates the synthetic members are drawn with (`SynthConfig` base_fpr + disparity)
MODEL_FPR = np.array([SynthConfig(members=1).base_fpr + DISPARITY.get(g, 0.0) for g in RACES])

_PAIRS = correction.pairs(K)
#: the plan the finish reads: item j holds group j's (Num, Den), item K + p holds M's
#: pair p in its denominator slot (`correction.extend`'s layout, one family)
_FAMILY = correction.Family(cells=tuple(range(K)), pair_items=tuple(range(K, K + len(_PAIRS))),
                            num_slot=0, den_slot=1, scale_shift=0)
_PLAN = correction.CorrectionPlan(groups=tuple(RACES), families=(_FAMILY,), first_item=K)
_CELLS = [SimpleNamespace(item=j) for j in range(K)]
_N_ITEMS = K + len(_PAIRS)


def replicate_sums(p: np.ndarray, f: np.ndarray, d: np.ndarray, replicates: int,
                   rng: np.random.Generator) -> np.ndarray:
    """(replicates + 1, 2K + pairs) sums [Num | Den | M's upper triangle]: row 0 the full
    sample, then the bucket bootstrap's replicates (the protocol's resampling plan)."""
    canonical = np.lexsort(p.T[::-1])  # by probability vector, first column first
    p, f, d = p[canonical], f[canonical], d[canonical]
    items = np.hstack([p * f[:, None], p * d[:, None]]
                      + [(p[:, j] * p[:, r] * d)[:, None] for j, r in _PAIRS])
    buckets = boot.assign_buckets(len(p), boot.DEFAULT_BUCKETS, rng)
    bucket_sums = np.stack([items[idx].sum(axis=0) for idx in buckets])
    counts = boot.resample_counts(len(buckets), replicates, rng)
    draws = np.vstack([np.ones((1, len(buckets))), counts])
    return draws @ bucket_sums


def weighted_values(sums: np.ndarray) -> np.ndarray:
    """The paper's weighted estimator per replicate: Num_b / Den_b."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return sums[:, :K] / sums[:, K:2 * K]


def corrected_values(sums: np.ndarray, hidden: list[str]) -> np.ndarray:
    """The corrected values per replicate, by the parties' finish (`CorrectionPlan.values`)."""
    slots = np.zeros((sums.shape[0], _N_ITEMS, 2))
    slots[:, :K, 0] = sums[:, :K]
    slots[:, :K, 1] = sums[:, K:2 * K]
    slots[:, K:, 1] = sums[:, 2 * K:]
    values, _ = _PLAN.values(slots.reshape(-1, 2), _CELLS, _N_ITEMS, hidden=hidden)
    return values


def true_rates(race: np.ndarray, f: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Σ f / Σ d over the members of each true race."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.bincount(race, weights=f, minlength=K) / np.bincount(race, weights=d, minlength=K)


def one_seed(seed: int, n: int = N_MEMBERS, replicates: int = REPLICATES) -> dict[str, np.ndarray]:
    """Estimates, intervals and the truth for one fresh population and bootstrap."""
    data = synthesize(SynthConfig(members=n, seed=seed, mode="calibrated", disparity=dict(DISPARITY)))
    members = data.members
    p = bisg.bisg(members["surname"], zips=members["zip"]).probabilities  # no Self-ID, no clipping
    ero = data.ero.set_index("member_id").loc[members["member_id"]]
    truth = data.truth.set_index("member_id").loc[members["member_id"], "race"]
    d = (ero["y_true"].to_numpy() == 0).astype(float)
    f = d * ero["y_pred"].to_numpy()
    race = np.array([RACES.index(r) for r in truth])

    identifiable = correction.identifying_sizes(correction.plain_matrix(p)) >= correction.MIN_IDENTIFYING_SIZE
    hidden = [g for g, ok in zip(RACES, identifiable) if not ok]
    sums = replicate_sums(p, f, d, replicates, np.random.default_rng([seed, 20261127]))
    out = {"truth": true_rates(race, f, d), "identifiable": identifiable}
    for name, values in (("weighted", weighted_values(sums)), ("corrected", corrected_values(sums, hidden))):
        low, high = marginal_intervals(values, CONFIDENCE, "percentile")
        out[name] = values[0]
        out[name + "_covers"] = (low <= out["truth"]) & (out["truth"] <= high)
        out[name + "_covers_model"] = (low <= MODEL_FPR) & (MODEL_FPR <= high)
        out[name + "_width"] = high - low
    return out


@pytest.mark.slow
def test_corrected_intervals_cover_the_true_race_rates_on_calibrated_bisg():
    start = time.perf_counter()
    runs = [one_seed(seed) for seed in SEEDS]
    ok = np.array([r["identifiable"] for r in runs])
    truth = np.array([r["truth"] for r in runs])
    get = lambda key: np.array([r[key] for r in runs])  # noqa: E731
    est = {e: get(e) for e in ("weighted", "corrected")}
    cov = {e: get(e + "_covers") for e in est}
    cov_model = {e: get(e + "_covers_model") for e in est}
    width = {e: get(e + "_width") for e in est}

    print(f"\n{N_MEMBERS} members (calibrated mode, BISG without Self-ID or clipping), {len(SEEDS)} seeds, "
          f"B = {REPLICATES}, {boot.DEFAULT_BUCKETS} buckets, {CONFIDENCE:.0%} percentile intervals "
          f"({time.perf_counter() - start:.0f} s). W = weighted, C = corrected; coverage of the members' "
          f"true-race FPR (and of the model's rate base_fpr + disparity)")
    print("| group | identifiable | true FPR | coverage W | coverage C | coverage W (model) | coverage C (model) "
          "| bias W | bias C | RMSE W | RMSE C | CI width W | CI width C |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for j, g in enumerate(RACES):
        rows = ok[:, j]
        if not rows.any():
            print(f"| {g} | 0/{len(SEEDS)} | {truth[:, j].mean():.4f} | withheld |" + " |" * 9)
            continue
        err = {e: est[e][rows, j] - truth[rows, j] for e in est}
        print(f"| {g} | {rows.sum()}/{len(SEEDS)} | {truth[rows, j].mean():.4f} "
              f"| {cov['weighted'][rows, j].mean():.2f} | {cov['corrected'][rows, j].mean():.2f} "
              f"| {cov_model['weighted'][rows, j].mean():.2f} | {cov_model['corrected'][rows, j].mean():.2f} "
              f"| {err['weighted'].mean():+.4f} | {err['corrected'].mean():+.4f} "
              f"| {np.sqrt((err['weighted'] ** 2).mean()):.4f} | {np.sqrt((err['corrected'] ** 2).mean()):.4f} "
              f"| {width['weighted'][rows, j].mean():.4f} | {width['corrected'][rows, j].mean():.4f} |")
    pooled = {e: cov[e][ok].mean() for e in cov}
    pooled_model = {e: cov_model[e][ok].mean() for e in cov}
    print(f"| pooled | {ok.sum()} cases | | {pooled['weighted']:.3f} | {pooled['corrected']:.3f} "
          f"| {pooled_model['weighted']:.3f} | {pooled_model['corrected']:.3f} |" + " |" * 6)

    for g in MUST_BE_IDENTIFIABLE:
        assert ok[:, RACES.index(g)].all(), f"{g} was not identifiable in every seed at {N_MEMBERS} members"
    assert pooled["corrected"] >= MIN_CORRECTED_COVERAGE
    assert pooled["weighted"] < MAX_WEIGHTED_COVERAGE
    # the group with the injected disparity is where the attenuation shows most
    black = RACES.index("black")
    assert cov["corrected"][:, black].mean() >= MIN_CORRECTED_COVERAGE
    assert cov["weighted"][:, black].mean() <= 0.10
