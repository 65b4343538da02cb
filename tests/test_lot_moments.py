"""LOT's intervals under release noise from released second moments (`common.metrics.lot`,
"Interval under release noise"; `common.stats.moments`): per rank pair, the cells' second
moments on the products of their weights and the Test-Client's spread of the gaps; the
pooled cells as sums of their rank pairs' cells.

Coverage, widths and the null flag rate on 400+ datasets are in
`bench/bench_intervals.py --metric lot` (bench/RESULTS.md); here: the algebra, the
sensitivity of the new items, the Test-Client's facts, and an audit carrying them."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from common.stats import moments
from common.metrics.base import Layout, sensitivity_rows
from common.metrics.lot import METRIC as LOT, PAIR_WEIGHT_SCALE, SPREAD_INFO, gap_spreads

GROUPS = ["hsm", "non_hsm"]
LABELS = ["1-2", "2-3", "3-4"]
#: a slot's units per member: a cell's weight at 2^64 (two probabilities) times a component's 2^32
SLOT = float(1 << 96)
LAYOUT = Layout(160, 4, 2)


def lot_rows(n_queries: int, seed: int, shift: float = 0.0):
    """Rows of LOT (higher member's and lower member's probability vectors over GROUPS, the
    rank pair, the gap ΔỸ), `shift` added to the gaps of rows whose higher member leans hsm."""
    rng = np.random.default_rng(seed)
    n = n_queries * len(LABELS)
    pa = rng.dirichlet([0.6, 0.6], size=n)
    pb = rng.dirichlet([0.6, 0.6], size=n)
    stratum = np.tile(np.arange(len(LABELS)), n_queries)
    spread = np.array([0.05, 0.1, 0.2])[stratum]
    delta = np.clip(rng.normal(0.05 + shift * pa[:, 0], spread), -1.0, 1.0)
    return pa, pb, stratum, delta


def released_row(pa, pb, stratum, delta, info):
    """The noiseless released row (a plaintext twin of the Tester's `_aggregate` under the
    second-moments form, in the slots' units): the plan's cells, then the pair items."""
    plan = LOT.plan(GROUPS, LABELS, LAYOUT, "idcg", {}, info)
    plan, pairs_plan = LOT.moment_plan(plan, GROUPS, "idcg", {}, info, LAYOUT)
    q = [np.round(x * PAIR_WEIGHT_SCALE) for x in (pa, pb)]
    weights = [np.asarray(w, dtype=np.float64) for w in LOT.weights(q, stratum, None, GROUPS, "idcg", {})]
    weights += [np.asarray(w, dtype=np.float64) for w in LOT.moment_weights(q, GROUPS, "idcg", {})]
    row = []
    for item in plan.items:
        rows = slice(None) if item.stratum is None else stratum == item.stratum
        w = weights[item.weight][rows]
        w = w / PAIR_WEIGHT_SCALE ** 2
        row.append([int(round(float((w * delta[rows]).sum()) * SLOT)), int(round(float(w.sum()) * SLOT)), 0, 0])
    return plan, pairs_plan, row, [0.0] * (2 * len(row) * LAYOUT.slots)


def test_lot_draws_have_the_delta_method_variance_per_rank_pair_and_pooled():
    """Each rank pair's cells draw with the delta method's variance σ_s²·Σ w_c²/Den_c² (σ_s²
    the Test-Client's spread of that rank pair's gaps), close to the plug-in
    Σ w_c²·(ΔỸ − R_c)²/Den_c²; a pooled cell draws as the sum of its rank pairs' cells."""
    pa, pb, stratum, delta = lot_rows(4000, seed=3)
    info = {SPREAD_INFO: gap_spreads(delta, stratum, len(LABELS))}
    plan, pairs_plan, row, noise_sd = released_row(pa, pb, stratum, delta, info)
    assert len(pairs_plan.families) == len(LABELS) and len(pairs_plan.pooled) == 2
    estimate = plan.cell_values(row, lambda a, b: None, plain_rows=1, noise_sd=noise_sd)[0]
    draws = moments.weighted_draws(plan, pairs_plan, row, estimate, noise_sd, 20000, np.random.default_rng(5))
    for c, cell in enumerate(plan.cells):
        a, b = GROUPS.index(cell.group), GROUPS.index(cell.other)
        w = pa[:, a] * pb[:, b]
        ranks = range(len(LABELS)) if cell.rank_pair is None else [LABELS.index(cell.rank_pair)]
        rows = np.isin(stratum, list(ranks))
        den = w[rows].sum()
        r = (w[rows] * delta[rows]).sum() / den
        assert draws[0, c] == pytest.approx(r, abs=1e-6)
        expected = sum(info[SPREAD_INFO][s] * (w[stratum == s] ** 2).sum() for s in ranks) / den ** 2
        assert draws[1:, c].var() == pytest.approx(expected, rel=0.05), plan.cells[c]
        plug_in = ((w[rows] * (delta[rows] - r)) ** 2).sum() / den ** 2
        assert draws[1:, c].var() == pytest.approx(plug_in, rel=0.2)


def test_lot_draws_add_the_released_noise_of_each_item():
    """With noise on the released items, a cell's draws widen by the noise of its own
    numerator and denominator (a pooled cell by the sum of its parts')."""
    pa, pb, stratum, delta = lot_rows(4000, seed=4)
    info = {SPREAD_INFO: gap_spreads(delta, stratum, len(LABELS))}
    plan, pairs_plan, row, quiet = released_row(pa, pb, stratum, delta, info)
    sd = 20.0 * SLOT
    noisy = [sd] * (len(quiet) // 2) + [0.0] * (len(quiet) // 2)
    estimate = plan.cell_values(row, lambda a, b: None, plain_rows=1, noise_sd=quiet)[0]
    calm = moments.weighted_draws(plan, pairs_plan, row, estimate, quiet, 20000, np.random.default_rng(1))
    loud = moments.weighted_draws(plan, pairs_plan, row, estimate, noisy, 20000, np.random.default_rng(1))
    for c, cell in enumerate(plan.cells):
        den = row[cell.item][1] / SLOT
        parts = 1 if cell.rank_pair is not None else len(LABELS)
        added = parts * (20.0 ** 2) * (1.0 + estimate[c] ** 2) / den ** 2  # Var(N − R·D)/D² of the noise
        assert loud[1:, c].var() - calm[1:, c].var() == pytest.approx(added, rel=0.1)


def test_lot_pair_items_move_at_most_twice_the_cells_sensitivity():
    """Replacing one member's probability vector moves the pair items (products of two
    cells' weights) by an L2 norm of at most 2·√2·m over all pairs of cells and rank pairs
    (m = sqrt(Σ_s n_s²) of its rows): PAIR_FACTOR times the cells' squared sensitivity,
    which `ReleasePolicy.moment_sigmas` charges. Worst case over vertex swaps."""
    rng = np.random.default_rng(8)
    worst = 0.0
    for trial in range(60):
        n = 30
        pa, pb = rng.dirichlet([0.2, 0.2], size=n), rng.dirichlet([0.2, 0.2], size=n)  # near the vertices
        stratum = rng.integers(0, len(LABELS), n)
        members = rng.integers(0, 12, size=(n, 2))
        members[:, 1] = (members[:, 0] + 1 + rng.integers(0, 11, n)) % 12  # two members per row
        target = 0
        vertex = np.eye(2)[rng.integers(0, 2)]
        other = np.eye(2)[1 - int(vertex[1])]
        before_a, before_b, after_a, after_b = pa.copy(), pb.copy(), pa.copy(), pb.copy()
        before_a[members[:, 0] == target], before_b[members[:, 1] == target] = vertex, vertex
        after_a[members[:, 0] == target], after_b[members[:, 1] == target] = other, other
        if not (members == target).any():
            continue
        hits = (members == target).any(axis=1)
        m = float(np.sqrt((np.bincount(stratum[hits], minlength=len(LABELS)) ** 2).sum()))  # the target's
        assert m <= sensitivity_rows(members, stratum)

        def pair_items(a, b):
            q = [a * PAIR_WEIGHT_SCALE, b * PAIR_WEIGHT_SCALE]
            cols = [np.asarray(w, dtype=np.float64) / PAIR_WEIGHT_SCALE ** 2
                    for w in LOT.moment_weights(q, GROUPS, "idcg", {})]
            return np.array([[c[stratum == s].sum() for c in cols] for s in range(len(LABELS))])

        change = np.linalg.norm(pair_items(after_a, after_b) - pair_items(before_a, before_b))
        worst = max(worst, change / (2.0 * np.sqrt(2.0) * m))
    assert 0.3 < worst <= 1.0 + 1e-9


def test_the_test_clients_gap_spreads_are_checked():
    """The spread per rank pair is one non-negative number per rank pair, within what a
    gap can spread: anything else is refused (the Tester sizes nothing from it, but the
    finishing party's intervals do)."""
    labels = ("1-2", "2-3")
    LOT.check_info({SPREAD_INFO: [0.1, 0.2]}, labels)
    for bad in ([0.1], [0.1, -0.2], [0.1, float("nan")], "0.1", [0.1, 1e30], None):
        with pytest.raises(ValueError, match="gap spreads"):
            LOT.check_info({SPREAD_INFO: bad}, labels)


def test_gap_spreads_are_each_rank_pairs_variance():
    rng = np.random.default_rng(2)
    stratum = rng.integers(0, 3, 500)
    delta = rng.normal(0.0, 1.0, 500) * (1 + stratum)
    got = gap_spreads(delta, stratum, 4)
    assert got[3] == 0.0
    assert got[:3] == pytest.approx([delta[stratum == s].var() for s in range(3)], abs=1e-8)


@pytest.mark.slow
def test_lot_audit_under_the_controls_releases_second_moments():
    """LOT under release noise: the header says "parametric", the Test-Client's gap
    spreads travel with its facts, and the pooled cells' intervals hold their estimates
    and are near the noiseless bootstrap's where the noise is small (a large ρ)."""
    from tester_service.protocol import AuditSpec
    from tester_service.release import ReleasePolicy
    from tests.helpers import local_audit
    from tests.metric_data import random_ranked_lists
    from tests.test_moments import release_form_tap
    rng = np.random.default_rng(41)
    lists = random_ranked_lists(1500, rng, min_len=3, max_len=5, n_members=600)
    hsm = rng.uniform(0.0, 1.0, 600)
    tester = pd.DataFrame({"member_id": [f"m{i:06d}" for i in range(600)], "hsm": hsm, "non_hsm": 1.0 - hsm})
    seen: dict = {}
    spec = AuditSpec(metric="lot", client_dataset="d", bootstrap=200, seed=1)
    report, _, _ = local_audit(tester, lists, spec=spec, tap=release_form_tap(seen),
                               release=ReleasePolicy(rho=400.0, budget=400.0))
    assert seen["interval"] == "parametric"
    assert report.release["interval_from"].startswith("second moments")
    assert len(report.info[SPREAD_INFO]) == 4
    plain, _, _ = local_audit(tester, lists, spec=spec)
    for noisy, exact in zip(report.cells, plain.cells):
        assert (noisy.rank_pair, noisy.higher) == (exact.rank_pair, exact.higher)
        assert noisy.ci_low <= noisy.estimate <= noisy.ci_high
        if noisy.rank_pair is None:
            assert abs(noisy.estimate - exact.estimate) < 0.03
            assert (noisy.ci_high - noisy.ci_low) < 2.5 * (exact.ci_high - exact.ci_low)


def test_every_released_lot_item_carries_noise_the_second_moments_included(monkeypatch):
    """Under the controls each item the Tester releases gets its own noise: the cells at
    σ₀ and the second moments' pair items at σ_m (`ReleasePolicy.moment_sigmas`), none of
    them with a zero scale (pooled cells are sums of noised items, no draw of their own)."""
    from tester_service import release_items
    from tester_service.protocol import AuditSpec
    from tester_service.release import MOMENT_SHARE, PAIR_FACTOR, THRESHOLD_SHARE, ReleasePolicy
    from tests.helpers import local_audit
    from tests.metric_data import random_ranked_lists
    rng = np.random.default_rng(43)
    lists = random_ranked_lists(300, rng, min_len=3, max_len=4, n_members=400)
    hsm = rng.uniform(0.0, 1.0, 400)
    tester = pd.DataFrame({"member_id": [f"m{i:06d}" for i in range(400)], "hsm": hsm, "non_hsm": 1.0 - hsm})
    draws: list = []
    original = release_items.add_noise

    def recording(audit, ciphertext, scales, sigma):
        draws.append((sigma, list(scales)))
        return original(audit, ciphertext, scales, sigma)

    monkeypatch.setattr(release_items, "add_noise", recording)
    policy = ReleasePolicy(rho=1.0, budget=1.0)
    local_audit(tester, lists, spec=AuditSpec(metric="lot", client_dataset="d", bootstrap=50, seed=1),
                release=policy)
    # σ₀ and σ_m from the shares themselves (tester_service.release), not from `moment_sigmas`
    sigma0 = math.sqrt(2 / (1.0 - MOMENT_SHARE - THRESHOLD_SHARE))
    sigma_m = math.sqrt(PAIR_FACTOR * 2 / MOMENT_SHARE)
    strata = 3  # rank pairs 1-2, 2-3, 3-4
    assert len(draws) == strata * (2 + 3)  # per rank pair: 2 cells, 3 pair items
    assert all(any(scale > 0 for scale in scales) for _, scales in draws)
    assert sorted({round(sigma, 9) for sigma, _ in draws}) == sorted({round(sigma0, 9), round(sigma_m, 9)})
    assert sum(1 for sigma, _ in draws if sigma == pytest.approx(sigma_m)) == strata * 3
