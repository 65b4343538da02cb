"""k-ary randomized response (design §2.3)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from common.errors import InputError
from tester_service.demographics import randomized_response as rr


def privacy_loss_by_enumeration(m: np.ndarray) -> float:
    """max over outputs y and input pairs (x, x') of log Pr(y|x) / Pr(y|x')."""
    k = m.shape[0]
    worst = -math.inf
    for y in range(k):
        for x, x2 in itertools.product(range(k), repeat=2):
            worst = max(worst, math.log(m[x, y]) - math.log(m[x2, y]))
    return worst


@pytest.mark.parametrize("epsilon,k", [(4.5, 6), (0.1, 6), (1.0, 2), (2.0, 3), (8.0, 6), (4.5, 10)])
def test_exact_privacy_loss_equals_epsilon(epsilon, k):
    m = rr.transition_matrix(epsilon, k)
    np.testing.assert_allclose(m.sum(axis=1), 1.0, atol=1e-15)
    assert (m > 0).all()
    assert privacy_loss_by_enumeration(m) == pytest.approx(epsilon, abs=1e-12)


def test_transition_matrix_entries():
    m = rr.transition_matrix(4.5, 6)
    e = math.exp(4.5)
    np.testing.assert_allclose(np.diag(m), e / (e + 5), rtol=1e-14)
    np.testing.assert_allclose(m[~np.eye(6, dtype=bool)], 1 / (e + 5), rtol=1e-14)
    assert rr.flip_rate(4.5, 6) == pytest.approx(0.0526, abs=5e-5)


def test_privatize_matches_matrix_statistically():
    rng = np.random.default_rng(1)
    n = 300_000
    cats = rng.integers(0, 6, n)
    out = rr.privatize(cats, rng, 4.5)
    p = rr.flip_rate(4.5)
    se = math.sqrt(p * (1 - p) / n)
    observed = float((out != cats).mean())
    assert abs(observed - p) < 3 * se, (observed, p, se)
    # Flips go to every other category equally often (each 1/5 of the flips, 3 SE).
    flips = out[out != cats] - cats[out != cats]
    shares = np.bincount(flips % 6, minlength=6)[1:] / len(flips)
    se_share = math.sqrt(0.2 * 0.8 / len(flips))
    assert np.all(np.abs(shares - 0.2) < 4 * se_share)
    oh = rr.privatize_one_hot(np.array([0, 5]), rng)
    assert oh.shape == (2, 6) and (oh.sum(axis=1) == 1).all()


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "abc", None])
def test_bad_epsilon(bad):
    with pytest.raises(InputError) as exc:
        rr.transition_matrix(bad)
    assert exc.value.parameter == "epsilon"


def test_bad_categories():
    with pytest.raises(InputError):
        rr.privatize(np.array([0, 6]), np.random.default_rng(0))


@pytest.mark.parametrize("epsilon, k", [(1.0, 2), (4.5, 6), (2.0, 3)])
def test_flip_rate_depends_on_the_number_of_categories(epsilon, k):
    """Design §2.3: a member keeps their category with e^eps/(e^eps+k-1), so the flip rate
    is (k-1)/(e^eps+k-1) (5.26% at eps = 4.5, k = 6)."""
    assert rr.flip_rate(epsilon, k) == pytest.approx((k - 1) / (math.exp(epsilon) + k - 1))
    assert rr.flip_rate(epsilon, k) == pytest.approx(1.0 - rr.transition_matrix(epsilon, k)[0, 0])


# --- one draw per member and epoch (design §2.3) -----------------------------------------
def member_ids(n: int, prefix: str = "m") -> list[str]:
    return [f"{prefix}{i:07d}" for i in range(n)]


def agreement(epsilon: float, k: int = 6) -> float:
    """Probability that two independent randomized responses to one answer agree."""
    m = rr.transition_matrix(epsilon, k)[0]
    return float((m ** 2).sum())


@pytest.mark.parametrize("epsilon", [4.5, 1.0])
def test_per_member_draws_follow_the_transition_matrix(epsilon):
    """Over many members of one epoch, the output given each input is distributed as
    `transition_matrix` (every cell within 4 standard errors): the same mechanism as
    `privatize`, with the same flip probabilities."""
    n = 120_000
    cats = np.random.default_rng(3).integers(0, 6, n)
    out = rr.privatize_per_member(cats, member_ids(n), rr.ResponseEpoch.from_seed(90), epsilon)
    m = rr.transition_matrix(epsilon)
    for i in range(6):
        got = out[cats == i]
        freq = np.bincount(got, minlength=6) / len(got)
        se = np.sqrt(m[i] * (1 - m[i]) / len(got))
        assert np.all(np.abs(freq - m[i]) < 4 * se), (i, freq, m[i])
    p = rr.flip_rate(epsilon)
    assert abs(float((out != cats).mean()) - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_one_epoch_gives_each_member_the_same_draw_and_a_new_epoch_an_independent_one():
    n, eps = 40_000, 1.0
    ids = member_ids(n)
    cats = np.random.default_rng(4).integers(0, 6, n)
    epoch = rr.ResponseEpoch.new()
    first = rr.privatize_per_member(cats, ids, epoch, eps)
    np.testing.assert_array_equal(first, rr.privatize_per_member(cats, ids, epoch, eps))
    # the draw is the member's, not its position's: the same members in another order
    order = np.random.default_rng(5).permutation(n)
    np.testing.assert_array_equal(first[order],
                                  rr.privatize_per_member(cats[order], [ids[j] for j in order], epoch, eps))
    # another epoch: two independent draws agree with probability Σ_j M[i, j]² (0.21 at ε = 1)
    other = rr.privatize_per_member(cats, ids, rr.ResponseEpoch.new(), eps)
    q = agreement(eps)
    assert abs(float((first == other).mean()) - q) < 4 * math.sqrt(q * (1 - q) / n)


def test_a_changed_answer_gets_an_independent_draw():
    """A member whose answer changes within the epoch is drawn afresh: the outputs' offsets
    from the two answers agree only as often as two independent draws would (a shared
    draw would always agree, giving away the difference between the answers)."""
    n, eps = 40_000, 1.0
    ids = member_ids(n)
    before = np.random.default_rng(6).integers(0, 6, n)
    after = (before + 1 + np.random.default_rng(7).integers(0, 5, n)) % 6
    epoch = rr.ResponseEpoch.new()
    o1, o2 = (rr.privatize_per_member(c, ids, epoch, eps) for c in (before, after))
    same_offset = float((((o1 - before) % 6) == ((o2 - after) % 6)).mean())
    q = agreement(eps)
    assert abs(same_offset - q) < 4 * math.sqrt(q * (1 - q) / n)


def test_another_epsilon_gets_an_independent_draw():
    """Draws at two values of ε in one epoch are independent: shared uniforms would nest
    the flips (whatever the larger ε moves, the smaller moves too), so two outputs that
    differ would give the answer away (the larger ε's output would be it)."""
    n, low, high = 40_000, 1.0, 2.0
    ids, cats = member_ids(n), np.random.default_rng(8).integers(0, 6, n)
    epoch = rr.ResponseEpoch.new()
    o_low, o_high = (rr.privatize_per_member(cats, ids, epoch, e) for e in (low, high))
    moved_high_differs = float(((o_low != o_high) & (o_high != cats)).mean())  # 0 with nested flips
    q = rr.flip_rate(high) * (1 - rr.transition_matrix(low)[0, 1])
    assert abs(moved_high_differs - q) < 4 * math.sqrt(q * (1 - q) / n)


def test_epoch_secrets_and_seeds():
    with pytest.raises(InputError) as exc:
        rr.ResponseEpoch(b"short")
    assert "32 bytes" in str(exc.value)
    ids, cats = member_ids(2000), np.zeros(2000, dtype=np.int64)
    a, b, c = (rr.ResponseEpoch.from_seed(s) for s in (1, 1, 2))
    draws = [rr.privatize_per_member(cats, ids, epoch, 0.5) for epoch in (a, b, c)]
    np.testing.assert_array_equal(draws[0], draws[1])  # a seeded epoch is reproducible
    assert (draws[0] != draws[2]).any()
    assert a.fingerprint == b.fingerprint != c.fingerprint
    with pytest.raises(InputError) as exc:
        rr.privatize_per_member(cats, ids[:5], a)
    assert exc.value.parameter == "member_ids"
    with pytest.raises(InputError):
        rr.privatize_per_member(np.array([6]), ["x"], a)
    assert rr.privatize_per_member(np.zeros(0, dtype=np.int64), [], a).shape == (0,)
    oh = rr.privatize_per_member_one_hot(np.array([0, 5]), ["x", "y"], a)
    assert oh.shape == (2, 6) and (oh.sum(axis=1) == 1).all()
