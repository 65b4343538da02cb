"""MQOS-AUC exact's interval under release noise from second moments (`common.metrics.mqos_auc`,
"Interval under release noise"; design §8.4): the Test-Client's stated placement variances,
their checks, the one-unit release of the cells and the pair items under encryption, the
pair items' sensitivity, and draws with DeLong's variance."""
from __future__ import annotations

import math

import numpy as np
import pytest

from common.crypto import encoding, paillier
from common.metrics.base import Layout
from common.metrics.mqos_auc import EXACT, PLACEMENT_INFO, placement_variances, released_form
from common.metrics.scoring import dense_score_rank
from common.stats import correction
from common.stats.moments import finish_release
from tests.helpers import TEST_BITS

GROUPS = ["a", "b", "c"]


def _brute_placements(y: np.ndarray, s: np.ndarray) -> tuple[float, float]:
    pos, neg = s[y == 1], s[y == 0]
    v10 = [(np.sum(x > neg) + 0.5 * np.sum(x == neg)) / len(neg) for x in pos]
    v01 = [(np.sum(pos > x) + 0.5 * np.sum(pos == x)) / len(pos) for x in neg]
    return float(np.var(v10, ddof=1)), float(np.var(v01, ddof=1))


def test_placement_variances_are_delongs_components_ties_included():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 300)
    s = rng.integers(0, 12, 300).astype(float) + 2.0 * y  # many ties
    assert placement_variances(y, s) == pytest.approx(_brute_placements(y, s), rel=1e-8)


@pytest.mark.parametrize("stated", [None, [0.01], [0.01, -0.001], [0.01, 0.3], [0.01, float("nan")], "x"])
def test_stated_placement_variances_are_checked(stated):
    """Each is a variance of a fraction (at most ¼), two of them; anything else is refused
    (the session turns the ValueError into a protocol error naming the fact; whether they
    must be there at all is the release form's: tests/test_stated_facts.py)."""
    with pytest.raises(ValueError, match="placement variances"):
        EXACT.check_info({PLACEMENT_INFO: stated}, ())
    EXACT.check_info({PLACEMENT_INFO: [0.02, 0.25]}, ())


def _signed(key, ciphertexts):
    return [m - key.p if m > key.p // 2 else m for m in key.decrypt_mod_p(ciphertexts)]


def test_one_unit_combine_releases_the_cells_then_the_pair_items():
    """With one unit and the pair weights aggregated (the release of second moments), the
    encrypted path yields every cell's (V, D) over all rows, as `released_form`, then per
    pair a ≤ b (S1, S0) = (Σ w_ab·y, Σ w_ab·(1 − y)); the noise hook sees the four
    components (V, D, S1, S0), and there is one square per cell, no random groups."""
    rng = np.random.default_rng(8)
    n, k = 40, len(GROUPS)
    q = encoding.quantize_probabilities(rng.dirichlet(np.ones(k), n))
    y = rng.integers(0, 2, n)
    rank = dense_score_rank(rng.integers(0, 10, n).astype(float))
    units = np.zeros(n, dtype=np.int64)
    key = paillier.generate_keypair(TEST_BITS, allow_insecure=True)
    pub = key.public

    def encrypt(values):
        return paillier.encrypt_chunk(pub.n, pub.h, [v % pub.n for v in values])
    facts = EXACT.tester_facts((q,), rank, units)
    weights = list(EXACT.weights((q,), rank, units, GROUPS, "exact", {})) + correction.pair_weights(q)
    assert all(isinstance(weights[4 * j + 1], tuple) for j in range(k + 1))  # W_Lg is W_L: not aggregated
    agg = {0: [None] * len(weights)}
    for w, col in enumerate(weights):
        if not isinstance(col, tuple):
            agg[0][w] = encrypt([sum((col if isinstance(col, int) else int(col[i])) * int(y[i]) for i in range(n))])
    for w, col in enumerate(weights):
        if isinstance(col, tuple):
            agg[0][w] = agg[0][col[0]]
    layout = Layout(slot_bits=EXACT.item_bits(n, 1, ()) + 8, slots=1, n_components=1)
    state, requests = EXACT.square_requests(agg, 1, pub, facts, layout)
    assert len(requests) == k + 1
    squares = encrypt([v * v for v in _signed(key, requests)])
    seen = set()

    def noise(ciphertext, component, replicate):
        seen.add((replicate, component))
        return ciphertext
    items = EXACT.combine(state, squares, pub, layout, noise)
    shift = layout.slot_bits
    decoded = []
    for value in _signed(key, items):
        low = (value + (1 << (shift - 1))) % (1 << shift) - (1 << (shift - 1))
        decoded.append((low, (value - low) >> shift))
    assert decoded[:k + 1] == released_form(q, y, rank, n_rows=n)[0]
    expected = [(int(np.dot(w.astype(object), y)), int(np.dot(w.astype(object), 1 - y)))
                for w in correction.pair_weights(q)]
    assert decoded[k + 1:] == expected and len(expected) == k * (k + 1) // 2
    assert seen == {(0, 0), (0, 1), (0, 2), (0, 3)}


def test_the_pair_items_never_move_beyond_the_noise_scale():
    """Replacing one member's vector moves the pair slots (S1_ab, S0_ab), a ≤ b, only in its
    label's half, by an L2 norm of at most 2·||Δp||₂ pair weights (2^32 each): the factor
    2 the second moments' σ_m is sized for (`ReleasePolicy.moment_sigmas`, PAIR_FACTOR 4 on
    the square, β = 1). Its supremum with k groups is √((k − 1)⁻¹ + 4)/√(1 + (k − 1)⁻¹)
    (a member at one group moving a little towards all others): 1.87 at 6 groups, 2 as k
    grows; the search comes within 0.2 of it."""
    rng = np.random.default_rng(11)
    worst = 0.0
    for trial in range(3000):
        k = int(rng.integers(2, 7))
        p = rng.dirichlet(np.full(k, 0.3 if trial % 2 else 3.0), 2)
        if trial % 3 == 0:  # one-hot moves, the adversarial corner
            p = np.eye(k)[rng.choice(k, 2, replace=False)]
        q = encoding.quantize_probabilities(p)
        w = np.array([col for col in correction.pair_weights(q)], dtype=np.float64) / 2.0 ** 32  # (pairs, 2)
        move = math.sqrt(float(np.sum((w[:, 1] - w[:, 0]) ** 2)))  # S1's (y = 1) or S0's (y = 0): one of them
        dp = float(np.linalg.norm((q[1] - q[0]) / 2.0 ** 32))
        assert move <= 2.0 * dp + 1e-9
        worst = max(worst, move / dp)
    assert worst > 1.65


def _release_row(p: np.ndarray, y: np.ndarray, scores: np.ndarray):
    """The noiseless one-unit release of `p`'s groups (k = p's columns): the plan, the
    CorrectionPlan and the decoded row (cells' (V, D), then the pair items' (S1, S0))."""
    k = p.shape[1]
    groups = [f"g{j}" for j in range(k)]
    q = encoding.quantize_probabilities(p)
    rank = dense_score_rank(scores)
    info = {PLACEMENT_INFO: placement_variances(y, scores)}
    plan, moments = EXACT.moment_plan(EXACT.plan(groups, (), None, "exact", {}, info), groups, "exact", {}, info,
                                      None)
    row = [list(cell) for cell in released_form(q, y, rank, n_rows=len(y))[0]]
    row += [[int(np.dot(w.astype(object), y)), int(np.dot(w.astype(object), 1 - y))]
            for w in correction.pair_weights(q)]
    return plan, moments, row


def _delong_variance(y: np.ndarray, s: np.ndarray) -> float:
    v1, v0 = _brute_placements(y, s)
    return v1 / int(y.sum()) + v0 / int((1 - y).sum())


def test_auc_draws_have_delongs_variance_and_need_the_stated_placements(monkeypatch):
    """Without noise, each group's draws (one-hot groups of 400-1,600 members, null data:
    one AUC for all) have the variance of DeLong's estimate of that group's own AUC, and
    overall's its own, within the draws' and the pooled placements' error; with the
    Test-Client's statement zeroed the draws keep only the binormal shift of a group whose
    AUC happens to sit below overall's, a small part of it."""
    rng = np.random.default_rng(21)
    sizes = [1600, 800, 400]
    member = np.repeat(np.arange(3), sizes)
    n = len(member)
    p = np.eye(3)[member]
    y = (rng.random(n) < 0.3).astype(np.int64)
    scores = np.round(rng.normal(0.0, 1.0, n) + 1.4 * y, 3)
    plan, moments, row = _release_row(p, y, scores)
    noise_sd = [0.0] * (2 * 2 * len(plan.items))
    values, _ = finish_release(plan, moments, row, noise_sd, 4000)
    for j in range(3):
        rows = member == j
        assert values[1:, j].var() == pytest.approx(_delong_variance(y[rows], scores[rows]), rel=0.15)
    assert values[1:, 3].var() == pytest.approx(_delong_variance(y, scores), rel=0.15)
    assert np.all(np.abs(values[0] - values[1:].mean(axis=0)) < 0.01)
    info = {PLACEMENT_INFO: [0.0, 0.0]}
    _, silent = EXACT.moment_plan(plan.__class__(plan.cells, plan.items[:4], plan.item_slots), ["g0", "g1", "g2"],
                                  "exact", {}, info, None)
    flat, _ = finish_release(plan, silent, row, noise_sd, 2000)
    assert flat[1:, 3].var() < 1e-20  # overall's binormal shift is 0 by construction
    for j in range(3):
        rows = member == j
        assert flat[1:, j].var() < 0.2 * _delong_variance(y[rows], scores[rows])
