"""The release twin in `bench/bench_random_groups.py` (POT's and MQOS-AUC exact's second
moments under the default release controls, and their random-group forms): its released form
is the metric's, its noise the Tester's per slot, and at zero noise its report is the real
sessions' report."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_random_groups as bench  # noqa: E402
from common.crypto import encoding  # noqa: E402
from common.metrics.mqos_auc import EXACT, normaliser_bits, released_form  # noqa: E402
from common.stats.correction import pair_weights, pairs  # noqa: E402
from common.metrics.scoring import dense_score_rank  # noqa: E402
from tester_service.release import RELEASE_GROUPS, ReleasePolicy  # noqa: E402


def probabilities(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).dirichlet(np.full(bench.K, 0.4), size=n)


def test_auc_twin_form_is_the_metrics_released_form():
    """The twin's float64 (V, D) per replicate and cell, at the form's fixed point, equal
    `mqos_auc.released_form`'s exact integers (estimate and every random group)."""
    n = 400
    rng = np.random.default_rng(3)
    q = encoding.quantize_probabilities(probabilities(n, 3))
    frame = bench.auc_frame(n, rng)
    y, rank = frame["y_true"].to_numpy(), dense_score_rank(frame["score"].to_numpy())
    units = rng.permutation(n) % EXACT.random_groups
    q_ext = np.hstack([q, np.full((n, 1), 1 << encoding.PROBABILITY_BITS, dtype=np.int64)])
    twin = bench.auc_form(q_ext, y, rank, units) * 2.0 ** (33 + normaliser_bits(n))
    exact = np.array(released_form(q, y, rank, units), dtype=np.float64)
    assert twin.shape == exact.shape == (EXACT.random_groups + 1, bench.K + 1, 2)
    assert twin == pytest.approx(exact, rel=1e-9)


def test_pot_twin_noise_is_the_testers_per_slot():
    """POT: every slot's noise sd is the policy's σ₀ (estimate) or σ_b (random groups)
    times the slot's sensitivity, "overall" √k times a group's."""
    n = 2000
    rng = np.random.default_rng(4)
    policy = ReleasePolicy()
    audit = bench.pot_audit(probabilities(n, 4), bench.pot_frame(n, rng), policy, rng, rng)
    sd = np.array(audit.noise_sd).reshape(2, bench.K + 1, -1)
    s0, sb = policy.sigmas(bench.POT.sensitivity_components("default", {}, audit.report.info))
    live = sd[0] > 0
    assert live.any() and np.all((sd[1] > 0) == live)
    assert sd[1][live] / sd[0][live] == pytest.approx(sb / s0)
    assert sd[0, bench.K] == pytest.approx(sd[0, 0] * math.sqrt(bench.K))
    assert audit.values.shape[0] == RELEASE_GROUPS + 1 and audit.report.interval == "random_groups"


def test_pot_moments_twin_noise_is_the_testers_per_slot():
    """POT's second-moments form: group items carry σ₀ and pair items σ_m of
    `moment_sigmas` times the slot's sensitivity, "overall" √k times a group's; the
    header's second half (no random groups) is 0."""
    n = 2000
    rng = np.random.default_rng(5)
    policy = ReleasePolicy()
    audit = bench.pot_moment_audit(probabilities(n, 5), bench.pot_frame(n, rng), policy, rng, rng)
    slots = len(audit.noise_sd) // 2 // len(audit.plan.items)
    sd = np.array(audit.noise_sd).reshape(2, len(audit.plan.items), slots)
    s0, sm = policy.moment_sigmas(bench.POT.sensitivity_components("default", {}, audit.report.info))
    assert not sd[1].any() and sm > s0 > 0
    group = [i for i, item in enumerate(audit.plan.items) if item.weight < bench.K]
    overall = [i for i, item in enumerate(audit.plan.items) if item.weight == bench.K]
    pair = [i for i, item in enumerate(audit.plan.items) if item.weight > bench.K]
    assert len(pair) == len(group) // bench.K * bench.K * (bench.K + 1) // 2
    live = sd[0, group[0]] > 0
    for i in pair:
        ct = audit.plan.items[i].ciphertext
        first = next(g for g in group if audit.plan.items[g].ciphertext == ct)
        assert sd[0, i][sd[0, first] > 0] / sd[0, first][sd[0, first] > 0] == pytest.approx(sm / s0)
    assert sd[0, overall[0]][live] == pytest.approx(sd[0, group[0]][live] * math.sqrt(bench.K))
    assert audit.values.shape[0] == bench.MOMENT_REPLICATES + 1 and audit.report.interval == "percentile"


def test_auc_moments_twin_slots_are_the_released_form():
    """MQOS-AUC's second-moments form: the cells' (V, D) are `released_form`'s integers of the
    full sample (`exact`), float64 within 1e-9 of them otherwise; per pair a ≤ b the slots are
    (S1, S0) = (Σ w_ab·y, Σ w_ab − S1) on the pair weights w_ab ≈ q_a·q_b/2^32."""
    n = 400
    rng = np.random.default_rng(6)
    q = encoding.quantize_probabilities(probabilities(n, 6))
    frame = bench.auc_frame(n, rng)
    y, rank = frame["y_true"].to_numpy(), dense_score_rank(frame["score"].to_numpy())
    exact = bench.auc_cell_slots(q, y, rank, exact=True)
    assert exact == [tuple(c) for c in released_form(q, y, rank, n_rows=n)[0]] and len(exact) == bench.K + 1
    assert np.array(bench.auc_cell_slots(q, y, rank, exact=False), dtype=float) == \
        pytest.approx(np.array(exact, dtype=float), rel=1e-9)
    slots = np.array(bench.auc_pair_slots(q, y), dtype=float)
    qf = q.astype(float)
    for p, (a, b) in enumerate(pairs(bench.K)):
        w = qf[:, a] * qf[:, b] / 2.0 ** 32
        assert slots[p, 0] == pytest.approx(w @ y, abs=n) and slots[p, 1] == pytest.approx(w @ (1 - y), abs=n)
    assert slots.sum(axis=1) == pytest.approx([float(c.sum()) for c in pair_weights(q)], abs=0)


def test_auc_moments_twin_noise_is_the_testers_per_slot(monkeypatch):
    """MQOS-AUC's second-moments form (today's): the cells' items carry σ₀ of
    `moment_sigmas(2, pair_components=1)` times `squares_sensitivity` (V ½, D 1 member at the
    form's fixed point), the 21 pair items σ_m times one member at 2^32 in both slots; the
    header's second half (no random groups) is 0; percentile intervals of the draws. The
    random-group forms are still `auc_audit`."""
    n = 2000
    rng = np.random.default_rng(7)
    policy = ReleasePolicy()
    p, frame = probabilities(n, 7), bench.auc_frame(n, rng)
    audit = bench.SETTINGS["mqos-auc"][1](p, frame, policy, rng, rng)
    items = audit.plan.items
    sd = np.array(audit.noise_sd).reshape(2, len(items), 2)
    s0, sm = policy.moment_sigmas(2, pair_components=1)
    scales = EXACT.squares_sensitivity({"facts": {"n": n}}, 1)
    assert not sd[1].any() and sm > s0 > 0
    assert len(items) == bench.K + 1 + len(pairs(bench.K))
    assert sd[0, :bench.K + 1] == pytest.approx(np.tile([s0 * scales[0], s0 * scales[1]], (bench.K + 1, 1)))
    assert sd[0, bench.K + 1:] == pytest.approx(np.full((len(pairs(bench.K)), 2), sm * 2.0 ** 32))
    assert audit.values.shape[0] == bench.MOMENT_REPLICATES + 1 and audit.report.interval == "percentile"
    monkeypatch.setattr(bench, "FORM", "separate")
    groups = bench.SETTINGS["mqos-auc"][1](p, frame, policy, rng, rng)
    assert groups.report.interval == "random_groups" and groups.values.shape[0] == EXACT.random_groups + 1


@pytest.mark.slow
def test_twin_matches_the_sessions_at_zero_noise():
    """One POT and one MQOS-AUC exact audit through the real sessions (Tester's draws set to
    0) report exactly what the twin reports at zero noise (both in the second-moments form:
    the parametric draws too, their seed a digest of the released slots), with the same
    noise sd per slot."""
    assert bench.check(1500) == 0


def test_shifted_auc_data_moves_only_true_black_members_scores(monkeypatch):
    """`--shift-black`: a member whose probabilities are one-hot black has every score moved
    on the latent scale (its negatives above the others'); the others' scores are unchanged
    in distribution, and each race keeps its own AUC."""
    from sklearn.metrics import roc_auc_score
    monkeypatch.setattr(bench, "SHIFT_BLACK", 1.0)
    n, black = 40_000, bench.GROUPS.index("black")
    p = np.zeros((n, bench.K))
    p[: n // 2, black] = 1.0
    p[n // 2:, bench.GROUPS.index("white")] = 1.0
    frame = bench.shifted_auc_frame(p, np.random.default_rng(4))
    latent = np.log(frame.score / (1.0 - frame.score)).to_numpy()
    y = frame.y_true.to_numpy().astype(bool)
    b, w = np.arange(n) < n // 2, np.arange(n) >= n // 2
    assert np.mean(latent[b & ~y]) - np.mean(latent[w & ~y]) == pytest.approx(1.0, abs=0.05)
    assert np.mean(latent[b & y]) - np.mean(latent[w & y]) == pytest.approx(1.0, abs=0.05)
    for rows in (b, w):
        assert roc_auc_score(y[rows], frame.score[rows]) == pytest.approx(bench.AUC, abs=0.01)


def test_dti_calibration_band_is_the_verdicts_band():
    """`pot_dti_calibration.band` (the conditional family-wise rate's band) is the verdict's
    percentile max-|t| band: est ± q·sd equals `simultaneous_bands` column by column."""
    import pot_dti_calibration as calibration
    from common.stats.intervals import simultaneous_bands
    rng = np.random.default_rng(5)
    cov = np.array([[1.0, 0.4, 0.0], [0.4, 2.0, -0.3], [0.0, -0.3, 0.5]])
    draws = np.vstack([[0.3, -0.1, 0.2], rng.multivariate_normal(np.zeros(3), cov, size=999) + [0.3, -0.1, 0.2]])
    sd, q = calibration.band(draws)
    low, high = simultaneous_bands(draws, 0.95, "percentile")
    assert np.allclose(low, draws[0] - q * sd) and np.allclose(high, draws[0] + q * sd)
    assert 2.0 < q < 2.6  # three columns' max-|t| 95% quantile: above 1.96, below Bonferroni's 2.39 + MC slack


def test_dti_sandwich_matches_the_dtis_spread_over_datasets():
    """The sandwich reference of `pot_dti_calibration --conditional` is the DTIs' sampling
    covariance: over 150 null datasets of 3,000 rows (fixed probabilities) the DTIs'
    variance is within 25% of the mean sandwich variance for every pair (the Monte Carlo
    error of a variance over 150 datasets is about 12%)."""
    import pot_dti_calibration as calibration
    n, reps = 3000, 150
    rng = np.random.default_rng(11)
    p = rng.dirichlet(np.full(bench.K, 0.5), size=n)
    ests, sandwiches = [], []
    for _ in range(reps):
        frame = bench.pot_frame(n, rng)
        sandwiches.append(np.diag(calibration.sandwich(frame, p, bench.GROUPS)))
        y, k = frame["outcome"].to_numpy(float), calibration.kernels(frame)
        curves = [(p[:, a] * y) @ k / (p[:, a] @ k) for a in range(bench.K)]
        ests.append([(curves[a] - curves[b]).mean() for a in range(bench.K) for b in range(a + 1, bench.K)])
    ratio = np.var(np.array(ests), axis=0) / np.mean(sandwiches, axis=0)
    assert np.all((ratio > 0.75) & (ratio < 1.25)), ratio
