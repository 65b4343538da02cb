"""Intervals under release noise from released second moments (`common.stats.moments`), the
range-constrained corrected solve and the noise-following identifiability threshold
(`common.stats.correction`), and the privacy accounting of the release (`ReleasePolicy.moment_sigmas`).

The coverage, widths and null flag rate of these intervals are measured on 400+ datasets
in `bench/bench_intervals.py` (bench/RESULTS.md); here: their algebra, and the protocol
carrying them for both result recipients."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from common.stats import correction, moments
from common.crypto import encoding
from common.errors import ProtocolError
from common.metrics.base import SECOND_MOMENTS, Layout
from common.metrics.ero import METRIC as ERO
from common.metrics.output import METRIC as OUTPUT
from common.races import RACES
from ppre.report.text import render_text
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
    assert np.allclose(draws[1:, :K].var(axis=0), plug_in, rtol=0.2)  # σ² includes the groups' gaps
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
    # with S squared components: in the pair items (4 each) and the group items (1 each)
    s0, sm = policy.moment_sigmas(2.0, squares=1)
    assert 2 / s0 ** 2 + (PAIR_FACTOR * 3 + 1) / sm ** 2 + 1 / policy.threshold_sigma() ** 2 == pytest.approx(0.2)


@pytest.mark.parametrize("recipient", ["client", "tester"])
def test_both_recipients_finish_a_release_of_second_moments(recipient):
    tester, client = make_inputs(3000, 3000, 3000, seed=31)
    spec = AuditSpec(metric="ero", client_dataset="d", bootstrap=200, seed=1, result_recipient=recipient,
                     correction="calibration")
    report, _, _ = local_audit(tester, client, spec=spec, release=ReleasePolicy(rho=1.0, budget=1.0))
    assert report.interval == "percentile" and report.bootstrap == 200
    assert report.release["interval_from"].startswith("second moments")
    # the table and the report page name where the intervals come from (no "bootstrap")
    assert "CIs from the released second moments (200 parametric draws)" in render_text(report)
    from ppre.report import intervals_words
    assert "second moments" in intervals_words(report)
    white = report.group("white")
    assert white.ci_low < white.estimate < white.ci_high and white.ci_high - white.ci_low < 0.1
    assert report.correction["min_identifying_size"] > correction.MIN_IDENTIFYING_SIZE


def test_a_header_claiming_second_moments_for_a_metric_without_them_is_refused():
    tester, client = make_inputs(600, 600, 600, seed=32)
    client = client.assign(score=client["y_pred"] + 0.5 * client["y_true"])[["member_id", "y_true", "score"]]

    def tap(direction, msg):
        if msg.WhichOneof("body") == "aggregates_header":
            msg.aggregates_header.interval = "parametric"

    spec = AuditSpec(metric="mqos-auc", metric_option="sampled", client_dataset="d", bootstrap=10, seed=1)
    with pytest.raises(ProtocolError, match="second moments"):
        local_audit(tester, client, spec=spec, tap=tap, release=ReleasePolicy(rho=1.0, budget=1.0,
                                                                              min_effective_size=0.0))


# ----------------------------------------------------------------------------------
# The output metric: the rows carry f², the pair items its second moments
# ----------------------------------------------------------------------------------
OUTPUT_SCALE = float(1 << OUTPUT.components("default", {}, {})[1].scale_bits)


def output_release(p: np.ndarray, y: np.ndarray, lo: float, hi: float):
    """The noiseless released row of the output metric under the second-moments form (a
    plaintext twin of the Tester's `_aggregate`): group items (f, 1, f²), overall, pair
    items, in fixed point, with the plan and families both parties build."""
    c = (lo + hi) / 2
    params = {"outcome_range": (lo, hi), SECOND_MOMENTS: True}
    return moments_release(OUTPUT, params, {}, p, (y - c, np.ones_like(y), (y - c) ** 2)) + (c,)


def moments_release(metric, params: dict, info: dict, p: np.ndarray, columns):
    """(plan, moments plan, row, noise sd) of a noiseless release of the second-moments
    form (`columns`: the rows' components, a square among them where the metric has
    `Metric.moment_squares`), with 4 slots per ciphertext."""
    comps = metric.components("default", params, info)
    layout = Layout(128, 4, len(comps))
    plan = metric.plan(GROUPS, (), layout, "default", params, info)
    plan, pairs_plan = correction.extend(plan, GROUPS, **metric.moment_shape("default", params, info, layout))
    values = np.column_stack([comp.quantize(v) for comp, v in zip(comps, columns)])
    q = encoding.quantize_probabilities(p).astype(object)
    pw = np.column_stack(correction.pair_weights(encoding.quantize_probabilities(p))).astype(object)
    pad = [0] * (layout.slots - len(comps))
    group = [[int(sum(a * int(b) for a, b in zip(q[:, j], values[:, s]))) for s in range(len(comps))] + pad
             for j in range(K)]
    overall = [sum(g[s] for g in group) for s in range(layout.slots)]
    pair = [[int(sum(int(a) * int(b) for a, b in zip(pw[:, m], values[:, s]))) for s in range(len(comps))] + pad
            for m in range(pw.shape[1])]
    row = group + [overall] + pair
    return plan, pairs_plan, row, [0.0] * (2 * len(row) * layout.slots)


def test_output_draws_have_the_delta_method_variance_with_the_pooled_spread():
    """The released sums give the outcome's spread σ² over all rows (Σ f²/n − (Σ f/n)²,
    `moments.pooled_spread`), and each group's draws the delta-method variance
    σ²·Σ_i p_ij² / Den_j² with it, the difference of two groups the covariance
    S^d_ab·(σ² − (R_a − R_b)²/4): close to the plug-in Σ_i p_ij²·(y_i − R_j)² / Den_j²
    when the groups spread alike (here they do), and steady where a small group's own
    released Σ p²·f² is mostly noise (bench/RESULTS.md)."""
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.full(K, 0.4), size=2500)
    y = np.clip(rng.normal(1.0 + 0.3 * p[:, 1], 0.5), -1.0, 3.0)
    plan, pairs_plan, row, noise_sd, _ = output_release(p, y, -1.0, 3.0)
    family = pairs_plan.families[0]
    spread = moments.pooled_spread(plan, family, row, K)
    assert spread == pytest.approx(y.var(), rel=1e-6)
    estimate = plan.cell_values(row, lambda a, b: None, plain_rows=1, noise_sd=noise_sd)[0]
    draws = moments.weighted_draws(plan, pairs_plan, row, estimate, noise_sd, 20000, np.random.default_rng(3))
    den = p.sum(axis=0)
    r = (p * y[:, None]).sum(axis=0) / den
    assert np.allclose(draws[0, :K], r, atol=1e-6)
    sd = (p * p).sum(axis=0)
    assert np.allclose(draws[1:, :K].var(axis=0), spread * sd / den ** 2, rtol=0.05)
    resid = y[:, None] - r[None, :]
    plug_in = ((p * resid) ** 2).sum(axis=0) / den ** 2
    assert np.allclose(draws[1:, :K].var(axis=0), plug_in, rtol=0.2)  # σ² includes the groups' gaps
    w = (p[:, 0] * p[:, 1]).sum()
    cov = w * (spread - (r[0] - r[1]) ** 2 / 4) / (den[0] * den[1])
    expected = spread * (sd[0] / den[0] ** 2 + sd[1] / den[1] ** 2) - 2 * cov
    assert np.var(draws[1:, 1] - draws[1:, 0]) == pytest.approx(expected, rel=0.05)
    assert np.var(draws[1:, K]) == pytest.approx(y.var() / len(y), rel=0.1)  # overall: the plain mean's


def test_the_pooled_spread_comes_from_the_pair_items_where_f2_has_its_own_ciphertext():
    rng = np.random.default_rng(9)
    p = rng.dirichlet(np.full(K, 0.4), size=800)
    y = rng.uniform(0.0, 2.0, size=len(p))
    plan, pairs_plan, row, _, _ = output_release(p, y, 0.0, 2.0)
    family = pairs_plan.families[0]
    own = dataclasses.replace(family, sq_items=tuple(range(len(row), len(row) + len(family.pair_items))))
    moved = row + [list(row[i]) for i in family.pair_items]  # the pair items' f² on "another ciphertext"
    overall = next(c for c in plan.cells if c.group == "overall")
    moved[overall.item] = list(moved[overall.item])
    moved[overall.item][family.sq_slot] = 0  # nothing there: it must come from the pairs
    assert moments.pooled_spread(plan, own, moved, K) == pytest.approx(y.var(), rel=1e-6)
    assert moments.pooled_spread(plan, family, row, K) == pytest.approx(y.var(), rel=1e-6)


def test_output_corrected_values_use_the_squares_residual_and_stay_in_range():
    rng = np.random.default_rng(8)
    p = rng.dirichlet(np.full(K, 0.3), size=4000)
    y = np.clip(rng.normal(0.5, 1.0, size=len(p)), 0.0, 2.0)
    plan, pairs_plan, row, noise_sd, _ = output_release(p, y, 0.0, 2.0)
    values, corrected = moments.finish_release(plan, pairs_plan, row, noise_sd, 400, correct=True,
                                               bounds=(0.0, 2.0))
    finite = corrected.values[np.isfinite(corrected.values)]
    assert finite.size and np.all((finite >= 0.0) & (finite <= 2.0))
    ok = [c for c in range(K) if np.isfinite(corrected.values[0, c])]
    assert ok and np.all(np.nanstd(corrected.values[1:, ok], axis=0) > 0)


def test_ndcg_draws_have_the_delta_method_variance_with_one_spread_per_query():
    """MQOS-NDCG (f a viewer's NDCG sum around ½ over its d queries): the Test-Client
    states the spread per query σ² = Σ (f − c·d)²/Σ d of its own viewers (`spread_facts`),
    and each group's draws have the delta-method variance σ²·Σ p²·d / Den², close to the
    plug-in Σ p²·(f − R·d)² / Den² when queries spread alike."""
    from common.metrics.mqos_ndcg import METRIC as NDCG, spread_facts
    rng = np.random.default_rng(11)
    n = 3000
    p = rng.dirichlet(np.full(K, 0.4), size=n)
    d = rng.integers(1, 4, n).astype(float)
    ndcg = rng.beta(9.0, 1.0, size=(n, 3))
    f = np.where(np.arange(3)[None, :] < d[:, None], ndcg - 0.5, 0.0).sum(axis=1)
    info = {"queries": int(d.sum()), "viewers": n, **spread_facts(f, d)}
    params = {"max_queries_per_viewer": 3}
    plan, pairs_plan, row, noise_sd = moments_release(NDCG, params, info, p, (f, d))
    family = pairs_plan.families[0]
    assert family.sq_slot is None and family.den_square == pytest.approx((d * d).sum() / d.sum())
    spread = moments.pooled_spread(plan, family, row, K)
    assert spread == pytest.approx(((f - f.sum() / d.sum() * d) ** 2).sum() / d.sum(), rel=1e-6)
    estimate = plan.cell_values(row, lambda a, b: None, plain_rows=1, noise_sd=noise_sd)[0]
    draws = moments.weighted_draws(plan, pairs_plan, row, estimate, noise_sd, 20000, np.random.default_rng(3))
    den = (p * d[:, None]).sum(axis=0)
    r = (p * f[:, None]).sum(axis=0) / den
    assert np.allclose(draws[0, :K] - 0.5, r, atol=1e-6)
    delta = spread * (p * p * d[:, None]).sum(axis=0) / den ** 2
    assert np.allclose(draws[1:, :K].var(axis=0), delta, rtol=0.05)
    plug_in = ((p * (f[:, None] - r[None, :] * d[:, None])) ** 2).sum(axis=0) / den ** 2
    assert np.allclose(draws[1:, :K].var(axis=0), plug_in, rtol=0.2)


def release_form_tap(seen: dict):
    """A tap recording what the Test-Client is told of the release's form: whether the
    Hello announces second moments (rows with squares, for a metric with
    `moment_squares`; the stated facts), the header's interval, its noise sd per item slot."""
    def tap(direction, msg):
        kind = msg.WhichOneof("body")
        if kind == "hello":
            seen["second_moments"] = msg.hello.second_moments
        if kind == "aggregates_header":
            header = msg.aggregates_header
            seen["interval"] = header.interval
            seen["noise"] = (list(header.noise_sd), header.item_slots)
    return tap


@pytest.mark.slow
def test_ndcg_audit_under_the_controls_releases_second_moments():
    """MQOS-NDCG under release noise: the Hello announces second moments (no squares: the
    rows keep two components; the Test-Client states its spread), the header says
    "parametric", and a large group's interval is near the noiseless bootstrap's."""
    from tests.metric_data import random_ranked_lists
    tester, _ = make_inputs(3000, 10, 0, seed=35)
    lists = random_ranked_lists(4500, np.random.default_rng(1), min_len=3, max_len=6, viewers=3000)
    seen: dict = {}
    tap = release_form_tap(seen)
    spec = AuditSpec(metric="mqos-ndcg", client_dataset="d", bootstrap=200, seed=1,
                     params={"max_queries_per_viewer": "2"})
    report, _, _ = local_audit(tester, lists, spec=spec, tap=tap, release=ReleasePolicy(rho=1.0, budget=1.0))
    assert (seen["second_moments"], seen["interval"]) == (True, "parametric")
    assert report.release["interval_from"].startswith("second moments")
    assert report.info["spread_per_query"] > 0 and report.info["queries_squared"] >= report.info["queries"]
    plain, _, _ = local_audit(tester, lists, spec=spec)
    for group in ("white", "overall"):
        noisy, exact = report.group(group), plain.group(group)
        assert noisy.ci_low < noisy.estimate < noisy.ci_high and abs(noisy.estimate - exact.estimate) < 0.02
        assert (noisy.ci_high - noisy.ci_low) < 2.0 * (exact.ci_high - exact.ci_low)


@pytest.mark.parametrize("modulus_bits", [None, pytest.param(2048, marks=pytest.mark.slow)])
def test_output_audit_under_the_controls_releases_second_moments_with_squares(modulus_bits):
    """The output metric under release noise: the Hello asks for the squares, the header
    says "parametric", and the intervals are as narrow as the noiseless bootstrap's for a
    large group (the random groups' were 3× wider for small groups). With the tests' small
    key f² has a ciphertext of its own (2 slots each); with a 2048-bit key it shares the
    group items' (4 slots), whose f² slot is then released at σ_m. The release noise is
    the Tester's own draw (not seeded), so white's width moves from audit to audit: over
    30 audits at ρ = 4 it was 0.66-1.43 of the noiseless bootstrap's (at ρ = 1, 0.84-1.82,
    where a bound of 1.5 failed 4 of 30)."""
    tester, client = make_inputs(3000, 3000, 3000, seed=34)
    rng = np.random.default_rng(0)
    client = client.assign(outcome=np.clip(rng.normal(1.0, 0.5, len(client)), -1, 3))[["member_id", "outcome"]]
    seen: dict = {}
    tap = release_form_tap(seen)

    spec = AuditSpec(metric="output", client_dataset="d", bootstrap=200, seed=1,
                     params={"outcome_range": "-1:3"})
    policy = ReleasePolicy(rho=4.0, budget=4.0)
    report, session, _ = local_audit(tester, client, spec=spec, tap=tap, release=policy,
                                     modulus_bits=modulus_bits)
    assert (seen["second_moments"], seen["interval"]) == (True, "parametric")
    # every released slot of f² is noised at the second moments' σ_m: f's bound is 2 (the
    # range's half-width), f²'s 4, so its noise is 2·σ_m/σ₀ times f's in a group item and
    # twice f's in a pair item; the pair items of f² join where f² has a ciphertext of its own
    sd, slots = seen["noise"]
    s0, sm = policy.moment_sigmas(2.0, squares=1)
    layout, plan, first_pair = session._layout, session._plans.plan, session._plans.correction.first_item
    (f_ct, f_slot), (sq_ct, sq_slot) = layout.position(0), layout.position(2)
    f_sd = {i: sd[i * slots + f_slot] for i, item in enumerate(plan.items) if item.ciphertext == f_ct}
    sq_sd = {i: sd[i * slots + sq_slot] for i, item in enumerate(plan.items) if item.ciphertext == sq_ct}
    assert len(sq_sd) >= K * (K + 1) // 2 and all(v > 0 for v in sq_sd.values())
    groups = [i for i in range(K) if i in sq_sd]
    assert (sq_ct == f_ct) == bool(groups) == (modulus_bits == 2048)
    assert all(sq_sd[i] / f_sd[i] == pytest.approx(2.0 * sm / s0, rel=1e-3) for i in groups)
    assert all(f_sd[i] / f_sd[0] == pytest.approx(sm / s0, rel=1e-3) for i in f_sd if i >= first_pair)
    pair_sq = [v for i, v in sq_sd.items() if i >= first_pair]
    assert pair_sq and all(v / f_sd[0] == pytest.approx(2.0 * sm / s0, rel=1e-3) for v in pair_sq)
    assert report.release["interval_from"].startswith("second moments")
    plain, _, _ = local_audit(tester, client, spec=spec)
    white, white0 = report.group("white"), plain.group("white")
    assert white.ci_low < white.estimate < white.ci_high
    assert (white.ci_high - white.ci_low) < 2.0 * (white0.ci_high - white0.ci_low)


@pytest.mark.slow
def test_pot_under_noise_decides_identifiability_on_the_released_m():
    """Under release noise POT, whose interval comes from second moments drawn jointly over
    its reference scores, releases no identifying sizes of its own: the header's list is empty and both
    parties withhold the groups the released, noised M of some reference score cannot
    tell apart at the estimate's noise (`correction.finish_corrected`), with the
    noise-following threshold in the report."""
    tester, client = make_inputs(1500, 1500, 1500, seed=35)
    rng = np.random.default_rng(1)
    client = client.assign(score=rng.random(len(client)), outcome=client["y_true"])[["member_id", "score", "outcome"]]
    headers = []

    def tap(direction, msg):
        if msg.WhichOneof("body") == "aggregates_header":
            headers.append((msg.aggregates_header.interval, list(msg.aggregates_header.unidentifiable)))

    spec = AuditSpec(metric="pot", client_dataset="d", bootstrap=20, seed=1, correction="calibration",
                     params={"reference_scores": "0.3,0.7"})
    for recipient in ("client", "tester"):
        headers.clear()
        report, session, _ = local_audit(tester, client, spec=dataclasses.replace(spec, result_recipient=recipient),
                                         tap=tap, release=ReleasePolicy(rho=1.0, budget=1.0))
        assert headers == [("parametric", [])]
        assert report.correction["min_identifying_size"] > correction.MIN_IDENTIFYING_SIZE
        hidden = set(report.correction["unidentifiable"])
        for g in GROUPS:
            values = [c.corrected_estimate for c in report.curves if c.group == g]
            assert all(v is None for v in values) if g in hidden else all(v is not None for v in values)


def test_a_hello_whose_squares_were_dropped_on_the_way_ends_in_a_protocol_error():
    """The Tester releases second moments with squares; a Test-Client that was not asked
    for them (the Hello's flag cleared in transit) packs two components, not three: the
    audit ends in a clean protocol error, never a result from mismatched slots."""
    tester, client = make_inputs(800, 800, 800, seed=36)
    rng = np.random.default_rng(2)
    client = client.assign(outcome=rng.random(len(client)))[["member_id", "outcome"]]

    def tap(direction, msg):
        if msg.WhichOneof("body") == "hello":
            msg.hello.second_moments = False

    spec = AuditSpec(metric="output", client_dataset="d", bootstrap=20, seed=1)
    with pytest.raises(ProtocolError):
        local_audit(tester, client, spec=spec, tap=tap, release=ReleasePolicy(rho=1.0, budget=1.0))
