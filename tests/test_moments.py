"""Intervals under release noise from released second moments (`common.moments`), the
range-constrained corrected solve and the noise-following identifiability threshold
(`common.correction`), and the privacy accounting of the release (`ReleasePolicy.moment_sigmas`).

The coverage, widths and null flag rate of these intervals are measured on 400+ datasets
in `bench/bench_intervals.py` (bench/RESULTS.md); here: their algebra, and the protocol
carrying them for both result recipients."""
from __future__ import annotations

import math

import numpy as np
import pytest

from common import correction, encoding, moments
from common.errors import ProtocolError
from common.metrics.base import Layout
from common.metrics.ero import METRIC as ERO
from common.races import RACES
from tester_service.protocol import AuditSpec
from tester_service.release import PAIR_FACTOR, ReleasePolicy
from tests.helpers import local_audit, make_inputs

GROUPS = list(RACES)
K = len(GROUPS)
SCALE = float(1 << 32)


def release_row(p: np.ndarray, f: np.ndarray, d: np.ndarray, sd0: float = 0.0, sdm: float = 0.0, seed: int = 0):
    """The one released row as the Test-Client decodes it (groups, overall, pair items),
    in the slots' fixed-point units, and the header's noise sd (a plaintext twin of the
    Tester's `_aggregate` for ERO under release noise)."""
    rng = np.random.default_rng(seed)
    q = encoding.quantize_probabilities(p)
    plan, pairs_plan = correction.extend(ERO.plan(GROUPS, (), Layout(64, 2, 2), "fpr", {}, {}), GROUPS)
    pw = np.column_stack(correction.pair_weights(q)).astype(object)
    group = [[int(sum(int(a) * int(b) for a, b in zip(q[:, j], v))) for v in (f, d)] for j in range(K)]
    group = [[x + int(round(rng.normal(0, sd0 * SCALE))) if sd0 else x for x in g] for g in group]
    pair = [[int(sum(int(a) * int(b) for a, b in zip(pw[:, c], v))) for v in (f, d)] for c in range(pw.shape[1])]
    pair = [[x + int(round(rng.normal(0, sdm * SCALE))) if sdm else x for x in g] for g in pair]
    row = group + [[sum(g[0] for g in group), sum(g[1] for g in group)]] + pair
    per_item = [sd0 * SCALE] * K + [sd0 * SCALE * math.sqrt(K)] + [sdm * SCALE] * len(pair)
    noise_sd = [s for s in per_item for _ in range(2)] + [0.0] * (2 * len(row))
    return plan, pairs_plan, row, noise_sd


def population(n: int, seed: int, alpha: float = 0.4):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(K, alpha), size=n)
    d = (rng.random(n) < 0.7).astype(int)
    f = d * (rng.random(n) < 0.1 + 0.1 * p[:, 1]).astype(int)
    return p, f, d


# ----------------------------------------------------------------------------------
# The weighted estimate's draws are the delta method's
# ----------------------------------------------------------------------------------
def test_draws_have_the_delta_method_variance_of_each_ratio_and_of_the_differences():
    """Without noise the draws' variance of R_j is the delta method's with the binomial
    second moments (`moments.binomial_moments`), S^d_jj·R_j(1 − R_j) / Den_j², close to
    the plug-in Σ p_j²(f − R_j d)² / Den_j²; R_a − R_b gets the covariance from S^d_ab,
    and overall (the groups' sum) R(1 − R)/Σd exactly."""
    p, f, d = population(3000, 1)
    plan, pairs_plan, row, noise_sd = release_row(p, f, d)
    estimate = plan.cell_values(row, lambda a, b: None, plain_rows=1, noise_sd=noise_sd)[0]
    draws = moments.weighted_draws(plan, pairs_plan, row, estimate, noise_sd, 20000, np.random.default_rng(3))
    num, den = p.T @ f, p.T @ d
    r = num / den
    sd = (p * p * d[:, None]).sum(axis=0)
    assert np.allclose(draws[0, :K], r, rtol=1e-9)
    assert np.allclose(draws[1:, :K].var(axis=0), sd * r * (1 - r) / den ** 2, rtol=0.05)
    resid = f[:, None] - r[None, :] * d[:, None]
    plug_in = ((p * resid) ** 2).sum(axis=0) / den ** 2
    assert np.allclose(draws[1:, :K].var(axis=0), plug_in, rtol=0.15)
    w = (p[:, 0] * p[:, 1] * d).sum()
    cov = w * (r[0] + r[1]) / 2 * (1 - r[0] - r[1]) + w * r[0] * r[1]  # Σ p_a p_b (f − R_a d)(f − R_b d), binomial
    expected = sd[1] * r[1] * (1 - r[1]) / den[1] ** 2 + sd[0] * r[0] * (1 - r[0]) / den[0] ** 2 \
        - 2 * cov / (den[0] * den[1])
    assert np.var(draws[1:, 1] - draws[1:, 0]) == pytest.approx(expected, rel=0.05)
    overall = f.sum() / d.sum()
    assert draws[0, K] == pytest.approx(overall) and np.var(draws[1:, K]) == pytest.approx(
        overall * (1 - overall) / d.sum(), rel=0.1)


def test_draws_add_the_released_noise_and_are_the_same_for_both_parties():
    p, f, d = population(3000, 2)
    quiet = release_row(p, f, d)
    noisy = release_row(p, f, d, sd0=5.0, seed=4)
    values = {}
    for name, (plan, pairs_plan, row, noise_sd) in (("quiet", quiet), ("noisy", noisy)):
        values[name], _ = moments.finish_release(plan, pairs_plan, row, noise_sd, 4000)
    den = p.T @ d
    added = values["noisy"][1:, :K].var(axis=0) - values["quiet"][1:, :K].var(axis=0)
    r = values["noisy"][0, :K]
    assert np.allclose(added, 25.0 * (1 + r ** 2) / den ** 2, rtol=0.2)
    plan, pairs_plan, row, noise_sd = noisy  # a deterministic function of the release (its seed too)
    again, _ = moments.finish_release(plan, pairs_plan, row, noise_sd, 4000)
    assert np.array_equal(again, values["noisy"], equal_nan=True)


def test_a_withheld_group_has_no_draws_but_still_moves_overall():
    p, f, d = population(2000, 5)
    plan, pairs_plan, row, noise_sd = release_row(p, f, d, sd0=2.0, sdm=4.0, seed=1)
    values, _ = moments.finish_release(plan, pairs_plan, row, noise_sd, 500, withheld=[3])
    assert np.all(np.isnan(values[:, 3])) and np.all(np.isfinite(values[:, K]))


# ----------------------------------------------------------------------------------
# The corrected estimate: bounded, identifiable at this noise
# ----------------------------------------------------------------------------------
def test_bounded_solve_is_the_solve_inside_the_range_and_the_constrained_fit_outside():
    m = np.array([[4.0, 1.0], [1.0, 3.0]])
    assert correction.bounded_solve(m @ [0.2, 0.5], m, 0.0, 1.0) == pytest.approx([0.2, 0.5])
    rng = np.random.default_rng(0)
    for _ in range(200):
        a = rng.normal(size=(5, 5))
        h, c = a @ a.T + 0.01 * np.eye(5), rng.normal(size=5) * 3
        x = correction.bounded_solve(c, h, 0.0, 1.0)
        g = h @ x - c  # KKT: free coordinates have no gradient, bound ones point outwards
        assert np.all((x >= 0) & (x <= 1))
        assert np.all(np.abs(g[(x > 1e-9) & (x < 1 - 1e-9)]) < 1e-7)
        assert np.all(g[x <= 1e-9] >= -1e-7) and np.all(g[x >= 1 - 1e-9] <= 1e-7)
    indefinite = np.array([[1.0, 2.0], [2.0, 1.0]])  # a noised M: projected onto the PSD cone first
    assert np.all(np.isfinite(correction.bounded_solve(np.array([1.0, -1.0]), indefinite, 0.0, 1.0)))


def test_the_identifiability_threshold_follows_the_noise():
    assert correction.noise_threshold(0.0) == correction.MIN_IDENTIFYING_SIZE
    assert correction.noise_threshold(4.0) == pytest.approx(4.0 / correction.MAX_NOISE_SD)
    p, f, d = population(4000, 6, alpha=0.3)
    plan, pairs_plan, row, _ = release_row(p, f, d)
    sizes = correction.identifying_sizes(correction.plain_matrix(p, d))
    for sd0 in (0.5, 3.0):
        noise_sd = [sd0 * SCALE] * (2 * (K + 1)) + [1.0 * SCALE] * (2 * (len(row) - K - 1)) + [0.0] * (2 * len(row))
        hidden, threshold = pairs_plan.released_identifiability(row, noise_sd, plan)
        assert threshold == pytest.approx(correction.noise_threshold(sd0))
        assert hidden == [g for g, s in zip(GROUPS, sizes) if s < threshold]


def test_identifying_sizes_of_a_singular_matrix_name_only_the_groups_it_cannot_separate():
    m = np.diag([100.0, 50.0, 1.0, 1.0])
    m[2:, 2:] = 1.0  # the last two groups are indistinguishable
    sizes = correction.identifying_sizes(m)
    assert sizes[:2] == pytest.approx([100.0, 50.0]) and np.all(sizes[2:] == 0)


def test_corrected_draws_stay_in_range_and_cover_the_true_rates():
    """Calibrated probabilities (race drawn from p): across 60 noised releases the
    corrected 95% intervals of the large groups cover the true-race rates about 95% of
    the time, and every corrected value and interval end lies in [0, 1]."""
    rates = np.array([0.10, 0.20, 0.08, 0.15, 0.12, 0.09])
    hits, seen = np.zeros(K), np.zeros(K)
    for seed in range(60):
        rng = np.random.default_rng(100 + seed)
        p = rng.dirichlet(np.full(K, 0.3), size=4000)
        race = (p.cumsum(axis=1) > rng.random(4000)[:, None]).argmax(axis=1)
        d = (rng.random(4000) < 0.7).astype(int)
        f = d * (rng.random(4000) < rates[race]).astype(int)
        plan, pairs_plan, row, noise_sd = release_row(p, f, d, sd0=1.0, sdm=2.0, seed=seed)
        _, corrected = moments.finish_release(plan, pairs_plan, row, noise_sd, 300, correct=True, bounds=(0.0, 1.0))
        vals = corrected.values[:, :K]
        assert np.all((vals[np.isfinite(vals)] >= 0) & (vals[np.isfinite(vals)] <= 1))
        low, high = np.nanquantile(vals[1:], [0.025, 0.975], axis=0)
        ok = np.isfinite(vals[0])
        seen += ok
        hits += ok & (low <= rates) & (rates <= high)
    big = seen >= 50
    assert big.sum() >= 3 and np.all(hits[big] / seen[big] >= 0.85)


# ----------------------------------------------------------------------------------
# Accounting, and the protocol
# ----------------------------------------------------------------------------------
def test_moment_sigmas_spend_exactly_the_audits_rho():
    """C components: C/σ₀² for the group items, PAIR_FACTOR·C/σ_m² for the pair items,
    1/σ_t² for the noisy sizes: together ρ."""
    policy = ReleasePolicy(rho=0.2, budget=0.4)
    for c in (1.0, 2.0, 3.5):
        s0, sm = policy.moment_sigmas(c)
        assert c / s0 ** 2 + PAIR_FACTOR * c / sm ** 2 + 1 / policy.threshold_sigma() ** 2 == pytest.approx(0.2)
    assert ReleasePolicy.off().moment_sigmas(2) == (0.0, 0.0)


@pytest.mark.parametrize("recipient", ["client", "tester"])
def test_both_recipients_finish_a_release_of_second_moments(recipient):
    tester, client = make_inputs(3000, 3000, 3000, seed=31)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=200, seed=1, result_recipient=recipient,
                     correction="calibration")
    report, _, _ = local_audit(tester, client, spec=spec, release=ReleasePolicy(rho=1.0, budget=1.0))
    assert report.interval == "percentile" and report.bootstrap == 200
    assert report.release["interval_from"].startswith("second moments")
    # the table and the report page name where the intervals come from (no "bootstrap")
    assert "CIs from the released second moments (200 parametric draws)" in report.to_table()
    from ppre.report import _interval_words
    assert "second moments" in _interval_words(report)
    white = report.group("white")
    assert white.ci_low < white.estimate < white.ci_high and white.ci_high - white.ci_low < 0.1
    assert report.correction["min_identifying_size"] > correction.MIN_IDENTIFYING_SIZE


def test_a_header_claiming_second_moments_for_a_metric_without_them_is_refused():
    tester, client = make_inputs(600, 600, 600, seed=32)
    client = client.rename(columns={"y_pred": "outcome"})[["member_id", "outcome"]]

    def tap(direction, msg):
        if msg.WhichOneof("body") == "aggregates_header":
            msg.aggregates_header.interval = "parametric"

    spec = AuditSpec(metric="output", client_dataset="d", bootstrap=10, seed=1)
    with pytest.raises(ProtocolError, match="second moments"):
        local_audit(tester, client, spec=spec, tap=tap, release=ReleasePolicy(rho=1.0, budget=1.0,
                                                                              min_effective_size=0.0))
