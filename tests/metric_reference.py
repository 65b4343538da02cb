"""Plaintext reference computations the tests compare the services against (design
§5; paper eqs. (10)-(19)); the definitions are in the docstring of
`common.metrics.scoring`, whose production helpers these reuse.

POT: `pot_curves` (eq. (12)), `dti` (eq. (11)). Exact MQOS-AUC: `auc_from_aggregates`,
`linear_auc`, `linear_auc_by_group` (the linear form), `random_groups` and
`random_group_interval` (the random-groups interval). Sampled MQOS-AUC: `sampled_auc`
(eq. (17)). Probabilistic count: `poisson_binomial_tail` (one column of
`count_summary`).
"""
from __future__ import annotations

import numpy as np

from common.errors import InputError
from common.metrics.scoring import (_as_matrix, _as_vector, _check_groups, _doubled_a, _kernel, _ratio, count_summary,
                                    dense_score_rank)
from common.stats.quantiles import student_t_quantile


def pot_curves(p: np.ndarray, scores: np.ndarray, outcome: np.ndarray, refs: np.ndarray,
               h: float) -> np.ndarray:
    """m_j(s_q) of eq. (12), shape (Q, k); NaN where the denominator is 0."""
    s = _as_vector(scores, name="scores")
    y = _as_vector(outcome, s.size, name="outcome")
    w = _as_matrix(p, s.size)
    k = _kernel(s, _as_vector(refs, name="reference scores"), h)
    return _ratio((k * y[:, None]).T @ w, k.T @ w)


def dti(curves: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """DTI_ab = sum_q w_q (m_a(s_q) - m_b(s_q)) of eq. (11), shape (k, k) (antisymmetric).

    ``curves`` is the (Q, k) output of ``pot_curves``; a NaN point makes the cells of
    its group NaN."""
    m = np.asarray(curves, dtype=np.float64)
    w = _as_vector(weights, name="weights")
    if m.ndim != 2 or m.shape[0] != w.size:
        raise ValueError("curves must be (Q, k) with one weight per reference score")
    return np.einsum("q,qab->ab", w, m[:, :, None] - m[:, None, :])


def auc_from_aggregates(L: np.ndarray, T: np.ndarray, Q: np.ndarray,
                        S: np.ndarray) -> np.ndarray:
    """AUC_j = (L_j - (T_j^2 - Q_j)/2) / (T_j (S_j - T_j)); NaN where the group has no
    positive or no negative weight."""
    L, T, Q, S = (np.asarray(v, dtype=np.float64) for v in (L, T, Q, S))
    return _ratio(L - (T * T - Q) / 2.0, T * (S - T))


def _auc_inputs(p, y, scores):
    s = _as_vector(scores, name="scores")
    yy = _as_vector(y, s.size, name="y")
    w = _as_matrix(p, s.size)
    if not np.isin(yy, (0.0, 1.0)).all():
        raise ValueError("y must be 0 or 1")
    return w, yy, s


def linear_auc(p: np.ndarray, y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Plaintext reference of the exact MQOS-AUC (linear form), shape (k,)."""
    w, yy, s = _auc_inputs(p, y, scores)
    a = _doubled_a(dense_score_rank(s), w, None) / 2.0
    wy = w * yy[:, None]
    return auc_from_aggregates((wy * a).sum(0), wy.sum(0), (wy * w).sum(0), w.sum(0))


def linear_auc_by_group(p: np.ndarray, y: np.ndarray, scores: np.ndarray,
                        groups: np.ndarray, n_groups: int) -> np.ndarray:
    """The exact AUC inside each random group, shape (n_groups, k): A, L, T, Q, S are all
    computed over that group's rows only (so each value is the AUC of that subsample);
    NaN where a group lacks positive or negative weight."""
    w, yy, s = _auc_inputs(p, y, scores)
    g = _check_groups(groups, s.size)
    if g.size and (g.min() < 0 or g.max() >= n_groups):
        raise ValueError("group indices must lie in [0, n_groups)")
    a = _doubled_a(dense_score_rank(s), w, g) / 2.0
    wy = w * yy[:, None]

    def per_group(values: np.ndarray) -> np.ndarray:
        return np.stack([np.bincount(g, weights=values[:, c], minlength=n_groups)
                         for c in range(values.shape[1])], axis=1)

    return auc_from_aggregates(per_group(wy * a), per_group(wy), per_group(wy * w),
                               per_group(w))


def random_groups(n: int, G: int, rng: np.random.Generator) -> np.ndarray:
    """A random partition of n rows into G groups whose sizes differ by at most one:
    int64 group index (0..G-1) per row."""
    if int(G) != G or G < 2:
        raise InputError("must be an integer of at least 2", parameter="random groups")
    if n < G:
        raise InputError(f"needs at least as many rows as groups ({G})",
                         parameter="random groups")
    out = np.empty(n, dtype=np.int64)
    out[rng.permutation(n)] = np.arange(n, dtype=np.int64) % int(G)
    return out


def random_group_interval(full: np.ndarray, per_group: np.ndarray,
                          confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Random-groups (Wolter) confidence interval, per column.

    ``full`` (C,): the estimates on all rows; ``per_group`` (G, C): the same statistics
    recomputed within each random group. Over the G' groups where a column's value is
    defined (NaN ignored): est +- t_{G'-1, 1-alpha/2} sd(theta_g) / sqrt(G') with
    alpha = 1 - confidence. NaN where G' < 2 or the full estimate is NaN.
    """
    if not 0 < confidence < 1:
        raise ValueError("confidence must lie in (0, 1)")
    est = np.atleast_1d(np.asarray(full, dtype=np.float64))
    theta = np.asarray(per_group, dtype=np.float64)
    if theta.ndim == 1:
        theta = theta[:, None]
    if theta.ndim != 2 or theta.shape[1] != est.size:
        raise ValueError("per_group must be (G, C) with C = len(full)")
    ok = np.isfinite(theta)
    g_eff = ok.sum(axis=0)
    safe = np.where(ok, theta, 0.0)
    mean = _ratio(safe.sum(0), g_eff)
    dev = np.where(ok, theta - mean, 0.0)
    var = _ratio((dev * dev).sum(0), g_eff - 1)
    half = np.full(est.shape, np.nan)
    enough = g_eff >= 2
    if enough.any():
        t = student_t_quantile(0.5 + confidence / 2.0, g_eff[enough] - 1)
        half[enough] = t * np.sqrt(var[enough] / g_eff[enough])
    return est - half, est + half


def sampled_auc(p: np.ndarray, first: np.ndarray, second: np.ndarray,
                indicator: np.ndarray) -> np.ndarray:
    """Plaintext reference of eq. (17): sum p_fj p_sj ind / sum p_fj p_sj, shape (k,)."""
    w = _as_matrix(p)
    f = _as_vector(first, name="first", dtype=np.int64)
    s = _as_vector(second, f.size, name="second", dtype=np.int64)
    ind = _as_vector(indicator, f.size, name="indicator")
    pair = w[f] * w[s]
    return _ratio(ind @ pair, pair.sum(0))


def poisson_binomial_tail(p: np.ndarray, T: int) -> float:
    """Pr(N >= T) for N = sum_i Bernoulli(p_i), exactly (DP truncated at T, O(n T))."""
    w = _as_vector(p, name="p")
    return float(count_summary(w[:, None], T)[0][0])
