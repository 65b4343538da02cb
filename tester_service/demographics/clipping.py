"""Probabilistic clipping of race-probability rows (design §2.4; paper section 6.1).

For every row whose largest probability ``m`` exceeds the threshold ``T``:

1. the largest entry becomes ``T − u`` with ``u ~ Uniform(0, w]`` (a small uniform
   amount, ``w = min(MAX_REDUCTION, (T − 1/6)/2)``), so it ends strictly below ``T``;
2. the removed mass ``R = m − (T − u)`` is spread over the other five categories by a
   scaled Dirichlet draw: ``x = R · D`` with ``D ~ Dirichlet(α·1)``, symmetric with
   concentration α = `DIRICHLET_CONCENTRATION`;
3. if that would lift another category above the new largest entry (only possible
   when ``T`` is small), the removed mass is spread in proportion to each category's
   room below it instead, which always fits because ``T − u > 1/6``;
4. if another entry still exceeds ``T`` (possible only when ``T < 1/2``), the row is
   clipped again (at most k passes).

Rows still sum to 1 (to 1e-9) and no entry exceeds ``T``; with ``T > 1/2`` the largest
category stays the largest. Rows at or below ``T`` are unchanged.

``T`` is either fixed (it must lie in (1/6, 1)) or, by the paper's rule, the value
under which 90% of the rows' largest BISG probabilities fall (`threshold_from_rule`;
the paper's production value was 0.825). A rule value outside
``[RULE_MIN, RULE_MAX]`` is clamped into it, so clipping still removes certain
assignments when more than 10% of rows are (near-)certain.

Purpose (design §2.4): a Self-ID row (a one-hot vector after randomized response)
and a confident BISG row both land in the band just below ``T`` and look alike, so
nobody can tell them apart, and no row is a certain assignment.
"""
from __future__ import annotations

import math

import numpy as np

from common.errors import InputError

#: Largest uniform reduction below T (step 1).
MAX_REDUCTION = 0.05

#: Dirichlet concentration α of step 2, tuned so that a classifier on the sorted clipped
#: probabilities cannot tell Self-ID rows from BISG rows in the clipped band. Measured on
#: 2026-11-25 with ``.venv/bin/python bench/clipping_auc.py --grid --threshold 0.825`` and
#: ``... --grid`` (90%-rule T, 0.99 on the synthetic data); 200,000 synthetic members,
#: seed 7: held-out AUC of a logistic regression on the sorted probabilities and their
#: logs = 0.539 (T = 0.825) and 0.545 (rule T); best single sorted feature 0.527 / 0.523.
#: α = 0.3 gives 0.73 / 0.69 and α = 5 gives 0.58 / 0.58; 2.0–3.0 is the flat minimum.
DIRICHLET_CONCENTRATION = 2.0

#: Quantile of the rows' largest BISG probabilities used by the default rule.
RULE_QUANTILE = 0.90
#: Bounds a rule-derived T is clamped into.
RULE_MIN, RULE_MAX = 0.5, 0.99


def check_threshold(threshold: float) -> float:
    """Validate a fixed T: a finite number in (1/6, 1) (design §2.4)."""
    try:
        t = float(threshold)
    except (TypeError, ValueError):
        raise InputError("must be a number", parameter="T") from None
    if not math.isfinite(t) or not (1.0 / 6.0 < t < 1.0):
        raise InputError("must be greater than 1/6 and less than 1", parameter="T")
    return t


def threshold_from_rule(probs: np.ndarray, quantile: float = RULE_QUANTILE) -> float:
    """The value under which ``quantile`` of the rows' largest probabilities fall, clamped
    into ``[RULE_MIN, RULE_MAX]`` (design §2.4, paper section 6.1)."""
    arr = np.asarray(probs, dtype=float)
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise InputError("needs at least one probability row to derive T", parameter="T")
    t = float(np.quantile(arr.max(axis=1), quantile))
    return min(max(t, RULE_MIN), RULE_MAX)


def clip(probs: np.ndarray, threshold: float, rng: np.random.Generator, *,
         concentration: float = DIRICHLET_CONCENTRATION,
         max_reduction: float = MAX_REDUCTION) -> np.ndarray:
    """Return a clipped copy of ``probs`` (``(n, k)``, rows summing to 1); see module docstring."""
    t = check_threshold(threshold)
    if not (math.isfinite(concentration) and concentration > 0):
        raise InputError("must be greater than 0", parameter="concentration")
    out = np.array(probs, dtype=float, copy=True)
    if out.ndim != 2 or out.shape[1] < 2:
        raise InputError("expects an (n, k) array of probabilities", parameter="probabilities")
    n, k = out.shape
    # With T > 1/2 one pass suffices; below, a second entry may also exceed T and is
    # clipped in the next pass (at most k passes).
    for _ in range(k):
        rows = np.flatnonzero(out.max(axis=1) > t)
        if rows.size == 0:
            break
        out[rows] = _clip_rows(out[rows], t, rng, concentration, max_reduction)
    return out


def _clip_rows(sub: np.ndarray, t: float, rng: np.random.Generator, concentration: float,
               max_reduction: float) -> np.ndarray:
    """One clipping pass over rows whose largest entry exceeds ``t`` (steps 1–3)."""
    r, k = sub.shape
    top = sub.argmax(axis=1)
    m = sub[np.arange(r), top]
    width = min(max_reduction, (t - 1.0 / k) / 2.0)
    new_max = t - width * (1.0 - rng.random(r))  # T - u, u in (0, width]
    removed = m - new_max

    others_mask = np.ones((r, k), dtype=bool)
    others_mask[np.arange(r), top] = False
    others = sub[others_mask].reshape(r, k - 1)

    # Step 2: scaled symmetric Dirichlet via normalised Gamma draws (vectorised).
    g = rng.standard_gamma(concentration, size=(r, k - 1))
    gsum = g.sum(axis=1, keepdims=True)
    underflow = gsum[:, 0] <= 0  # possible only for tiny α: use equal shares
    g[underflow] = 1.0
    gsum[underflow] = k - 1
    new_others = others + removed[:, None] * (g / gsum)

    # Step 3: a category would end above the new maximum (it did not before, or grew).
    over = ((new_others > new_max[:, None]) & (new_others > others)).any(axis=1)
    if over.any():
        room = np.clip(new_max[over, None] - others[over], 0.0, None)
        new_others[over] = others[over] + removed[over, None] * room / room.sum(axis=1, keepdims=True)

    out = sub.copy()
    out[others_mask] = new_others.ravel()
    out[np.arange(r), top] = new_max
    return out
