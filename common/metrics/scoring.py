"""Score-based metrics in plaintext: POT, MQOS-AUC (exact and sampled), probabilistic count.

Definitions: design §5.5, §5.6 and §5.8 and the
paper (design §10), appendix B and C, equations (10)-(19).
Every function here is pure numpy on plaintext arrays; the encryption layer calls them
to prepare the per-row values it encrypts (or the plaintext weights it multiplies). The
plaintext reference forms the tests check the encrypted protocol against (POT curves,
DTI, the linear AUC, the random-groups interval, the sampled AUC, the Poisson-binomial
tail of one column) are in tests/metric_reference.py.
``p`` is always the (n, k) matrix of group probabilities p_ij = Pr(R_i = j).

POT (pointwise outcome test, eqs. (10)-(12))
    Nadaraya-Watson regression of the outcome on the score per group at reference
    scores s_q (by default the score deciles), with a Gaussian kernel of bandwidth h_q
    per reference score (by default ``curve_bandwidths``):
    m_j(s_q) = sum_i p_ij K((S_i - s_q)/h_q) Y_i / sum_i p_ij K((S_i - s_q)/h_q).
    The kernel is left unnormalised (no 1/(h sqrt(2 pi))): the factor cancels in the
    ratio. P2 computes the per-row columns (``kernel_components``), P1 weights them
    by p_ij. Summary (eq. (11)): DTI_ab = sum_q w_q (m_a(s_q) - m_b(s_q)).

MQOS-AUC, exact (eqs. (13)-(16), in the linear form of design §5.6)
    With w(i, l) = 1 if s_i > s_l, 1/2 if tied, 0 otherwise,
    A_j(i) = sum_{l != i} w(i, l) p_lj (P1, in plaintext, from P2's score ranks),
    L_j = sum_i p_ij A_j(i) y_i,  T_j = sum_i p_ij y_i,  Q_j = sum_i p_ij^2 y_i,
    S_j = sum_i p_ij, and
        AUC_j = (L_j - (T_j^2 - Q_j)/2) / (T_j (S_j - T_j)),
    which equals the double sum over positive-negative pairs
    sum_{i,l} p_ij p_lj y_i (1 - y_l) w(i, l) / sum_{i,l} p_ij p_lj y_i (1 - y_l), and the
    trapezoidal ROC area of eq. (16) (scikit-learn's AUC on hard groups, ties included).
    Uncertainty: the random-groups method (Wolter): the rows are split at random into
    G groups, the statistic is recomputed inside each group (A over that group's rows
    only), and est +- t_{G'-1} sd(theta_g) / sqrt(G') is the interval.

MQOS-AUC, sampled Mann-Whitney (eq. (17))
    m positive-negative pairs drawn with replacement; each pair's members are sent in
    random order so the receiver cannot tell the positive; the pair weight is
    p_fj p_sj and the encrypted value the comparison indicator (1, 1/2 for a tie, 0).
    What the protocol sends (``sample_pair_graph``): a random graph over all members,
    drawn without the labels, whose positive-negative edges are the pairs and whose
    other edges are dummies valued 0, so the graph says nothing about labels.

Probabilistic count (eqs. (18)-(19), C.2)
    Pr(N_j >= T) for N_j = sum_i Bernoulli(p_ij) over a pool (Poisson-binomial tail);
    T = 1 gives eq. (19), 1 - prod_i (1 - p_ij). Not linear: computed by P1 without HE.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from common.errors import InputError
from common.tables import first_row

__all__ = [
    "DEFAULT_RANDOM_GROUPS",
    "DECILES",
    "MAX_REFERENCE_SCORES",
    "MAX_EXACT_ROWS",
    "WEIGHT_SCALE",
    "reference_scores",
    "silverman_bandwidth",
    "curve_bandwidths",
    "kernel_components",
    "dense_score_rank",
    "doubled_a_weights",
    "sample_pairs",
    "sample_capped_pairs",
    "pair_graph_size",
    "sample_pair_graph",
    "count_summary",
]

#: Default number of random groups for the MQOS-AUC interval, chosen by simulation
#: (binormal scores, 3 groups, 1000 data sets each, 95% intervals): with G = 10 the
#: coverage of the group AUCs and of the global-minus-group differences was 0.95-0.96
#: for n = 2000 (equal groups), n = 3000 (a group of 5%, about 150 rows) and n = 5000.
#: Larger G over-covers small groups (G = 20: up to 0.98, G = 50: up to 0.996, the
#: within-group AUC of a few rows is noisier than the full-data variance implies);
#: smaller G widens the interval through the t quantile (G = 5: 15-20% wider).
DEFAULT_RANDOM_GROUPS = 10

#: The default POT reference points are the score deciles.
DECILES = tuple(q / 10 for q in range(1, 10))

#: At most this many POT reference scores (each one is two encrypted columns per row).
MAX_REFERENCE_SCORES = 64

#: Integer probability weights are scaled by 2^32 (each row sums to WEIGHT_SCALE).
WEIGHT_SCALE = 1 << 32

#: ``doubled_a_weights`` is exact in int64 below this many rows: with every weight at
#: most 2^32, 2A_j(i) <= 2 n 2^32 = n 2^33 < 2^62 (a factor 2 of headroom below 2^63).
MAX_EXACT_ROWS = 1 << 29


# --------------------------------------------------------------------------- helpers

def _as_matrix(p: np.ndarray, n: int | None = None, name: str = "p") -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2:
        raise ValueError(f"{name} must be an (n, k) matrix")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} rows, expected {n}")
    return arr


def _as_vector(x: np.ndarray, n: int | None = None, name: str = "array",
               dtype=np.float64) -> np.ndarray:
    arr = np.asarray(x, dtype=dtype)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional")
    if n is not None and arr.shape[0] != n:
        raise ValueError(f"{name} has {arr.shape[0]} rows, expected {n}")
    return arr


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den elementwise, NaN where den == 0 (no warning)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, np.nan)
    np.divide(num, den, out=out, where=den != 0)
    return out


# --------------------------------------------------------------------------- POT

def reference_scores(scores: np.ndarray, given: Sequence[float] | None = None) -> np.ndarray:
    """The POT reference points s_q (eqs. (10)-(12)), sorted ascending.

    By default the deciles of ``scores`` (quantiles 0.1, ..., 0.9: up to 9 points, with
    duplicates removed). ``given`` is used as is (sorted): it must hold 1 to
    MAX_REFERENCE_SCORES finite values, all different (InputError on the parameter
    "reference scores" otherwise).
    """
    if given is not None:
        try:
            refs = np.asarray(list(given), dtype=np.float64)
        except (TypeError, ValueError):
            raise InputError("must be a list of numbers", parameter="reference scores") from None
        if refs.ndim != 1 or refs.size == 0:
            raise InputError("needs at least one score", parameter="reference scores")
        if refs.size > MAX_REFERENCE_SCORES:
            raise InputError(f"at most {MAX_REFERENCE_SCORES} scores are allowed",
                             parameter="reference scores")
        if not np.isfinite(refs).all():
            raise InputError("must be finite numbers", parameter="reference scores")
        refs = np.sort(refs)
        if (refs[1:] <= refs[:-1]).any():
            raise InputError("must all be different", parameter="reference scores")
        return refs
    s = _as_vector(scores, name="scores")
    if s.size == 0:
        raise ValueError("no scores to take deciles of")
    return np.unique(np.quantile(s, DECILES))


def silverman_bandwidth(scores: np.ndarray, file: str) -> float:
    """Silverman's rule of thumb h = 0.9 min(sd, IQR/1.34) n^(-1/5).

    When the IQR is 0 (more than half the scores equal) sd alone is used; when sd is 0
    too (all scores equal, or a single row) there is no bandwidth: InputError naming
    ``file`` and the column "score"; so is a spread too wide for float64 (scores near
    1e308, where sd or h would overflow). A non-finite score is an InputError with its row.
    """
    s = _as_vector(scores, name="scores")
    bad = ~np.isfinite(s)
    if bad.any():
        raise InputError("is not a finite number", file=file, column="score", row=first_row(bad))
    n = s.size
    if n < 2:
        raise InputError("needs at least two scores to choose a kernel bandwidth",
                         file=file, column="score")
    if s.max() == s.min():     # sd would be 0 (or rounding noise)
        raise InputError("all scores are equal; the kernel bandwidth would be zero",
                         file=file, column="score")
    with np.errstate(over="ignore", invalid="ignore"):
        sd = float(np.std(s, ddof=1))
        q75, q25 = np.percentile(s, [75.0, 25.0])
        spread = min(sd, float(q75 - q25) / 1.34)
    if spread <= 0:
        spread = sd
    h = 0.9 * spread * n ** (-0.2)
    if not (math.isfinite(h) and h > 0):  # scores near the float64 limit: their spread overflows
        raise InputError("the scores are spread too widely for a kernel bandwidth (set the bandwidth parameter, or "
                         "rescale the scores)", file=file, column="score")
    return h


#: the default curve bandwidth is Silverman's rule for a group holding this fraction of the rows
CURVE_GROUP_SHARE = 1.0 / 50.0
#: the share of the scores in the window whose width sets a reference score's bandwidth
NEIGHBOUR_SHARE = 0.1
#: how far a reference score's bandwidth may stray from the median one (either way)
MAX_BANDWIDTH_RATIO = 4.0


def curve_bandwidths(scores: np.ndarray, refs: np.ndarray, file: str) -> np.ndarray:
    """POT's default bandwidth per reference score (design §5.5, docs/metrics/pot.md).

    Two departures from Silverman's rule on all n scores, both because a curve is read per
    group and each of its points is a ratio over the group's kernel mass Σ_i p_ij·K_q:

    * the scale is Silverman's rule for a group of CURVE_GROUP_SHARE·n rows,
      0.9·min(sd, IQR/1.34)·(n/50)^(-1/5) (50^(1/5) ≈ 2.19 times the whole table's), so
      that a group of a few per cent of the rows has a curve point resting on some hundreds
      of its members rather than tens (the release noise of a point falls as its mass
      grows; the bandwidth still shrinks as n^(-1/5));
    * the width follows the scores' local spacing (a nearest-neighbour bandwidth): h_q is
      the scale times w_q/median(w), where w_q is the width of the window of the
      NEIGHBOUR_SHARE of the scores centred (in rank) on s_q, so every reference score's
      kernel holds about as many rows (the deciles in a distribution's tails no longer rest
      on a third of the rows the middle ones do). The ratio is kept within
      [1/MAX_BANDWIDTH_RATIO, MAX_BANDWIDTH_RATIO]; a window of width 0 (tied scores) takes
      the scale itself.

    Errors as ``silverman_bandwidth``'s (too few or equal scores: InputError naming
    ``file`` and the column "score")."""
    scale = silverman_bandwidth(scores, file) * CURVE_GROUP_SHARE ** -0.2   # rows checked, named there
    s = np.sort(_as_vector(scores, name="scores"))
    r = _as_vector(refs, name="reference scores")
    rank = np.clip(np.searchsorted(s, r) / s.size, NEIGHBOUR_SHARE / 2, 1.0 - NEIGHBOUR_SHARE / 2)
    width = np.quantile(s, rank + NEIGHBOUR_SHARE / 2) - np.quantile(s, rank - NEIGHBOUR_SHARE / 2)
    middle = float(np.median(width))
    if not (math.isfinite(middle) and middle > 0):
        return np.full(r.shape, scale)
    ratio = np.where(width > 0, width / middle, 1.0)
    return scale * np.clip(ratio, 1.0 / MAX_BANDWIDTH_RATIO, MAX_BANDWIDTH_RATIO)


def _kernel(scores: np.ndarray, refs: np.ndarray, h) -> np.ndarray:
    """K_q(S_i) = exp(-((S_i - s_q)/h_q)^2 / 2), (n, Q); ``h`` one bandwidth or one per reference score."""
    hq = np.broadcast_to(np.asarray(h, dtype=np.float64), refs.shape)
    if not (np.isfinite(hq).all() and (hq > 0).all()):
        raise ValueError("the bandwidth must be a positive number")
    with np.errstate(over="ignore"):  # a distance beyond float64 gives a kernel of exactly 0
        z = (scores[:, None] - refs[None, :]) / hq[None, :]
        return np.exp(-0.5 * z * z)


def kernel_components(scores: np.ndarray, outcome: np.ndarray, refs: np.ndarray,
                      h) -> np.ndarray:
    """P2's per-row POT values, shape (n, 2Q): columns [K_1 Y, K_1, K_2 Y, K_2, ...] with
    K_q = exp(-((S_i - s_q)/h_q)^2 / 2) (unnormalised Gaussian kernel; ``h`` one bandwidth
    or one per reference score)."""
    s = _as_vector(scores, name="scores")
    y = _as_vector(outcome, s.size, name="outcome")
    r = _as_vector(refs, name="reference scores")
    k = _kernel(s, r, h)
    out = np.empty((s.size, 2 * r.size))
    out[:, 0::2] = k * y[:, None]
    out[:, 1::2] = k
    return out


# --------------------------------------------------------------------------- exact AUC

def dense_score_rank(scores: np.ndarray) -> np.ndarray:
    """Ascending dense rank of the scores (0 for the lowest; tied scores share a rank)."""
    s = _as_vector(scores, name="scores")
    _, inverse = np.unique(s, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64)


def _doubled_a(rank: np.ndarray, q: np.ndarray, groups: np.ndarray | None) -> np.ndarray:
    """2 A_j(i) for int64 or float64 weights q (n, k); A only over rows of i's group."""
    n = rank.size
    if n == 0:
        return np.zeros_like(q)
    keys = (rank,) if groups is None else (rank, groups)
    order = np.lexsort(keys)                  # by group, then by rank
    qs = q[order]
    new_level = np.empty(n, dtype=bool)
    new_level[0] = True
    new_level[1:] = rank[order][1:] != rank[order][:-1]
    if groups is not None:
        gs = groups[order]
        new_group = np.empty(n, dtype=bool)
        new_group[0] = True
        new_group[1:] = gs[1:] != gs[:-1]
        new_level |= new_group
    starts = np.flatnonzero(new_level)
    level_sum = np.add.reduceat(qs, starts, axis=0)               # (levels, k)
    below = np.zeros_like(level_sum)
    np.cumsum(level_sum[:-1], axis=0, out=below[1:])               # sum over lower levels
    if groups is not None:
        # subtract what lies below the first level of the level's own group
        level_group_start = new_group[starts]
        first_level = np.flatnonzero(level_group_start)
        owner = first_level[np.cumsum(level_group_start) - 1]
        below = below - below[owner]
    level_of_row = np.cumsum(new_level) - 1
    doubled = 2 * below[level_of_row] + level_sum[level_of_row] - qs
    out = np.empty_like(doubled)
    out[order] = doubled
    return out


def _check_groups(groups: np.ndarray | None, n: int) -> np.ndarray | None:
    if groups is None:
        return None
    g = _as_vector(groups, n, name="groups", dtype=np.int64)
    return g


def doubled_a_weights(rank: np.ndarray, q: np.ndarray,
                      groups: np.ndarray | None = None) -> np.ndarray:
    """2 A_j(i) exactly, as int64 (n, k), from dense score ranks and integer weights.

    ``rank`` (n,): dense ranks (``dense_score_rank``); ``q`` (n, k) integer weights in
    [0, WEIGHT_SCALE] (probabilities scaled by 2^32, rows summing to 2^32). Returns
        2 A_j(i) = 2 sum_{l: rank_l < rank_i} q_lj + sum_{l != i: rank_l = rank_i} q_lj
    (doubled, so that the half weight of ties stays an integer), in O(n log n + n k):
    one sort and cumulative sums per rank level. With ``groups`` (n,) given, l runs only
    over the rows of i's own group (the random-groups interval).

    Exact for n < MAX_EXACT_ROWS = 2^29 (every value is at most n 2^33 < 2^62); larger
    inputs, or weights outside [0, 2^32], raise ValueError.
    """
    r = _as_vector(rank, name="rank", dtype=np.int64)
    qa = np.asarray(q)
    if qa.ndim == 1:
        qa = qa[:, None]
    if qa.ndim != 2 or qa.shape[0] != r.size:
        raise ValueError("q must be an (n, k) matrix with one row per rank")
    if not np.issubdtype(qa.dtype, np.integer):
        raise ValueError("q must hold integers (probabilities scaled by 2^32)")
    if r.size >= MAX_EXACT_ROWS:
        raise ValueError(f"{r.size} rows: doubled_a_weights is exact only below 2^29 rows")
    qa = qa.astype(np.int64, copy=False)
    if qa.size and (qa.min() < 0 or qa.max() > WEIGHT_SCALE):
        raise ValueError("q must lie in [0, 2^32]")
    return _doubled_a(r, qa, _check_groups(groups, r.size))


# --------------------------------------------------------------------------- sampled AUC

def sample_pairs(y: np.ndarray, scores: np.ndarray, m: int, rng: np.random.Generator,
                 file: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """m positive-negative pairs for the sampled Mann-Whitney AUC (eq. (17)).

    Positive and negative row indices are drawn independently and uniformly with
    replacement; each pair's two members are then put in random order, so whoever
    receives (first, second) cannot tell which one is the positive. Returns
    ``first`` (m,) int64, ``second`` (m,) int64 and ``indicator`` (m,) float64:
    1 if s_pos > s_neg, 0.5 if equal, 0 otherwise. No positive or no negative row is
    an InputError naming ``file`` and the column "y_true".
    """
    s = _as_vector(scores, name="scores")
    yy = _as_vector(y, s.size, name="y")
    bad = ~np.isin(yy, (0.0, 1.0))
    if bad.any():
        raise InputError("must be 0 or 1", file=file, column="y_true", row=first_row(bad))
    if int(m) != m or m < 1:
        raise InputError("must be a positive integer", parameter="sampled pairs")
    pos = np.flatnonzero(yy == 1)
    neg = np.flatnonzero(yy == 0)
    if pos.size == 0:
        raise InputError("has no positive outcome (1); the AUC needs both classes",
                         file=file, column="y_true")
    if neg.size == 0:
        raise InputError("has no negative outcome (0); the AUC needs both classes",
                         file=file, column="y_true")
    m = int(m)
    i = pos[rng.integers(0, pos.size, m)]
    l = neg[rng.integers(0, neg.size, m)]
    indicator = np.where(s[i] > s[l], 1.0, np.where(s[i] == s[l], 0.5, 0.0))
    swap = rng.random(m) < 0.5
    first = np.where(swap, l, i).astype(np.int64)
    second = np.where(swap, i, l).astype(np.int64)
    return first, second, indicator


def sample_capped_pairs(y: np.ndarray, scores: np.ndarray, m: int, cap: int, rng: np.random.Generator,
                        file: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Like `sample_pairs`, with no member in more than ``cap`` pairs: each positive and
    each negative gets ``cap`` slots, min(m, cap·#positives, cap·#negatives) positive
    slots and as many negative slots are drawn without replacement and paired at random.
    Every positive-negative pair is equally likely to be drawn (the estimate's mean is
    the AUC, as with `sample_pairs`); a member's pairs never exceed ``cap``, which the
    release noise is sized from (`common.metrics.mqos_auc`)."""
    first, second, indicator = sample_pairs(y, scores, 1, rng, file)  # the checks only
    if int(cap) != cap or cap < 1:
        raise InputError("must be a positive integer", parameter="pairs per member")
    yy = np.asarray(y, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    pos, neg = np.flatnonzero(yy == 1), np.flatnonzero(yy == 0)
    cap = int(cap)
    kept = min(int(m), cap * pos.size, cap * neg.size)
    i = pos[rng.choice(cap * pos.size, kept, replace=False) // cap]
    l = neg[rng.choice(cap * neg.size, kept, replace=False) // cap]
    indicator = np.where(s[i] > s[l], 1.0, np.where(s[i] == s[l], 0.5, 0.0))
    swap = rng.random(kept) < 0.5
    first = np.where(swap, l, i).astype(np.int64)
    second = np.where(swap, i, l).astype(np.int64)
    return first, second, indicator


#: the pair graph's real pairs are aimed this many standard deviations below their
#: expected count (`pair_graph_size`), so the count kept is fixed in advance in all but
#: about 3·10^-5 of the draws
PAIR_GRAPH_MARGIN_SD = 4.0


def pair_graph_size(n_pos: int, n_neg: int, m: int, cap: int) -> tuple[int, int]:
    """(edges, real pairs kept) of the sampled AUC's pair graph (`sample_pair_graph`), from
    the table's aggregates alone. Every member has ``cap`` slots; an edge joins two slots
    drawn at random, and is a real (positive-negative) pair with probability
    q = 2·P·cap·N·cap / (S·(S − 1)), S = cap·(P + N), about 2π(1 − π) for a positive rate
    π. The edges are the fewest whose real count R (mean E·q, sd at most sqrt(E·q·(1 − q)))
    is at least m but with probability about 3·10^-5 (`PAIR_GRAPH_MARGIN_SD`), and at most
    S/2 (every slot used once); the pairs kept are min(m, E·q − 4 sd)."""
    slots = cap * (n_pos + n_neg)
    q = 2.0 * (cap * n_pos) * (cap * n_neg) / (slots * (slots - 1.0))
    z, spread = PAIR_GRAPH_MARGIN_SD, math.sqrt(q * (1.0 - q))
    root = (z * spread + math.sqrt(z * z * spread * spread + 4.0 * q * m)) / (2.0 * q)
    edges = min(math.ceil(root * root), slots // 2)
    kept = min(int(m), max(0, math.floor(edges * q - z * math.sqrt(edges * q * (1.0 - q)))))
    return edges, kept


def sample_pair_graph(y: np.ndarray, scores: np.ndarray, m: int, cap: int, rng: np.random.Generator,
                      file: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The sampled AUC's rows as a label-independent random graph (docs/metrics/mqos-auc.md,
    "What the Tester sees"). Every member gets ``cap`` slots; ``edges`` pairs of slots are
    drawn at random (`pair_graph_size`), an edge joining a member to itself is dropped, so
    no member is in more than ``cap`` rows and which members a row joins depends on
    neither labels nor scores. An edge of a positive and a negative is a real pair,
    valued (1(s_pos > s_neg), ½ for a tie; 1); any other edge, and the real pairs beyond
    the count kept (chosen at random), is a dummy valued (0; 0). The real pairs kept are
    uniform over the positive-negative pairs, as `sample_capped_pairs`'s.

    Returns ``first``, ``second`` (rows,) int64, ``values`` (rows, 2) float64 (win, one)
    and the count of real pairs kept."""
    sample_pairs(y, scores, 1, rng, file)  # the checks only
    if int(cap) != cap or cap < 1:
        raise InputError("must be a positive integer", parameter="pairs per member")
    yy = np.asarray(y, dtype=np.float64)
    s = np.asarray(scores, dtype=np.float64)
    cap = int(cap)
    edges, target = pair_graph_size(int((yy == 1).sum()), int((yy == 0).sum()), int(m), cap)
    first, second = _random_edges(yy.size, cap, edges, rng)
    real = np.flatnonzero(yy[first] != yy[second])
    kept = real if real.size <= target else rng.choice(real, target, replace=False)
    pos = np.where(yy[first[kept]] == 1, first[kept], second[kept])
    neg = np.where(yy[first[kept]] == 1, second[kept], first[kept])
    values = np.zeros((first.size, 2))
    values[kept, 0] = np.where(s[pos] > s[neg], 1.0, np.where(s[pos] == s[neg], 0.5, 0.0))
    values[kept, 1] = 1.0
    return first, second, values, int(kept.size)


def _random_edges(n: int, cap: int, edges: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``edges`` disjoint pairs of the n·cap slots (cap per member), in random order, as
    member indices; self-pairs dropped."""
    slots = rng.permutation(n * cap)[:2 * edges] // cap
    first, second = slots[0::2].astype(np.int64), slots[1::2].astype(np.int64)
    distinct = first != second
    return first[distinct], second[distinct]


# --------------------------------------------------------------------------- count

def _tail_states(p: np.ndarray, T: int) -> np.ndarray:
    """Pr(N_j >= T) per column of p (n, k), for 1 <= T <= n.

    State of a set of rows: [Pr(N=0), ..., Pr(N=T-1), Pr(N>=T)] - only sums and products
    of non-negative numbers, so even a tiny tail keeps its relative precision (no
    1 - sum cancellation). The rows are cut into B blocks of b >= max(sqrt(n), T) rows:
    a step-by-step DP runs inside all blocks at once (b numpy steps), then the block
    states are merged pairwise in a tree (log2 B rounds of O(T) numpy steps). Work
    O(n T) in all.
    """
    n, k = p.shape
    b = max(math.isqrt(n - 1) + 1, T)
    blocks = -(-n // b)
    padded = np.zeros((blocks * b, k))
    padded[:n] = p
    probs = padded.reshape(blocks, b, k)
    state = np.zeros((blocks, k, T + 1))
    state[..., 0] = 1.0
    for t in range(b):
        pt = probs[:, t, :][..., None]                           # (blocks, k, 1)
        new = state * (1.0 - pt)
        new[..., 1:T] += state[..., 0:T - 1] * pt
        new[..., T] = state[..., T] + state[..., T - 1] * pt[..., 0]
        state = new
    while state.shape[0] > 1:
        if state.shape[0] % 2:
            identity = np.zeros((1, k, T + 1))
            identity[..., 0] = 1.0
            state = np.concatenate([state, identity])
        a, c = state[0::2], state[1::2]
        # tail_c[t] = Pr(N_c >= t) for t = 1..T (as sums of non-negative terms)
        tail_c = np.cumsum(c[..., ::-1], axis=-1)[..., ::-1]    # tail_c[..., t] = Pr(N >= t)
        merged = np.zeros_like(a)
        for x in range(T):
            ax = a[..., x:x + 1]
            merged[..., x:T] += ax * c[..., 0:T - x]
            merged[..., T] += ax[..., 0] * tail_c[..., T - x]
        merged[..., T] += a[..., T]
        state = merged
    return np.minimum(state[0, :, T], 1.0)


def _count_inputs(p: np.ndarray, T: int) -> tuple[np.ndarray, int]:
    if isinstance(T, bool) or int(T) != T or T < 0:
        raise InputError("must be a non-negative integer", parameter="count threshold")
    w = _as_matrix(p)
    if not (np.isfinite(w).all() and (w >= 0).all() and (w <= 1).all()):
        raise ValueError("probabilities must lie in [0, 1]")
    return w, int(T)


def count_summary(p: np.ndarray, T: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group of p (n, k): ``prob_at_least`` (k,) = Pr(N_j >= T) (exact
    Poisson-binomial tail, eq. (19) for T = 1) and ``expected`` (k,) = E[N_j] =
    sum_i p_ij. T = 0 gives 1; T > n gives 0."""
    w, T = _count_inputs(p, T)
    n, k = w.shape
    expected = w.sum(axis=0)
    if T == 0:
        return np.ones(k), expected
    if T > n:
        return np.zeros(k), expected
    return _tail_states(w, T), expected
