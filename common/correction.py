"""Attenuation-corrected group estimates (beyond the paper; SPEC.md section 5's ratio metrics).

The paper's weighted estimator of a group's rate, ``μ̃_j = Σ_i p_ij·f_i / Σ_i p_ij·d_i``
(paper eq. 6 for ERO; the same form for MQOS-NDCG, the output metric and each point of
POT's curves), is attenuated: member i of race r adds ``p_ij`` of its outcome to group
j whatever r is, so every group's estimate is pulled towards the others', the small
groups the most. The correction undoes that mixing.

Two assumptions, stated in plain words in the README:

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
the correction is approximate; `ppre demo` and the README show how far each is off.

Inside the protocol M is one more set of linear aggregates of the Test-Client's
encrypted ``d_i`` (the denominator component) with the Tester's plaintext weights
``w_jr = round(q_ij·q_ir / 2^32)`` (q the 32-bit quantised probabilities, so M has the
scale of the denominators): `extend` adds one item per pair ``j ≤ r`` and ciphertext to
the metric's plan, the Tester aggregates, buckets, masks and sends them like the other
items, and both parties finish with `CorrectionPlan.values`. With ratio masks the
Test-Client must solve a system that mixes cells, so every item of a replicate shares
one mask factor (`tester_service.protocol`), each slot still with its own noise as large
as that factor (`common.masking`: the gcd and continued-fraction attacks stay closed);
the price is that the Test-Client learns ratios between cells of different groups
(README, "What each party learns").

Identifiability: a group's *identifying size* is ``1 / (M⁻¹)_jj`` (for perfectly
separated groups it is the group's denominator, e.g. its members with ``d = 1``; it
shrinks as other groups' probabilities overlap it). The Tester measures it on its own
probabilities over the joined rows (``d = 1``) and flags a group below
`MIN_IDENTIFYING_SIZE` "not identifiable at this size": its corrected value is withheld
rather than reported as a wild number. M's condition number is reported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

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


def check_method(method: str) -> str:
    method = method or "none"
    if method not in METHODS:
        raise InputError(f"'{method}' is not a correction ({', '.join(METHODS)})", parameter="correction")
    return method


def pairs(k: int) -> list[tuple[int, int]]:
    """The upper triangle of M, row by row: (0,0), (0,1), …, (k−1,k−1)."""
    return [(j, r) for j in range(k) for r in range(j, k)]


def pair_weights(q: np.ndarray) -> list[np.ndarray]:
    """``w_jr = round(q_j·q_r / 2^32)`` per row, one int64 column per pair (`pairs`), exact:
    q ≤ 2^32 is split in 16-bit halves so that no partial product overflows."""
    hi, lo = q >> 16, q & 0xFFFF
    out = []
    for j, r in pairs(q.shape[1]):
        cross = hi[:, j] * lo[:, r] + lo[:, j] * hi[:, r]
        out.append(hi[:, j] * hi[:, r] + (((cross << 16) + lo[:, j] * lo[:, r] + (1 << 31)) >> 32))
    return out


def identifying_sizes(m: np.ndarray) -> np.ndarray:
    """``1 / (M⁻¹)_jj`` per group (0 where M is singular or the value is not positive)."""
    try:
        inv = np.linalg.inv(m)
    except np.linalg.LinAlgError:
        return np.zeros(m.shape[0])
    diag = np.diag(inv)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.isfinite(diag) & (diag > 0), 1.0 / diag, 0.0)


def plain_matrix(p: np.ndarray, d: np.ndarray | None = None) -> np.ndarray:
    """``M = Σ_i d_i·p_i·p_iᵀ`` in floating point (the Tester's identifiability check uses
    d = 1: its own probabilities over the joined rows)."""
    w = p if d is None else p * np.asarray(d, dtype=np.float64)[:, None]
    return w.T @ p


def solve(num: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``M⁻¹·Num`` (NaN where M is singular); inputs may share any positive scale."""
    scale = float(np.max(np.abs(m))) if m.size else 0.0
    if not np.isfinite(scale) or scale <= 0 or not np.all(np.isfinite(num)):
        return np.full(len(num), np.nan)
    try:
        return np.linalg.solve(m / scale, num / scale)
    except np.linalg.LinAlgError:
        return np.full(len(num), np.nan)


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

    def summary(self) -> dict:
        """The report's `correction` entry (aggregates only)."""
        return {"method": "calibration", "condition_number": self.condition_number,
                "min_identifying_size": MIN_IDENTIFYING_SIZE, "unidentifiable": list(self.unidentifiable),
                "dropped": list(self.dropped)}


@dataclass(frozen=True)
class Family:
    """Cells of one shape (ERO's rate; one POT reference score), one per group: the
    corrected values come from one k × k system."""

    cells: tuple[int, ...]        # plan cell per group
    pair_items: tuple[int, ...]   # plan item per pair (`pairs`), holding M's entries
    num_slot: int
    den_slot: int
    scale_shift: int


@dataclass(frozen=True)
class CorrectionPlan:
    """Where M and Num sit among a plan's items; `values` turns decoded slots into the
    corrected estimates (both parties' finish)."""

    groups: tuple[str, ...]
    families: tuple[Family, ...]
    first_item: int               # the correction's items start here

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
               hidden: Sequence[str] = (), pseudo_values: bool = False) -> tuple[np.ndarray, float | None]:
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
        that a group's small noised M is never inverted."""
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
            b0, a0, plug0 = reduced(*self._system(item_slots, 0, cells, family))
            mu0 = solve(b0, a0)
            cond = condition_number(a0)
            worst = cond if worst is None or (cond is not None and cond > worst) else worst
            out[0, cols] = mu0
            for r in range(1, replicates):
                system = self._system(item_slots, r * n_items, cells, family)
                if pseudo_values:
                    b_r, a_r, _ = reduced(*system, plug=plug0)
                    out[r, cols] = mu0 + (replicates - 1) * solve(b_r - a_r @ mu0, a0)
                else:
                    out[r, cols] = solve(*reduced(*system)[:2])
        return out * np.repeat([2.0 ** fam.scale_shift for fam in self.families], k), worst


    def finish(self, item_slots, plan, suppressed_items: Sequence[int], unidentifiable: Sequence[str],
               *, pseudo_values: bool = False) -> Corrected:
        """Both parties' last step: the corrected values aligned with `plan.cells`. A group
        with a suppressed cell leaves the systems (`values`' `dropped`)."""
        suppressed = set(suppressed_items)
        dropped = sorted({cell.group for cell in plan.cells if cell.item in suppressed and cell.group in self.groups})
        hidden = sorted(set(unidentifiable) - set(dropped))
        by_family, cond = self.values(item_slots, plan.cells, len(plan.items), dropped=dropped, hidden=hidden,
                                      pseudo_values=pseudo_values)
        out = np.full((by_family.shape[0], len(plan.cells)), np.nan)
        k = len(self.groups)
        for f, family in enumerate(self.families):
            for j, c in enumerate(family.cells):
                out[:, c] = by_family[:, f * k + j]
        return Corrected(out, cond, tuple(hidden), tuple(dropped))


def extend(plan, groups: Sequence[str]):
    """The metric's `plan` with M's items appended, and where they are: for every distinct
    (ciphertext, stratum) of the per-group cells, one item per pair j ≤ r on weight column
    ``k + 1 + pair`` (`pair_weights`, after the k group columns and "overall" of
    `Metric.weights`, which every metric that corrects keeps; `Metric.corrects`: its
    per-group cells sit on weight column j for group j)."""
    from common.metrics.base import Item, Plan
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
    families = []
    for key, cells in shapes.items():
        if any(c is None for c in cells):
            raise ValueError("a cell shape lacks some group")
        _, _, ciphertext, stratum, num_slot, den_slot, shift = key
        if (ciphertext, stratum) not in where:
            where[(ciphertext, stratum)] = tuple(range(len(items), len(items) + len(pairs(k))))
            items += [Item(first_weight + p, ciphertext, stratum) for p in range(len(pairs(k)))]
        families.append(Family(tuple(cells), where[(ciphertext, stratum)], num_slot, den_slot, shift))
    return (Plan(plan.cells, tuple(items), plan.item_slots),
            CorrectionPlan(tuple(groups), tuple(families), len(plan.items)))
