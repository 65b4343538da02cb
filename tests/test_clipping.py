"""Probabilistic clipping (design §2.4)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from common.errors import InputError
from tester_service.demographics import clipping


def random_rows(rng, n=20_000):
    rows = rng.dirichlet(np.full(6, 0.15), size=n)
    rows[:500] = np.eye(6)[rng.integers(0, 6, 500)]  # one-hot (Self-ID) rows
    return rows


@pytest.mark.parametrize("t", [0.825, 0.99, 0.6, 0.4, 0.2, 0.17])
def test_invariants(t):
    rng = np.random.default_rng(3)
    p = random_rows(rng)
    q = clipping.clip(p, t, rng)
    np.testing.assert_allclose(q.sum(axis=1), 1.0, atol=1e-9)
    assert q.max() <= t and q.min() >= 0
    below = p.max(axis=1) <= t
    np.testing.assert_array_equal(q[below], p[below])  # untouched
    above = ~below
    assert (q[above].max(axis=1) < t).all()
    if t > 0.5:  # the top category stays on top, lowered by at most MAX_REDUCTION below T
        np.testing.assert_array_equal(q[above].argmax(axis=1), p[above].argmax(axis=1))
        assert (q[above].max(axis=1) >= t - clipping.MAX_REDUCTION).all()
    assert not np.shares_memory(p, q)


def test_one_hot_rows_get_spread():
    rng = np.random.default_rng(5)
    q = clipping.clip(np.eye(6), 0.825, rng)
    assert (q.max(axis=1) < 0.825).all()
    assert ((q > 0).sum(axis=1) == 6).all()  # no certain assignment, no exact zeros


@pytest.mark.parametrize("bad", [1 / 6, 0.1, 1.0, 1.5, float("nan"), "x", None])
def test_bad_threshold(bad):
    with pytest.raises(InputError) as exc:
        clipping.clip(np.eye(6), bad, np.random.default_rng(0))
    assert exc.value.parameter == "T"


def test_rule():
    """The 90th-percentile rule (design §2.4): T is the value under which 90% of the rows'
    largest probabilities fall, clamped into [RULE_MIN, RULE_MAX]; clipping at that T
    leaves those 90% of rows untouched and lowers the other 10% below T."""
    maxes = np.linspace(0.3, 0.95, 1001)
    rows = np.column_stack([maxes, np.tile((1 - maxes)[:, None] / 5, 5)])
    assert clipping.threshold_from_rule(rows) == pytest.approx(np.quantile(maxes, 0.9))
    assert clipping.threshold_from_rule(rows, 0.5) == pytest.approx(np.quantile(maxes, 0.5))

    rng = np.random.default_rng(0)
    p = random_rows(rng)
    t = clipping.threshold_from_rule(p)
    assert clipping.RULE_MIN < t < clipping.RULE_MAX
    below = p.max(axis=1) <= t
    assert abs(below.mean() - clipping.RULE_QUANTILE) < 1e-3
    q = clipping.clip(p, t, rng)
    np.testing.assert_array_equal(q[below], p[below])
    assert (q[~below].max(axis=1) < t).all()

    assert clipping.threshold_from_rule(np.eye(6)) == clipping.RULE_MAX  # all certain: clamped
    assert clipping.threshold_from_rule(np.full((10, 6), 1 / 6)) == clipping.RULE_MIN  # all flat: clamped
    with pytest.raises(InputError):
        clipping.threshold_from_rule(np.zeros((0, 6)))


def test_self_id_rows_not_distinguishable():
    """A small run of bench/clipping_auc.py: held-out logistic AUC stays near 0.5."""
    path = Path(__file__).resolve().parents[1] / "bench" / "clipping_auc.py"
    spec = importlib.util.spec_from_file_location("clipping_auc", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    combined, is_self, _ = mod.prepare(30_000, 7)
    lr, single, n_self, n_bisg = mod.measure(combined, is_self, 0.825, clipping.DIRICHLET_CONCENTRATION, 9)
    assert n_self > 1000 and n_bisg > 1000
    assert lr < 0.6 and single < 0.6
    # And the tuning matters: a spiky Dirichlet is easy to tell apart.
    lr_bad, _, _, _ = mod.measure(combined, is_self, 0.825, 0.1, 9)
    assert lr_bad > lr + 0.1
