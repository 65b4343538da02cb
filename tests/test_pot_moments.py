"""POT's interval under release noise from second moments (`common.metrics.pot`, design §8.4):
the Test-Client's residual cross-moments, their checks, and draws whose covariance across
groups and reference scores is the delta method's."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from common.metrics.base import SECOND_MOMENTS
from common.metrics import pot as pot_module
from common.metrics.pot import METRIC as POT, RESIDUAL_INFO, residual_cross_moments
from common.stats import correction
from common.stats.results import DEFAULT_TAU
from tester_service.release import ReleasePolicy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_random_groups as twin  # noqa: E402  (the release's plaintext twin, built from the real code)


def test_residual_cross_moments_are_the_kernel_weighted_residual_products():
    """τ_qq' = Σ K_q·K_q'·(Y − m̂_q)·(Y − m̂_q') / Σ K_q, m̂_q the kernel-weighted mean of Y,
    from the rows' components K_q·(Y − c) and K_q (any centre c)."""
    rng = np.random.default_rng(8)
    n, refs, h, c = 3000, np.array([0.2, 0.45, 0.5, 0.8]), 0.1, 0.5
    s, y = rng.random(n), rng.random(n)
    k = np.exp(-0.5 * ((s[:, None] - refs[None, :]) / h) ** 2)
    values = np.empty((n, 2 * len(refs)))
    values[:, 0::2], values[:, 1::2] = k * (y - c)[:, None], k
    m = (k * y[:, None]).sum(0) / k.sum(0)
    e = y[:, None] - m[None, :]
    expected = ((k * e).T @ (k * e)) / k.sum(0)[:, None]
    assert np.array(residual_cross_moments(values)) == pytest.approx(expected, rel=1e-8)
    assert np.all(np.diag(expected) > 0) and expected[1, 2] > 0.5 * expected[1, 1]  # close scores overlap


def test_the_test_clients_residual_moments_are_checked():
    """The residual cross-moments are a Q × Q matrix of finite numbers with a diagonal ≥ 0;
    anything else is a bad HelloAck (`common.protocol.validation`; whether they must be
    there at all is the release form's: tests/test_stated_facts.py)."""
    good = {"reference_scores": [0.2, 0.8], "bandwidth": [0.1, 0.12], RESIDUAL_INFO: [[0.1, 0.02], [0.03, 0.2]]}
    POT.check_info(good, [])
    for bad in ([[0.1, 0.0]], [[0.1, 0.0], [0.0, float("nan")]], [[-0.1, 0.0], [0.0, 0.2]], [[0.1], [0.2]], None):
        info = dict(good, **{RESIDUAL_INFO: bad})
        with pytest.raises((ValueError, TypeError), match="residual moments|float"):
            POT.check_info(info, [])


def test_the_test_clients_bandwidths_are_checked():
    """One positive, finite bandwidth per reference score; a single number, a list of
    another length, 0, a NaN or a non-number is a bad HelloAck."""
    good = {"reference_scores": [0.2, 0.8], "bandwidth": [0.1, 0.12], RESIDUAL_INFO: [[0.1, 0.02], [0.03, 0.2]]}
    for bad in (0.1, [0.1], [0.1, 0.0], [0.1, float("nan")], [0.1, -0.2], [0.1, float("inf")]):
        with pytest.raises(ValueError, match="bandwidth"):
            POT.check_info(dict(good, bandwidth=bad), [])
    with pytest.raises((ValueError, TypeError)):
        POT.check_info(dict(good, bandwidth=[0.1, None]), [])


def test_cross_moments_of_another_shape_are_refused_by_the_plan():
    rng = np.random.default_rng(2)
    params = dict(POT.parse_params({}), **{SECOND_MOMENTS: True})
    rows = POT.client_rows(twin.pot_frame(400, rng), "pot.csv", "default", params, rng)
    layout = POT.layout("default", params, rows.info, n_rows=400, n_units=1, recipient="client", modulus_bits=2048)
    plan = POT.plan(twin.GROUPS, (), layout, "default", params, rows.info)
    info = dict(rows.info, **{RESIDUAL_INFO: [[0.1]]})
    with pytest.raises(ValueError, match="residual cross-moments"):
        POT.moment_plan(plan, twin.GROUPS, "default", params, info, layout)


def _plug_in(p: np.ndarray, frame, info) -> tuple[np.ndarray, np.ndarray]:
    """(curves (k, Q), cov (k, Q, k, Q)): every group's curve and the delta method's covariance
    Σ_i p_ia·p_ib·K_q·K_q'·e_aq·e_bq' / (D_aq·D_bq') with each group's own residuals."""
    s, y = frame["score"].to_numpy(), frame["outcome"].to_numpy().astype(float)
    refs, h = np.asarray(info["reference_scores"]), np.asarray(info["bandwidth"])
    k = np.exp(-0.5 * ((s[:, None] - refs[None, :]) / h[None, :]) ** 2)
    den = p.T @ k                                                   # (groups, Q)
    curves = (p.T @ (k * y[:, None])) / den
    z = p[:, :, None] * k[:, None, :] * (y[:, None, None] - curves[None]) / den[None]   # (n, groups, Q)
    return curves, np.einsum("iaq,ibr->aqbr", z, z)


def _dti_variance(cov: np.ndarray, a: int, b: int, q: int) -> float:
    w = np.zeros(cov.shape[:2])
    w[a], w[b] = 1.0 / q, -1.0 / q
    return float(np.einsum("aq,aqbr,br->", w, cov, w))


@pytest.mark.parametrize("cross", ["stated", "diagonal only"])
def test_pot_draws_have_the_delta_method_covariance_across_groups_and_reference_scores(monkeypatch, cross):
    """Without noise, the parametric draws of every curve point and of the DTI between two
    large groups have the plug-in delta method's variance (within the draws' and the pooled
    residuals' error). The DTI averages neighbouring reference scores whose kernels overlap:
    with the stated cross-moments' off-diagonal dropped, its draws are far too narrow."""
    if cross == "diagonal only":
        stated = pot_module.residual_cross_moments
        monkeypatch.setattr(pot_module, "residual_cross_moments",
                            lambda values: np.diag(np.diag(np.array(stated(values)))).tolist())
    monkeypatch.setattr(twin, "MOMENT_REPLICATES", 4000)
    n = 6000
    rng = np.random.default_rng(12)
    p = rng.dirichlet(np.full(twin.K, 0.4), size=n)
    frame = twin.pot_frame(n, rng)
    audit = twin.pot_moment_audit(p, frame, ReleasePolicy.off(), rng, rng, noise=False)
    info = audit.report.info
    curves, cov = _plug_in(p, frame, info)
    nq = len(info["reference_scores"])
    cells = list(audit.plan.cells)
    for a, g in enumerate(twin.GROUPS):
        where = [c for c, cell in enumerate(cells) if cell.kind == "curve" and cell.group == g]
        assert audit.values[0, where] == pytest.approx(curves[a], abs=1e-6)
        if cross == "stated":
            assert audit.values[1:, where].var(axis=0) == pytest.approx(np.diag(cov[a, :, a, :]), rel=0.3)
    extra_cells, dti = POT.derived(cells, audit.values, {}, info)
    ratios = []
    for a, b in [(0, 1), (0, 5), (1, 5)]:
        col = next(j for j, cell in enumerate(extra_cells)
                   if (cell.group, cell.other) == (twin.GROUPS[a], twin.GROUPS[b]))
        drawn, expected = dti[1:, col].var(), _dti_variance(cov, a, b, nq)
        ratios.append(drawn / expected)
    if cross == "stated":
        assert ratios == pytest.approx([1.0] * 3, abs=0.15)
    else:
        assert max(ratios) < 0.75
    assert audit.report.interval == "percentile" and DEFAULT_TAU > 0


def test_the_pair_items_join_the_plan_as_the_corrections_m():
    """POT's moments plan appends one pair item per pair of groups and ciphertext (its k_q
    slots are S^d, also the correction's M) and one family per reference score, in their
    order, with the stated cross-moments."""
    rng = np.random.default_rng(3)
    params = dict(POT.parse_params({}), **{SECOND_MOMENTS: True})
    rows = POT.client_rows(twin.pot_frame(500, rng), "pot.csv", "default", params, rng)
    info = rows.info
    layout = POT.layout("default", params, info, n_rows=500, n_units=1, recipient="client", modulus_bits=2048)
    plan = POT.plan(twin.GROUPS, (), layout, "default", params, info)
    extended, moments = POT.moment_plan(plan, twin.GROUPS, "default", params, info, layout)
    k, nq = twin.K, len(info["reference_scores"])
    assert len(extended.items) == len(plan.items) + len(correction.pairs(k)) * layout.n_ciphertexts
    assert [extended.cells[f.cells[0]].score for f in moments.families] == info["reference_scores"]
    assert np.array(moments.cross) == pytest.approx(np.array(info[RESIDUAL_INFO]))
    assert len(moments.cross) == nq
