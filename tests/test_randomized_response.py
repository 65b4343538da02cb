"""k-ary randomized response (design §2.3)."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from common import randomized_response as rr
from common.errors import InputError


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
