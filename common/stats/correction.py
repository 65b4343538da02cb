"""Attenuation-corrected group estimates (beyond the paper; design §5.9).

The paper's weighted estimator of a group's rate, ``μ̃_j = Σ_i p_ij·f_i / Σ_i p_ij·d_i``
(paper eq. 6 for ERO; the same form for MQOS-NDCG, the output metric and each point of
POT's curves), is attenuated: member i of race r adds ``p_ij`` of its outcome to group
j whatever r is, so every group's estimate is pulled towards the others', the small
groups the most. The correction undoes that mixing.

Two assumptions, stated in plain words in docs/metrics/README.md ("The correction"):

* **(A1) calibration**: among members whose probability vector is ``p``, a share
  ``p_r`` is of race r (``Pr(race_i = r | p_i) = p_ir``);
* **(A2) no proxy effect**: given race, the outcome does not depend on the name or
  place the probabilities come from (``E[f_i | race_i = r, p_i, d_i] = μ_r·d_i``).

Then ``E[Num_j | p, d] = Σ_i p_ij Σ_r p_ir·d_i·μ_r = (M·μ)_j`` with

    Num[j]  = Σ_i p_ij·f_i                  (the weighted estimator's numerator)
    M[j, r] = Σ_i p_ij·p_ir·d_i             (symmetric, k × k)

so ``μ̂ = M⁻¹·Num`` is unbiased for the true-race rates ``μ`` (to first order: M is
itself estimated), where the weighted estimator is not. Without (A1) — real BISG is
not exactly calibrated, the clipping and the privatised survey move probabilities —
the correction is approximate; `ppre demo` and docs/metrics/README.md show how far each is off.

Inside the protocol M is one more set of linear aggregates of the Test-Client's
encrypted ``d_i`` (the denominator component) with the Tester's plaintext weights
``w_jr = round(q_ij·q_ir / 2^32)`` (q the 32-bit quantised probabilities, so M has the
scale of the denominators): `extend` adds one item per pair ``j ≤ r`` and ciphertext to
the metric's plan, the Tester aggregates, buckets, masks and sends them like the other
items, and both parties finish with `CorrectionPlan.values`. With ratio masks the
Test-Client must solve a system that mixes cells, so every item of a replicate shares
one mask factor (`tester_service.protocol`), each slot still with its own noise as large
as that factor (`common.crypto.masking`: the gcd and continued-fraction attacks stay closed);
the price is that the Test-Client learns ratios between cells of different groups
(design §9.4).

The range as a constraint: with the metric's value range (ERO's rates: [0, 1]) the
estimate is the bounded least-squares fit `bounded_solve` (``M⁻¹·Num`` where that lies
in the range), never a negative rate.

Identifiability: a group's *identifying size* is ``1 / (M⁻¹)_jj`` (for perfectly
separated groups it is the group's denominator, e.g. its members with ``d = 1``; it
shrinks as other groups' probabilities overlap it). Without release noise the Tester
measures it on its own probabilities over the joined rows (``d = 1``) and flags a
group below `MIN_IDENTIFYING_SIZE` "not identifiable at this size": its corrected
value is withheld rather than reported as a wild number. Under release noise the
threshold follows the noise (`noise_threshold`) and, where M is released as second
moments (`common.stats.moments`), the finishing party decides on the released M
(`CorrectionPlan.released_identifiability`). M's condition number is reported.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from common.errors import InputError

METHODS = ("none", "calibration")
#: below this identifying size (members) a group's corrected value is withheld
MIN_IDENTIFYING_SIZE = 30.0
#: the release noise of an audit with the correction covers k + k(k+1)/2 weight columns:
#: ||p·pᵀ − p'·p'ᵀ||_F ≤ (||p|| + ||p'||)·||p − p'|| ≤ 2·||p − p'||, so M's items add at
#: most 4 to the squared sensitivity of the group items' 1 (`tester_service.release`)
SENSITIVITY_FACTOR = 5
NOT_IDENTIFIABLE = "not identifiable at this size"
#: under release noise a group's corrected value is withheld when the noise on its
#: numerator alone would move it by more than this (standard deviation; `noise_threshold`)
MAX_NOISE_SD = 0.02


def noise_threshold(noise_sd: float) -> float:
    """The least identifying size at which the release noise is not the finding.

    The corrected value of a group is ``(M⁻¹·Num)_j``; noise of standard deviation s
    (members) on every Num moves it by about ``s·sqrt((M⁻²)_jj) ≥ s·(M⁻¹)_jj = s / n_j``
    with ``n_j = 1/(M⁻¹)_jj`` its identifying size. A group is identifiable when that
    is at most MAX_NOISE_SD: ``n_j ≥ s / MAX_NOISE_SD`` (and at least
    MIN_IDENTIFYING_SIZE, the threshold without noise). Groups below it would also pour
    their noise into every other group's value through M⁻¹, so they are held at their
    weighted estimates instead (`CorrectionPlan.values`' `hidden`)."""
    return max(MIN_IDENTIFYING_SIZE, noise_sd / MAX_NOISE_SD) if noise_sd > 0 else MIN_IDENTIFYING_SIZE


def check_method(method: str) -> str:
    method = method or "none"
    if method not in METHODS:
        raise InputError(f"'{method}' is not a correction ({', '.join(METHODS)})", parameter="correction")
    return method


def pairs(k: int) -> list[tuple[int, int]]:
    """The upper triangle of M, row by row: (0,0), (0,1), …, (k−1,k−1)."""
    return [(j, r) for j in range(k) for r in range(j, k)]


#: a probability's fixed-point scale in the slots (common.metrics.base.PROBABILITY_BITS)
WEIGHT_SCALE = float(1 << 32)


def psd(matrix: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """The nearest symmetric matrix whose eigenvalues are at least `floor` ≥ 0 (the
    positive semidefinite cone for 0)."""
    sym = (matrix + matrix.T) / 2.0
    if not sym.size or not np.all(np.isfinite(sym)):
        return np.zeros_like(sym)
    vals, vecs = np.linalg.eigh(sym)
    return (vecs * np.clip(vals, floor, None)) @ vecs.T


def pair_matrix(row: Sequence[Sequence[float]], family, slot: int, k: int,
                items: Sequence[int] | None = None) -> np.ndarray:
    """The symmetric k × k matrix of one slot of the family's pair items (S^f or S^d;
    `items`: other pair items, those of the squares). A family with one item per group
    holds the diagonal alone: its off-diagonal entries are 0 (draws independent across
    groups, which widens a simultaneous band, never narrows it: Šidák's inequality)."""
    items = family.pair_items if items is None else items
    where = pairs(k) if len(items) == len(pairs(k)) else [(j, j) for j in range(k)]
    out = np.zeros((k, k))
    for p, (a, b) in enumerate(where):
        out[a, b] = out[b, a] = float(row[items[p]][slot])
    return out


def noise_of(noise_sd: Sequence[float], item: int, slot: int, item_slots: int) -> float:
    """The estimate's noise sd of one item slot (the header's first half; 0 without noise)."""
    k = item * item_slots + slot
    return float(noise_sd[k]) if k < len(noise_sd) // 2 else 0.0


def pair_weights(q: np.ndarray) -> list[np.ndarray]:
    """One int64 column per pair (`pairs`), exact integers: ``w_jr = round(q_j·q_r / 2^32)``
    for the pairs without the last group (q ≤ 2^32 split in 16-bit halves, so that no
    partial product overflows), and for the pairs with it whatever makes each row of the
    symmetric matrix sum to its group's weight, ``Σ_r w_jr = q_j`` (as Σ_r q_r = 2^32):
    ``w_j,k−1 = q_j − Σ_{r≠k−1} w_jr``, then ``w_k−1,k−1 = q_k−1 − Σ_{j<k−1} w_j,k−1``.
    Those are the rounded products to within k/2 units of 2^−32, and (k−1, k−1), which
    takes every other one's rounding, within ((k − 1)² + 1)/2 (so a few units below 0 where
    the product is that small): far below anything a release shows. The Tester forms
    their aggregates from the others' instead of exponentiating (`pair_derivations`)."""
    k = q.shape[1]
    hi, lo = q >> 16, q & 0xFFFF
    w: dict[tuple[int, int], np.ndarray] = {}
    for j, r in pairs(k):
        if r == k - 1:
            continue
        cross = hi[:, j] * lo[:, r] + lo[:, j] * hi[:, r]
        w[(j, r)] = hi[:, j] * hi[:, r] + (((cross << 16) + lo[:, j] * lo[:, r] + (1 << 31)) >> 32)
    for j in range(k - 1):
        w[(j, k - 1)] = q[:, j] - sum(w[(min(j, r), max(j, r))] for r in range(k - 1))
    w[(k - 1, k - 1)] = q[:, k - 1] - sum(w[(j, k - 1)] for j in range(k - 1))
    return [w[pair] for pair in pairs(k)]


def pair_derivations(k: int, first: int) -> dict[int, tuple[int, tuple[int, ...]]]:
    """The pair columns of `pair_weights` (at `first`, `first + 1`, … in the weights) that
    are a group's column (group j's q_j at column j) minus other pair columns, row by
    row: column index -> (the group's column, the pair columns subtracted), in an order
    where each one's parts come before it (`common.metrics.base.Derivation`)."""
    at = {pair: first + p for p, pair in enumerate(pairs(k))}
    out: dict[int, tuple[int, tuple[int, ...]]] = {}
    for j in range(k - 1):
        out[at[(j, k - 1)]] = (j, tuple(at[(min(j, r), max(j, r))] for r in range(k - 1)))
    out[at[(k - 1, k - 1)]] = (k - 1, tuple(at[(j, k - 1)] for j in range(k - 1)))
    return out


def identifying_sizes(m: np.ndarray) -> np.ndarray:
    """``1 / (M⁻¹)_jj`` per group, computed as the Schur complement ``M_jj − M_j,o·M_oo⁺·M_o,j``
    of the other groups o (the same number where M is invertible; with a pseudo-inverse,
    a singular M, e.g. a noised one projected onto the semidefinite cone, still gives
    the groups it separates their sizes and 0 to those it cannot tell apart)."""
    k = m.shape[0]
    if not np.all(np.isfinite(m)):
        return np.zeros(k)
    out = np.zeros(k)
    for j in range(k):
        o = [r for r in range(k) if r != j]
        size = m[j, j] - (m[j, o] @ np.linalg.pinv(m[np.ix_(o, o)], hermitian=True) @ m[o, j] if o else 0.0)
        out[j] = size if size > 1e-9 * max(1.0, abs(m[j, j])) else 0.0
    return out


def plain_matrix(p: np.ndarray, d: np.ndarray | None = None) -> np.ndarray:
    """``M = Σ_i d_i·p_i·p_iᵀ`` in floating point (the Tester's identifiability check uses
    d = 1: its own probabilities over the joined rows)."""
    w = p if d is None else p * np.asarray(d, dtype=np.float64)[:, None]
    return w.T @ p


def solve(num: np.ndarray, m: np.ndarray, bounds: tuple[float, float] | None = None) -> np.ndarray:
    """``M⁻¹·Num`` (NaN where M is singular); inputs may share any positive scale. With
    `bounds` (lo, hi), the range as a constraint: `bounded_solve`."""
    scale = float(np.max(np.abs(m))) if m.size else 0.0
    if not np.isfinite(scale) or scale <= 0 or not np.all(np.isfinite(num)) or not np.all(np.isfinite(m)):
        return np.full(len(num), np.nan)
    if bounds is not None:
        return bounded_solve(num / scale, m / scale, *bounds)
    try:
        return np.linalg.solve(m / scale, num / scale)
    except np.linalg.LinAlgError:
        return np.full(len(num), np.nan)


def bounded_solve(num: np.ndarray, m: np.ndarray, lo: float, hi: float, *, iterations: int = 100) -> np.ndarray:
    """The range-constrained corrected estimate: ``argmin_{lo ≤ μ ≤ hi} ½μᵀMμ − Numᵀμ``.

    For 0/1 components with f ≤ d this is the least-squares fit of f on the probability
    vectors over the rows, ``Σ_i d_i·(f_i − p_i·μ)² = const − 2·Numᵀμ + μᵀMμ``, whose
    normal equations are ``M·μ = Num``: where ``M⁻¹·Num`` lies in the box it is the
    answer, else the bounded fit (a noised M is projected onto the positive
    semidefinite cone first). Projected Newton with an Armijo search (Bertsekas 1982),
    exact for the k ≤ a dozen groups of an audit."""
    x = _lstsq(m, num)
    if np.all((x >= lo) & (x <= hi)) and np.all(np.linalg.eigvalsh((m + m.T) / 2) > 0):
        return x  # M positive definite and M⁻¹·Num in range: the unconstrained solution
    h = psd(m)
    x = np.clip(np.where(np.isfinite(x), x, (lo + hi) / 2), lo, hi)

    def objective(z: np.ndarray) -> float:
        return float(0.5 * z @ h @ z - num @ z)

    for _ in range(iterations):
        g = h @ x - num
        held = ((x <= lo) & (g > 0)) | ((x >= hi) & (g < 0))
        step = np.zeros_like(x)
        free = ~held
        if free.any():
            step[free] = -_lstsq(h[np.ix_(free, free)], g[free])
        if not np.any(step):
            break
        t, fx = 1.0, objective(x)
        while True:
            trial = np.clip(x + t * step, lo, hi)
            if objective(trial) <= fx + 1e-4 * float(g @ (trial - x)) or t < 1e-12:
                break
            t /= 2.0
        if np.array_equal(trial, x):
            break
        x = trial
    return x


def _lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    try:
        return np.linalg.solve(a, b)
    except np.linalg.LinAlgError:
        return np.linalg.lstsq(a, b, rcond=None)[0]


def condition_number(m: np.ndarray) -> float | None:
    if not m.size or not np.all(np.isfinite(m)):
        return None
    c = float(np.linalg.cond(m))
    return c if np.isfinite(c) else None


@dataclass(frozen=True)
class Corrected:
    """The corrected values of an audit, a column per plan cell (NaN where a cell has
    none: "overall", withheld groups), row 0 the estimate, then the replicates."""

    values: np.ndarray
    condition_number: float | None
    unidentifiable: tuple[str, ...]
    dropped: tuple[str, ...]
    #: the identifying size below which a group's value was withheld (`noise_threshold`)
    min_identifying_size: float = MIN_IDENTIFYING_SIZE
    #: the groups of `mixing` and `shares`, in their order
    groups: tuple[str, ...] = ()
    #: M row-normalised, ``M[j, r] / Σ_r M[j, r]`` of the estimate's row: the share of group
    #: j's weight that lies on members of race r under (A1) (`mixing_of`); None where unknown
    mixing: np.ndarray | None = None
    #: each group's share of all groups' weight, ``Den_j / Σ Den``
    shares: np.ndarray | None = None
    #: the release noise's sd of each entry of `mixing` (its M entry's noise over the row's
    #: sum; 0 without noise): what of the mixing the noise leaves readable (`mixing_of`)
    mixing_sd: np.ndarray | None = None
    #: whether the corrected values are reported (asked for); otherwise they serve the
    #: verdict's attenuation statement only (`common.stats.verdict.with_attenuation`)
    reported: bool = True

    def summary(self) -> dict:
        """The report's `correction` entry (aggregates only)."""
        return {"method": "calibration", "condition_number": self.condition_number,
                "min_identifying_size": round(self.min_identifying_size, 1),
                "unidentifiable": list(self.unidentifiable),
                "dropped": list(self.dropped)}


@dataclass(frozen=True)
class Family:
    """Cells of one shape (ERO's rate; one POT reference score), one per group: the
    corrected values come from one k × k system."""

    cells: tuple[int, ...]        # plan cell per group
    #: plan item per pair (`pairs`), holding M's entries; or one per group, the diagonal
    #: alone (`pair_matrix`: the covariances across groups taken as 0)
    pair_items: tuple[int, ...]
    num_slot: int
    den_slot: int
    scale_shift: int
    #: where the pair items hold Σ p_a·p_b·f² (`Metric.moment_squares`; None: f² = f)
    sq_items: tuple[int, ...] = ()
    sq_slot: int | None = None
    #: the denominator component's fixed-point scale (2^scale_bits; ERO's 0/1: 1), by
    #: which the slots' second moments exceed the members' (`common.stats.moments`)
    unit: float = 1.0
    #: the width of the values' range, to which the noise threshold is relative (rates: 1)
    span: float = 1.0
    #: ``Σ d²/Σ d`` of the rows, by which S^dd = Σ p_a·p_b·d² is read off S^d (1 where d is
    #: 0/1 or 1; `common.stats.moments.aggregate_moments`)
    den_square: float = 1.0
    #: the spread σ² per unit of d where the Test-Client states it from its own rows
    #: (MQOS-NDCG), instead of reading it off released squares (`common.stats.moments.pooled_spread`)
    spread: float | None = None


@dataclass(frozen=True)
class CorrectionPlan:
    """Where M and Num sit among a plan's items; `values` turns decoded slots into the
    corrected estimates (both parties' finish)."""

    groups: tuple[str, ...]
    families: tuple[Family, ...]
    first_item: int               # the correction's items start here
    #: cells whose release is the sum of other cells' releases, (cell, its parts): LOT's
    #: pooled cells, the sums of their rank pairs' cells (`common.stats.moments.weighted_draws`)
    pooled: tuple[tuple[int, tuple[int, ...]], ...] = ()
    #: residual cross-moments τ between the families (one row and column per family, in
    #: their order) where the Test-Client states them (POT's reference scores, whose kernels
    #: overlap: `common.metrics.pot`); the families' residuals are then drawn jointly
    #: (`common.stats.moments.joint_deviations`). Empty: families independent.
    cross: tuple[tuple[float, ...], ...] = ()
    #: a metric whose cells are not ratios of sums over rows (MQOS-AUC exact) reads its
    #: cells' sampling covariance off the release itself: ``covariance(plan, self, row)``
    #: gives (cells, their covariance in reported units), and those cells are drawn
    #: jointly around their estimate, each with its release noise through its ratio
    #: (`common.stats.moments.covariance_draws`). None: the families' own moments.
    covariance: Callable | None = None

    def _system(self, slots: Sequence[Sequence[int]], base: int, cells,
                family: Family) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(Num, Den, M) of one replicate (its items start at `base`): the groups' cells'
        numerators and denominators, and M."""
        k = len(self.groups)
        num = np.array([float(slots[base + cells[c].item][family.num_slot]) for c in family.cells])
        den = np.array([float(slots[base + cells[c].item][family.den_slot]) for c in family.cells])
        m = np.empty((k, k))
        for p, (j, r) in enumerate(pairs(k)):
            m[j, r] = m[r, j] = float(slots[base + family.pair_items[p]][family.den_slot])
        return num, den, m

    def values(self, item_slots: Sequence[Sequence[int]], cells, n_items: int, *, dropped: Sequence[str] = (),
               hidden: Sequence[str] = (), pseudo_values: bool = False,
               bounds: tuple[float, float] | None = None) -> tuple[np.ndarray, float | None]:
        """(replicates, families·k) corrected values, family-major (family f, group j at
        column f·k + j), from the decoded slots of every item (row-major (replicate,
        item), as `Plan.cell_values` reads them), and the largest condition number of the
        systems solved (the estimate's row).

        `hidden` groups (not identifiable) are not solved for: their rate is taken as
        their weighted estimate ``Num_j / Den_j`` and what they weigh in the other
        groups' rows is subtracted with it (``Num_s − M_sh·μ̃_h``), so that their nearly
        singular rows do not blow up everyone's variance; their own values are NaN.
        `dropped` groups (their cells were suppressed: their Num holds random values)
        leave the system altogether; what their members weigh in the kept groups' rows is
        then not corrected for. `pseudo_values` (release noise: rows 1..G are disjoint
        random groups adding up to row 0): each group's value is the linearised
        pseudo-value ``μ̂ + G·A⁻¹·(b_g − A_g·μ̂)`` of the estimate's solution of
        ``A·μ = b`` (A, b the solved system), as `Plan.cell_values` does for a ratio, so
        that a group's small noised M is never inverted. `bounds` (lo, hi) in reported
        units: every replicate is solved with the range as a constraint (`bounded_solve`)."""
        k = len(self.groups)
        replicates = len(item_slots) // n_items
        solved = [j for j, g in enumerate(self.groups) if g not in set(dropped) | set(hidden)]
        fixed = [j for j, g in enumerate(self.groups) if g in set(hidden) and g not in set(dropped)]
        out = np.full((replicates, len(self.families) * k), np.nan)
        worst: float | None = None

        def reduced(num, den, m, plug=None):
            with np.errstate(divide="ignore", invalid="ignore"):
                plug = num[fixed] / den[fixed] if plug is None else plug
            plug = np.where(np.isfinite(plug), plug, 0.0)
            return num[solved] - m[np.ix_(solved, fixed)] @ plug, m[np.ix_(solved, solved)], plug

        if not solved:
            return out, None
        for f, family in enumerate(self.families):
            cols = [f * k + j for j in solved]
            box = None if bounds is None else tuple(x / 2.0 ** family.scale_shift for x in bounds)
            b0, a0, plug0 = reduced(*self._system(item_slots, 0, cells, family))
            mu0 = solve(b0, a0, box)
            cond = condition_number(a0)
            worst = cond if worst is None or (cond is not None and cond > worst) else worst
            out[0, cols] = mu0
            for r in range(1, replicates):
                system = self._system(item_slots, r * n_items, cells, family)
                if pseudo_values:
                    b_r, a_r, _ = reduced(*system, plug=plug0)
                    out[r, cols] = mu0 + (replicates - 1) * solve(b_r - a_r @ mu0, a0)
                else:
                    out[r, cols] = solve(*reduced(*system)[:2], box)
        return out * np.repeat([2.0 ** fam.scale_shift for fam in self.families], k), worst


    def finish(self, item_slots, plan, suppressed_items: Sequence[int], unidentifiable: Sequence[str],
               *, pseudo_values: bool = False, bounds: tuple[float, float] | None = None,
               min_identifying_size: float = MIN_IDENTIFYING_SIZE) -> Corrected:
        """Both parties' last step: the corrected values aligned with `plan.cells`. A group
        with a suppressed cell leaves the systems (`values`' `dropped`). `bounds`: the
        metric's range, a constraint of every solve; `min_identifying_size`: the threshold
        the unidentifiable groups were found with (for the report)."""
        suppressed = set(suppressed_items)
        dropped = sorted({cell.group for cell in plan.cells if cell.item in suppressed and cell.group in self.groups})
        hidden = sorted(set(unidentifiable) - set(dropped))
        # a metric that encodes its values relative to a range (`Cell.offset`) solves for them so
        offset = next((plan.cells[f.cells[0]].offset for f in self.families), 0.0)
        box = None if bounds is None else (bounds[0] - offset, bounds[1] - offset)
        by_family, cond = self.values(item_slots, plan.cells, len(plan.items), dropped=dropped, hidden=hidden,
                                      pseudo_values=pseudo_values, bounds=box)
        out = np.full((by_family.shape[0], len(plan.cells)), np.nan)
        k = len(self.groups)
        for f, family in enumerate(self.families):
            for j, c in enumerate(family.cells):
                out[:, c] = by_family[:, f * k + j] + plan.cells[c].offset  # values relative to a range
        return Corrected(out, cond, tuple(hidden), tuple(dropped), float(min_identifying_size), self.groups)

    def mixing_of(self, item_slots, plan, dropped: Sequence[str] = (),
                  noise_sd: Sequence[float] = ()) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """(M row-normalised, the groups' shares of the weight, the release noise's sd of
        each entry of the first) of the estimate's row, first family (design §5.9): under
        (A1) row j is where group j's weight lies by race, so that a weighted gap between j
        and l is ``(M̃_j − M̃_l)·μ`` of the true-race rates μ
        (`common.stats.verdict.with_attenuation`). Post-processing of the released M; a
        dropped group's row and column (random values) are NaN; noise may leave an entry
        below 0, read as 0. An entry's sd is its pair item's noise (`noise_sd`, the
        header's; 0 without) over the row's sum, the group's weight and far steadier:
        what of the mixing the noise leaves readable."""
        if not self.families:
            return None, None, None
        family = self.families[0]
        _, den, m = self._system(item_slots, 0, plan.cells, family)
        gone = [j for j, g in enumerate(self.groups) if g in set(dropped)]
        m[gone, :] = 0.0
        m[:, gone] = 0.0
        m = np.clip(m, 0.0, None)
        k = len(self.groups)
        noise = np.zeros((k, k))
        if len(family.pair_items) == len(pairs(k)):
            for p, (a, b) in enumerate(pairs(k)):
                noise[a, b] = noise[b, a] = noise_of(noise_sd, family.pair_items[p], family.den_slot,
                                                     plan.item_slots)
        with np.errstate(divide="ignore", invalid="ignore"):
            weight = m.sum(axis=1, keepdims=True)
            mixing, sd = m / weight, noise / weight
            kept = np.clip(np.delete(den, gone) if gone else den, 0.0, None)
            shares = np.clip(den, 0.0, None) / kept.sum()
        mixing[gone, :] = np.nan
        shares[gone] = np.nan
        return mixing, shares, sd

    def released_identifiability(self, row: Sequence[Sequence[int]], noise_sd: Sequence[float],
                                 plan) -> tuple[list[str], float]:
        """Under release noise: (the groups not identifiable, the threshold), decided on
        the released, noised M (post-processing: no further release) against
        `noise_threshold` of the estimate's noise. The identifying size ``1/(M⁻¹)_jj`` is
        then the one of the members the rate is about (d = 1), in members. M's noise
        (sd s_M per entry) is taken out of what M can tell apart: its eigenvalues are
        floored at s_M, so that a direction the noise made is not read as information
        nor, projected to exactly 0, as a direction no group can be told along."""
        hidden: set[str] = set()
        threshold = MIN_IDENTIFYING_SIZE
        for family in self.families:  # a group is withheld where any of its systems cannot tell it
            some, at = self._family_identifiability(row, noise_sd, plan, family)
            hidden |= set(some)
            threshold = max(threshold, at)
        return [g for g in self.groups if g in hidden], threshold

    def _family_identifiability(self, row, noise_sd, plan, family: Family) -> tuple[list[str], float]:
        k = len(self.groups)
        floor = max(noise_of(noise_sd, i, family.den_slot, plan.item_slots) for i in family.pair_items)
        m = psd(pair_matrix(row, family, family.den_slot, k), floor) / (WEIGHT_SCALE * family.unit)
        sizes = identifying_sizes(m)
        sd = max(noise_of(noise_sd, plan.cells[c].item, family.num_slot, plan.item_slots) for c in family.cells)
        threshold = noise_threshold(sd / (WEIGHT_SCALE * family.unit * family.span) * 2.0 ** family.scale_shift)
        return [g for g, size in zip(self.groups, sizes) if not size >= threshold], threshold


def finish_corrected(plan_of_m: CorrectionPlan, item_slots, plan, suppressed_items: Sequence[int],
                     unidentifiable: Sequence[str], noise_sd: Sequence[float] = (), **kwargs) -> Corrected:
    """Both parties' corrected values of a release with replicates (bootstrap or random
    groups): without noise the Tester's `unidentifiable` groups (measured on its own
    probabilities); with noise (`noise_sd`, the header's) those the released, noised M
    cannot tell apart at this noise (`CorrectionPlan.released_identifiability` on the
    estimate's row: post-processing, no further release)."""
    threshold = MIN_IDENTIFYING_SIZE
    if len(noise_sd):
        unidentifiable, threshold = plan_of_m.released_identifiability(item_slots[:len(plan.items)], noise_sd, plan)
    corrected = plan_of_m.finish(item_slots, plan, suppressed_items, unidentifiable, min_identifying_size=threshold,
                                 **kwargs)
    mixing, shares, sd = plan_of_m.mixing_of(item_slots, plan, corrected.dropped, noise_sd)
    return replace(corrected, mixing=mixing, shares=shares, mixing_sd=sd)


def extend(plan, groups: Sequence[str], *, square: tuple[int, int] | None = None, unit: float = 1.0,
           span: float = 1.0, den_square: float = 1.0, spread: float | None = None,
           cross: Sequence[Sequence[float]] = ()):
    """The metric's `plan` with M's items appended, and where they are: for every distinct
    (ciphertext, stratum) of the per-group cells, one item per pair j ≤ r on weight column
    ``k + 1 + pair`` (`pair_weights`, after the k group columns and "overall" of
    `Metric.weights`, which every metric that corrects keeps; `Metric.corrects`: its
    per-group cells sit on weight column j for group j). `square`: the (ciphertext,
    slot) of the rows' f² (`Metric.moment_squares`), whose pair items join too where
    they are on another ciphertext; `unit`, `span`, `den_square`, `spread`: `Family`'s;
    `cross`: `CorrectionPlan.cross`, one row per family."""
    # The plan's own types (`common.metrics.base`'s Plan and Item), copied from the plan and
    # its items: this module sits below the metric layer and does not import it.
    k = len(groups)
    first_weight = k + 1
    index = {g: j for j, g in enumerate(groups)}
    items = list(plan.items)
    shapes: dict[tuple, list] = {}
    for c, cell in enumerate(plan.cells):
        if cell.kind not in ("group", "curve") or cell.group not in index:
            continue
        item = plan.items[cell.item]
        if item.weight != index[cell.group]:
            raise ValueError(f"cell {cell.group} does not sit on its group's weight column")
        key = (cell.kind, cell.score, item.ciphertext, item.stratum, cell.num_slot, cell.den_slot, cell.scale_shift)
        shapes.setdefault(key, [None] * k)[index[cell.group]] = c
    where: dict[tuple, tuple[int, ...]] = {}

    def pair_items(ciphertext: int, stratum) -> tuple[int, ...]:
        if (ciphertext, stratum) not in where:
            where[(ciphertext, stratum)] = tuple(range(len(items), len(items) + len(pairs(k))))
            items.extend(replace(plan.items[0], weight=first_weight + p, ciphertext=ciphertext, stratum=stratum)
                         for p in range(len(pairs(k))))
        return where[(ciphertext, stratum)]

    families = []
    for key, cells in shapes.items():
        if any(c is None for c in cells):
            raise ValueError("a cell shape lacks some group")
        _, _, ciphertext, stratum, num_slot, den_slot, shift = key
        held = pair_items(ciphertext, stratum)
        squares = {} if square is None else {"sq_items": pair_items(square[0], stratum), "sq_slot": square[1]}
        families.append(Family(tuple(cells), held, num_slot, den_slot, shift, unit=unit, span=span,
                               den_square=den_square, spread=spread, **squares))
    if cross and (len(cross) != len(families) or any(len(row) != len(families) for row in cross)):
        raise ValueError(f"{len(cross)} rows of residual cross-moments for {len(families)} cell shapes")
    return (replace(plan, items=tuple(items)),
            CorrectionPlan(tuple(groups), tuple(families), len(plan.items),
                           cross=tuple(tuple(float(x) for x in row) for row in cross)))
