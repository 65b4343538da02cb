"""Probabilistic count, an inclusion measurement (paper appendix C.2, eq. 19; design §5.8).

Dataset: `member_id[, pool]` (without a pool column every member is in one pool,
"all"). Not linear, so no HE: the Test-Client sends only its members' encrypted ids
and each row's pool (a plaintext stratum; pool names reach the Tester), and the Tester
computes, for each pool and group, the exact Poisson-binomial distribution of N_j, the
number of the pool's joined members in group j: Pr(N_j ≥ T) for the
`count_threshold` T (default 1: 1 − Π_i (1 − p_ij)), the expected count Σ_i p_ij, and
whether Pr(N_j ≥ T) clears the `inclusion_level` (default 0.90). `groups` reports
Pr(N_j ≥ T) over all pools together. Verdict (rule "inclusion", `inclusion_verdict`):
flagged when some group of some pool, or of all pools together, falls below the level;
"inconclusive" when none does but some cell is withheld (a withheld cell is unknown:
`included` is None, neither included nor missing); "none" only when every cell is
released and reaches the level. A pool with no member in the intersection is an
error. The result is the Tester's (the Test-Client's session ends once its rows
are sent).

Release controls (`tester_service.release`): a pool/group cell whose expected count
(with release noise: plus `threshold_noise`) is below the minimum effective size is
suppressed (reported as null), and with release
noise every expected count carries Gaussian noise (`noise`: the Tester's draw, one per
group); Pr(N_j >= T) is then the Poisson tail at the noised expected count (post-
processing of the noised release: the exact Poisson-binomial tail would use every
member's probability again), and the all-pools figures come from the noised pool sums
(a group whose summed expected count is below the minimum effective size gets none:
that figure would be noise). Released expected counts are shown clipped at 0.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from common.errors import InputError
from common.metrics.base import ClientRows, Metric, Param, positive_int, probability
from common.metrics.scoring import count_summary

DEFAULT_POOL = "all"
MAX_POOLS = 10_000


class ProbabilisticCount(Metric):
    name = "prob-count"
    description = "probabilistic count: probability that each group has at least T members in a pool"
    params = (Param("count_threshold", "T: the count to reach (default 1)", positive_int(1_000_000), 1),
              Param("inclusion_level", "the probability Pr(N_j >= T) must reach (default 0.90)", probability, 0.90))
    text_columns = ("pool",)
    optional_columns = ("pool",)
    needs_he = False
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
        return ClientRows(ids=(ids,), values=None, strata=codes.astype(np.int64),
                          strata_labels=tuple(str(x) for x in labels), info={"pools": len(labels)})

    def check_info(self, info, strata_labels):
        if not 1 <= len(strata_labels) <= MAX_POOLS:
            raise ValueError("pools")

    def local_result(self, probabilities, strata, strata_labels, groups, option, params, info, *,
                     confidence, tau, noise: Callable[[], np.ndarray] | None = None, min_size: float = 0.0,
                     threshold_noise: Callable[[], np.ndarray] | None = None,
                     suppressed: list[str] | None = None):
        from common.stats.results import AuditReport
        (p,) = probabilities
        t, level = params["count_threshold"], params["inclusion_level"]
        pools, totals = pool_cells(p, strata, strata_labels, groups, t, level, noise=noise, min_size=min_size,
                                   threshold_noise=threshold_noise)
        if suppressed is not None:
            suppressed.extend(f"{c.pool}/{c.group}" for c in pools if c.included is None)
        group_results = group_figures(p, totals, groups, t, noised=noise is not None, min_size=min_size)
        return AuditReport(metric=self.name, metric_option=option, n_matched=len(p), bootstrap=0,
                           confidence=confidence, interval="exact", groups=group_results,
                           verdict=inclusion_verdict(pools, group_results, t, level, tau, min_size),
                           pools=pools, params={"count_threshold": t, "inclusion_level": level}, info=dict(info))


METRIC = ProbabilisticCount()

#: the verdict's severity when no cell falls short but some are withheld (grey: not a pass)
UNKNOWN_SEVERITY = "inconclusive"
#: how many cell names a verdict message lists before "..."
LISTED_CELLS = 10


def pool_cells(p: np.ndarray, strata: np.ndarray, strata_labels, groups, t: int, level: float, *,
               noise: Callable[[], np.ndarray] | None, min_size: float,
               threshold_noise: Callable[[], np.ndarray] | None):
    """One `PoolResult` per pool and group, and the groups' expected counts summed over
    the pools (noised where the cells are). A cell whose expected count (plus threshold
    noise) is below `min_size` is withheld: its values are null and `included` is None,
    unknown (module docstring). A released noised expected count is shown clipped at 0
    (post-processing)."""
    from common.stats.results import PoolResult
    cells, total = [], np.zeros(len(groups))
    for s, label in enumerate(strata_labels):
        rows = p[strata == s]
        if len(rows) == 0:
            raise InputError(f"pool '{label}' has no member in the intersection", column="pool")
        prob, expected = count_summary(rows, t)
        hidden = (expected + threshold_noise() if threshold_noise is not None else expected) < min_size
        if noise is not None:
            expected = np.maximum(expected + noise(), 0.0)
            prob = np.array([poisson_tail(x, t) for x in expected])
        total += expected
        for j, g in enumerate(groups):
            if hidden[j]:
                cells.append(PoolResult(label, g, len(rows), None, None, None))
            else:
                cells.append(PoolResult(label, g, len(rows), float(expected[j]), float(prob[j]),
                                        bool(prob[j] >= level)))
    return cells, total


def group_figures(p: np.ndarray, totals: np.ndarray, groups, t: int, *, noised: bool, min_size: float):
    """`groups`: Pr(N_j >= T) over all pools, from the members' probabilities, or with
    noise the Poisson tail at the sum of the pools' noised expected counts. A group
    whose expected count over all pools is below `min_size` gets no figure (null, like a
    withheld cell): under noise a figure there would be noise shown as a finding."""
    from common.stats.results import GroupResult
    prob = np.array([poisson_tail(x, t) for x in totals]) if noised else count_summary(p, t)[0]
    return [GroupResult.from_values(g, prob[j] if totals[j] >= min_size else np.nan, np.nan, np.nan)
            for j, g in enumerate(groups)]


def inclusion_verdict(pools, group_results, t: int, level: float, tau: float, min_size: float):
    """Rule "inclusion" in words that match the numbers: "flagged" when a released cell
    (or a group's figure over all pools) is below the level; otherwise, when a cell or a
    group's figure is withheld, the verdict is not a pass (`UNKNOWN_SEVERITY`: a withheld
    cell is unknown, neither included nor missing); "none" only when every cell and every
    group's figure is released and reaches the level."""
    from common.stats.results import Verdict
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
