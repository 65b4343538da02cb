"""Probabilistic count, an inclusion measurement (paper appendix C.2, eq. 19; design §5.8).

Dataset: `member_id[, pool]` (without a pool column every member is in one pool,
"all"). For each pool and group: Pr(N_j ≥ T) for N_j, the number of the pool's joined
members in group j, and the `count_threshold` T (default 1: 1 − Π_i (1 − p_ij)), the
expected count Σ_i p_ij, and whether Pr(N_j ≥ T) clears the `inclusion_level` (default
0.90). `groups` reports Pr(N_j ≥ T) over all pools together. Verdict (rule "inclusion",
`inclusion_verdict`): flagged when some group of some pool, or of all pools together,
falls below the level; "inconclusive" when none does but some cell is withheld (a
withheld cell is unknown: `included` is None, neither included nor missing); "none"
only when every cell is released and reaches the level.

Two forms, chosen by whether the release carries noise (`Metric.he_under_noise`):

* **Under the release controls (the default): aggregated under encryption.** Each row
  carries its pool as a one-hot vector of encrypted 0/1 components, one per pool, packed
  in slots (`client_rows`, `plan`): the Tester sees no row's pool. It weights them with
  q_ij as for any ratio metric, so each (pool, group) item slot holds the expected count
  Σ_{i in pool} p_ij, and each group item carries release noise (one member's vector
  moves one pool's slots: β = 1). Its cells are counts (`NO_DENOMINATOR`), released as
  noised aggregates to the result recipient (`--result-recipient`), who finishes them
  (`cell_report`): a cell whose noised expected count is below the minimum effective
  size is withheld, Pr(N_j ≥ T) is the Poisson tail at the noised expected count
  (post-processing: the exact Poisson-binomial tail would use every member's probability
  again), the all-pools figures come from the pools' noised counts (a group whose
  summed count is below the minimum effective size gets none: that figure would be
  noise), and a pool's member count is its noised "overall" count. At most
  `MAX_ENCRYPTED_POOLS` pools (a row carries ⌈pools / slots⌉ ciphertexts).
* **Without release noise: computed by the Tester** from the joined rows, which carry
  their pool in plaintext (`local_result`: the exact Poisson-binomial tail). The
  result is the Tester's, and the Test-Client accepts such an audit only when its
  operator opted in to noiseless releases. A pool with no member in the intersection
  is an error.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from common.errors import InputError
from common.metrics.base import (NO_DENOMINATOR, PROBABILITY_BITS, Cell, ClientRows, Component, Item, Layout, Metric,
                                 Param, Plan, positive_int, probability)
from common.metrics.scoring import count_summary

DEFAULT_POOL = "all"
MAX_POOLS = 10_000
#: the most pools aggregated under encryption (each row carries ⌈pools / slots⌉ ciphertexts)
MAX_ENCRYPTED_POOLS = 64
#: the "overall" weight column's name among the cells: a pool's member count
OVERALL = "overall"


class ProbabilisticCount(Metric):
    name = "prob-count"
    description = "probabilistic count: probability that each group has at least T members in a pool"
    params = (Param("count_threshold", "T: the count to reach (default 1)", positive_int(1_000_000), 1),
              Param("inclusion_level", "the probability Pr(N_j >= T) must reach (default 0.90)", probability, 0.90))
    text_columns = ("pool",)
    optional_columns = ("pool",)
    needs_he = False
    he_under_noise = True
    uses_strata = True
    interval = "exact"
    verdict_rule = "inclusion"

    def client_rows(self, frame, file, option, params, rng):
        from common.tables import first_row
        ids = frame["member_id"].to_numpy(dtype=object)
        if "pool" in frame.columns:
            pools = frame["pool"].to_numpy(dtype=object)
            empty = np.array([not str(p).strip() for p in pools])
            if empty.any():
                raise InputError("empty pool name", file=file, column="pool", row=first_row(empty))
        else:
            pools = np.full(len(ids), DEFAULT_POOL, dtype=object)
        labels, codes = np.unique(pools.astype(str), return_inverse=True)
        if len(labels) > MAX_POOLS:
            raise InputError(f"more than {MAX_POOLS} pools", file=file, column="pool")
        info = {"pools": len(labels)}
        if not self.encrypted(params):
            return ClientRows(ids=(ids,), values=None, strata=codes.astype(np.int64),
                              strata_labels=tuple(str(x) for x in labels), info=info)
        if len(labels) > MAX_ENCRYPTED_POOLS:
            raise InputError(f"{len(labels)} pools; under the release controls the pools are aggregated under "
                             f"encryption, at most {MAX_ENCRYPTED_POOLS} of them (merge pools)",
                             file=file, column="pool")
        one_hot = np.zeros((len(ids), len(labels)))
        one_hot[np.arange(len(ids)), codes] = 1.0
        return ClientRows(ids=(ids,), values=one_hot, strata_labels=tuple(str(x) for x in labels), info=info)

    def check_info(self, info, strata_labels):
        if not 1 <= len(strata_labels) <= MAX_POOLS or info.get("pools") != len(strata_labels):
            raise ValueError("pools")

    # ------------------------------------------------------------- the encrypted form
    def components(self, option, params, info):
        """One 0/1 component per pool (the row's pool, one-hot), at scale 1."""
        pools = int(info["pools"])
        if not 1 <= pools <= MAX_ENCRYPTED_POOLS:
            raise ValueError(f"{pools} pools; at most {MAX_ENCRYPTED_POOLS} are aggregated under encryption")
        return tuple(Component(f"pool {k}", 0, 1) for k in range(pools))

    def sensitivity_components(self, option, params, info) -> float:
        """β = 1: a row's one-hot pool vector has one component at its bound."""
        return 1.0

    def plan(self, groups: Sequence[str], strata_labels: Sequence[str], layout: Layout, option, params,
             info) -> Plan:
        """Per weight column (each group, then "overall", the sum of them) and row
        ciphertext, one item; per pool and column, a count cell at the pool's slot:
        Σ_rows q_ij·[pool_i = k] / 2^32, the pool's expected count in the group (its
        member count for "overall")."""
        names = list(groups) + [OVERALL]
        n_cts = layout.n_ciphertexts
        items = tuple(Item(w, t) for w in range(len(names)) for t in range(n_cts))
        cells = []
        for k, label in enumerate(strata_labels):
            t, slot = layout.position(k)
            cells += [Cell("count", g, other=label, item=w * n_cts + t, num_slot=slot, den_slot=NO_DENOMINATOR,
                           scale_shift=-PROBABILITY_BITS) for w, g in enumerate(names)]
        return Plan(tuple(cells), items, layout.slots)

    def cell_report(self, plan, values, *, option, params, info, confidence, tau, min_size):
        """The result from the cells' noised counts (row 0 of `values`; NaN where withheld):
        the module docstring's first form."""
        from common.stats.results import NOISED_MEMBERS, PoolResult
        t, level = params["count_threshold"], params["inclusion_level"]
        counts = {(cell.other, cell.group): float(values[0, c]) for c, cell in enumerate(plan.cells)}
        labels = list(dict.fromkeys(cell.other for cell in plan.cells))
        groups = [g for g in dict.fromkeys(cell.group for cell in plan.cells) if g != OVERALL]
        pools, totals = [], np.zeros(len(groups))
        for label in labels:
            members = counts[(label, OVERALL)]
            n = int(round(max(members, 0.0))) if math.isfinite(members) else 0
            for j, g in enumerate(groups):
                noised = counts[(label, g)]
                totals[j] += max(noised, 0.0)  # NaN (withheld item) stays NaN: no figure
                if not noised >= min_size:
                    pools.append(PoolResult(label, g, n, None, None, None))
                    continue
                prob = poisson_tail(noised, t)
                pools.append(PoolResult(label, g, n, noised, prob, bool(prob >= level)))
        group_results = group_figures(None, totals, groups, t, noised=True, min_size=min_size)
        return self._report(pools, group_results, option=option, n_matched=0, t=t, level=level,
                            confidence=confidence, tau=tau, min_size=min_size, info={**info, NOISED_MEMBERS: True})

    # ------------------------------------------------------------- the Tester's form
    def local_result(self, probabilities, strata, strata_labels, groups, option, params, info, *,
                     confidence, tau, min_size: float = 0.0, suppressed: list[str] | None = None):
        """The module docstring's second form (no release noise): the exact statistic
        from the joined rows' probabilities and pools; a cell whose expected count is
        below `min_size` is withheld."""
        (p,) = probabilities
        t, level = params["count_threshold"], params["inclusion_level"]
        pools, totals = pool_cells(p, strata, strata_labels, groups, t, level, min_size=min_size)
        if suppressed is not None:
            suppressed.extend(f"{c.pool}/{c.group}" for c in pools if c.included is None)
        group_results = group_figures(p, totals, groups, t, noised=False, min_size=min_size)
        return self._report(pools, group_results, option=option, n_matched=len(p), t=t, level=level,
                            confidence=confidence, tau=tau, min_size=min_size, info=dict(info))

    def _report(self, pools, group_results, *, option, n_matched, t, level, confidence, tau, min_size, info):
        """Either form's result: its cells, its all-pools figures and the verdict on them."""
        from common.stats.results import AuditReport
        return AuditReport(metric=self.name, metric_option=option, n_matched=n_matched, bootstrap=0,
                           confidence=confidence, interval="exact", groups=group_results,
                           verdict=inclusion_verdict(pools, group_results, t, level, tau, min_size),
                           pools=pools, params={"count_threshold": t, "inclusion_level": level}, info=info)


METRIC = ProbabilisticCount()

#: the verdict's severity when no cell falls short but some are withheld (grey: not a pass)
UNKNOWN_SEVERITY = "inconclusive"
#: how many cell names a verdict message lists before "..."
LISTED_CELLS = 10


def pool_cells(p: np.ndarray, strata: np.ndarray, strata_labels, groups, t: int, level: float, *,
               min_size: float):
    """One `PoolResult` per pool and group from the joined rows' probabilities (exact),
    and the groups' expected counts summed over the pools. A cell whose expected count
    is below `min_size` is withheld: its values are null and `included` is None,
    unknown (module docstring)."""
    from common.stats.results import PoolResult
    cells, total = [], np.zeros(len(groups))
    for s, label in enumerate(strata_labels):
        rows = p[strata == s]
        if len(rows) == 0:
            raise InputError(f"pool '{label}' has no member in the intersection", column="pool")
        prob, expected = count_summary(rows, t)
        total += expected
        for j, g in enumerate(groups):
            if expected[j] < min_size:
                cells.append(PoolResult(label, g, len(rows), None, None, None))
            else:
                cells.append(PoolResult(label, g, len(rows), float(expected[j]), float(prob[j]),
                                        bool(prob[j] >= level)))
    return cells, total


def group_figures(p: np.ndarray | None, totals: np.ndarray, groups, t: int, *, noised: bool, min_size: float):
    """`groups`: Pr(N_j >= T) over all pools, from the members' probabilities `p`, or with
    noise the Poisson tail at the sum of the pools' noised expected counts. A group
    whose expected count over all pools is below `min_size` (or unknown: NaN) gets no
    figure (null, like a withheld cell): under noise a figure there would be noise shown
    as a finding."""
    from common.stats.results import GroupResult
    prob = np.array([poisson_tail(x if math.isfinite(x) else 0.0, t) for x in totals]) if noised \
        else count_summary(p, t)[0]
    return [GroupResult.from_values(g, prob[j] if totals[j] >= min_size else np.nan, np.nan, np.nan)
            for j, g in enumerate(groups)]


def inclusion_verdict(pools, group_results, t: int, level: float, tau: float, min_size: float):
    """Rule "inclusion" in words that match the numbers: "flagged" when a released cell
    (or a group's figure over all pools) is below the level; otherwise, when a cell or a
    group's figure is withheld, the verdict is not a pass (`UNKNOWN_SEVERITY`: a withheld
    cell is unknown, neither included nor missing); "none" only when every cell and every
    group's figure is released and reaches the level."""
    from common.stats.verdict import Verdict
    below = [f"{c.pool}/{c.group}" for c in pools if c.included is False]
    below += [f"all pools/{g.group}" for g in group_results if g.estimate is not None and g.estimate < level]
    unknown = [f"{c.pool}/{c.group}" for c in pools if c.included is None]
    unknown += [f"all pools/{g.group}" for g in group_results if g.estimate is None]
    goal = f"Pr(N >= {t}) >= {level:g}"
    withheld = (f"{len(unknown)} cell(s) withheld by the release controls (expected count below the minimum "
                f"effective size {min_size:g}) are unknown, not included ({_listed(unknown)})") if unknown else ""
    if below:
        message = (f"flagged: Pr(N >= {t}) is below the inclusion level {level:g} for "
                   f"{len(below)} pool/group cells ({_listed(below)})" + (f"; {withheld}" if withheld else ""))
        return Verdict("inclusion", tau, "flagged", True, True, None, tuple(below), (), message)
    if unknown:
        cells = sum(c.included is not None for c in pools)
        figures = sum(g.estimate is not None for g in group_results)
        reached = (f"the {cells} released pool/group cell(s) and {figures} all-pools figure(s) each reach {goal}"
                   if cells or figures else "nothing is released")
        message = (f"inconclusive: {reached}; {withheld}. Larger pools, or fewer groups (--group-mapping), "
                   f"would make them conclusive")
        return Verdict("inclusion", tau, UNKNOWN_SEVERITY, False, False, None, (), (), message)
    return Verdict("inclusion", tau, "none", False, False, None, (), (),
                   f"every group reaches {goal} in every pool and over all pools ({len(pools)} cells, all released)")


def _listed(cells: list[str]) -> str:
    return ", ".join(cells[:LISTED_CELLS]) + (", ..." if len(cells) > LISTED_CELLS else "")


def poisson_tail(mean: float, t: int) -> float:
    """Pr(N >= t) for N ~ Poisson(max(mean, 0)): the regularized lower incomplete gamma
    function P(t, mean) (Numerical Recipes 6.2: its series below t + 1, Lentz's continued
    fraction for 1 - P above), in log space so that it stays exact where e^-mean
    underflows (expected counts in the thousands) and fast for T up to a million."""
    lam = max(float(mean), 0.0)
    if t <= 0:
        return 1.0
    if lam == 0.0:
        return 0.0
    log_prefix = -lam + t * math.log(lam) - math.lgamma(t)
    if lam < t + 1:
        term = total = 1.0 / t
        n = 0
        while abs(term) > abs(total) * _EPS:
            n += 1
            term *= lam / (t + n)
            total += term
        return min(1.0, max(0.0, total * math.exp(log_prefix)))
    return min(1.0, max(0.0, 1.0 - _upper_gamma_fraction(t, lam) * math.exp(log_prefix)))


_EPS = 1e-16
_TINY = 1e-300


def _upper_gamma_fraction(a: float, x: float) -> float:
    """The continued fraction of Q(a, x) without its prefactor e^-x x^a / Gamma(a)
    (modified Lentz; converges fast for x > a + 1)."""
    b = x + 1.0 - a
    c, d = 1.0 / _TINY, 1.0 / b
    h = d
    i = 0
    while True:
        i += 1
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = _TINY if abs(d) < _TINY else d
        c = b + an / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS or i > 100_000:
            return h
