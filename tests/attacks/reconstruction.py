"""(c) Compressed-sensing reconstruction over many audits (paper, Algorithm 2, sign fixed).

The attacker fixes a set U of n users (the members it wants to learn, here the targets
among other users it cannot tell apart) and `n_pad` padding users, every row a true
negative (y_true = 0), and runs m audits; in audit i a random half of U is predicted
positive (the sensing matrix H, m × n, Bernoulli(1/2)) and the padding never. ERO's FPR
of group j in audit i is then

    FPR_ij = (H p_j)_i / D_j,    D_j = Σ_{U ∪ pad} p_tj  (the same in every audit),

one linear measurement of the column p_j = (p_tj)_{t ∈ U} per group and audit. The
attacker's prior is public BISG, r̄_j; the Tester's vectors equal it (up to clipping)
except for Self-ID members, so p_j = r̄_j + s_j with s_j sparse, and the measurement of
s is

    η_ij = D_j · FPR_ij − (H r̄_j)_i = (H s_j)_i

(the paper's η = SP − H·r̄ printed with the wrong sign: with v = r̄ − s, the measurement
is H·r̄ − SP = H·s). D_j is unknown to the attacker, so it is a free variable of the
recovery, a linear program (scipy HiGHS):

    min Σ|s_tj| + λ Σ|e_ij|   s.t.   (H (r̄_j + s_j))_i − FPR_ij · D_j = e_ij,
                                   r̄_t + s_t ≥ 0,  Σ_j (r̄_tj + s_tj) = 1,  D_j ≥ 0,

basis pursuit with an L1 residual e, robust to the few measurements that a re-drawn
Self-ID answer (the Tester redraws randomized response in every audit) makes
inconsistent. Groups an audit did not release (suppressed, refused) give no equation.
The guess for a target is the argmax of its recovered deviation s_t (`harness.guess`):
what the audits added to public BISG; no deviation recovered means a uniform guess.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix, hstack, identity, vstack

from tests.attacks.harness import K, Attacker, Outcome, ero_frame, score

N_MEMBERS = 60
N_PAD = 110
N_AUDITS = 40
#: weight of a measurement residual against a deviation from public BISG (both in
#: member units: one member's probability)
RESIDUAL_WEIGHT = 2.0
#: a recovered deviation smaller than this is no deviation
DEVIATION_TOL = 0.05


def recover(H: np.ndarray, fpr: np.ndarray, prior: np.ndarray, *, residual_weight: float = RESIDUAL_WEIGHT
            ) -> tuple[np.ndarray, np.ndarray]:
    """(p̂ (n × K), D̂ (K)) from the released FPRs `fpr` (m × K, NaN: not released)."""
    m, n = H.shape
    rows = [(i, j) for i in range(m) for j in range(K) if np.isfinite(fpr[i, j])]
    nv_p = n * K  # s⁺ and s⁻ each n·K (index t*K + j), then D (K), then e⁺, e⁻ (len(rows) each)
    r = len(rows)
    # equality block 1: Σ_t H_it (s⁺ − s⁻)_tj − FPR_ij D_j − e⁺ + e⁻ = −(H r̄_j)_i
    ri, ci, vals = [], [], []
    rhs1 = np.empty(r)
    for k, (i, j) in enumerate(rows):
        cols = np.nonzero(H[i])[0]
        ri += [k] * (2 * len(cols) + 1)
        ci += [t * K + j for t in cols] + [nv_p + t * K + j for t in cols] + [2 * nv_p + j]
        vals += [1.0] * len(cols) + [-1.0] * len(cols) + [-fpr[i, j]]
        rhs1[k] = -float(H[i] @ prior[:, j])
    a_dev = coo_matrix((vals, (ri, ci)), shape=(r, 2 * nv_p + K))
    eq1 = hstack([a_dev, -identity(r), identity(r)])
    # equality block 2: Σ_j s_tj = 0 (rows of p sum to 1, as r̄'s do)
    ri = np.repeat(np.arange(n), 2 * K)
    ci = np.concatenate([[t * K + j for j in range(K)] + [nv_p + t * K + j for j in range(K)] for t in range(n)])
    vals = np.tile(np.r_[np.ones(K), -np.ones(K)], n)
    eq2 = hstack([coo_matrix((vals, (ri, ci)), shape=(n, 2 * nv_p + K)), coo_matrix((n, 2 * r))])
    a_eq = vstack([eq1, eq2]).tocsr()
    b_eq = np.r_[rhs1, np.zeros(n)]
    # p ≥ 0: s⁻ ≤ r̄ (and s⁺ ≤ 1 − r̄)
    flat = prior.reshape(-1)
    bounds = ([(0.0, 1.0 - x) for x in flat] + [(0.0, x) for x in flat] + [(0.0, None)] * K
              + [(0.0, None)] * (2 * r))
    cost = np.r_[np.ones(2 * nv_p), np.zeros(K), np.full(2 * r, residual_weight)]
    res = linprog(cost, A_eq=a_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if not res.success:
        return prior.copy(), np.full(K, np.nan)
    x = res.x
    s = (x[:nv_p] - x[nv_p:2 * nv_p]).reshape(n, K)
    return prior + s, x[2 * nv_p:2 * nv_p + K]


def run(attacker: Attacker, targets: Sequence[str], *, n_members: int = N_MEMBERS, n_pad: int = N_PAD,
        n_audits: int = N_AUDITS, seed: int = 0) -> Outcome:
    pop = attacker.population
    rng = np.random.default_rng(seed)
    others = pop.others(n_members - len(targets), rng, exclude=targets)
    members = list(rng.permutation(np.array([*targets, *others], dtype=object)))
    pad = pop.others(n_pad, rng, exclude=members)
    H = rng.integers(0, 2, size=(n_audits, len(members)))
    fpr = np.full((n_audits, K), np.nan)
    ids = [*members, *pad]
    for i in range(n_audits):
        fpr[i] = attacker.audit(ero_frame(ids, np.zeros(len(ids)), np.r_[H[i], np.zeros(n_pad)])).vector()
    prior = pop.public(members)
    p_hat, _ = recover(H, fpr, prior)
    deviation = p_hat - prior
    deviation[np.abs(deviation) < DEVIATION_TOL] = 0.0
    where = {m: k for k, m in enumerate(members)}
    informed = [attacker.answered > 0] * len(targets)  # whatever was answered went into the recovery
    return score("reconstruction", attacker, targets, [deviation[where[t]] for t in targets], informed, seed=seed)
