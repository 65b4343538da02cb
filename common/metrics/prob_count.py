"""Probabilistic count, an inclusion measurement (paper appendix C.2, eq. 19; SPEC.md section 5).

Dataset: `member_id[, pool]` (without a pool column every member is in one pool,
"all"). Not linear, so no HE: the Test-Client sends only its members' encrypted ids
and each row's pool (a plaintext stratum; pool names reach the Tester), and the Tester
computes, for each pool and group, the exact Poisson-binomial distribution of N_j, the
number of the pool's joined members in group j: Pr(N_j ≥ T) for the
`count_threshold` T (default 1: 1 − Π_i (1 − p_ij)), the expected count Σ_i p_ij, and
whether Pr(N_j ≥ T) clears the `inclusion_level` (default 0.90). `groups` reports
Pr(N_j ≥ T) over all pools together. Verdict (rule "inclusion"): flagged when some
group of some pool falls below the level. A pool with no member in the intersection
is an error. The result is the Tester's (the Test-Client's session ends once its rows
are sent).

Release controls (`tester_service.release`): a pool/group cell whose expected count
(with release noise: plus `threshold_noise`) is below the minimum effective size is
suppressed (reported as null), and with release
noise every expected count carries Gaussian noise (`noise`: the Tester's draw, one per
group); Pr(N_j >= T) is then the Poisson tail at the noised expected count (post-
processing of the noised release: the exact Poisson-binomial tail would use every
member's probability again), and the all-pools figures come from the noised pool sums.
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
        from common.results import AuditReport, GroupResult, PoolResult, Verdict
        (p,) = probabilities
        t, level = params["count_threshold"], params["inclusion_level"]
        pools, below = [], []
        total = np.zeros(len(groups))
        for s, label in enumerate(strata_labels):
            rows = p[strata == s]
            if len(rows) == 0:
                raise InputError(f"pool '{label}' has no member in the intersection", column="pool")
            prob, expected = count_summary(rows, t)
            hidden = (expected + threshold_noise() if threshold_noise is not None else expected) < min_size
            if noise is not None:
                expected = expected + noise()
                prob = np.array([poisson_tail(x, t) for x in expected])
            total += expected
            for j, g in enumerate(groups):
                if hidden[j]:
                    if suppressed is not None:
                        suppressed.append(f"{label}/{g}")
                    pools.append(PoolResult(label, g, len(rows), None, None, False))
                    continue
                included = bool(prob[j] >= level)
                pools.append(PoolResult(label, g, len(rows), float(expected[j]), float(prob[j]), included))
                if not included:
                    below.append(f"{label}/{g}")
        if noise is not None:
            prob_all = np.array([poisson_tail(x, t) for x in total])
        else:
            prob_all, _ = count_summary(p, t)
        group_results = [GroupResult.from_values(g, prob_all[j], np.nan, np.nan) for j, g in enumerate(groups)]
        if below:
            message = (f"flagged: Pr(N >= {t}) is below the inclusion level {level:g} for "
                       f"{len(below)} pool/group cells ({', '.join(below[:10])}{', ...' if len(below) > 10 else ''})")
        else:
            message = f"every group reaches Pr(N >= {t}) >= {level:g} in every pool"
        verdict = Verdict("inclusion", tau, "flagged" if below else "none", bool(below), bool(below), None,
                          tuple(below), (), message)
        return AuditReport(metric=self.name, metric_option=option, n_matched=len(p), bootstrap=0,
                           confidence=confidence, interval="exact", groups=group_results, verdict=verdict,
                           pools=pools, params={"count_threshold": t, "inclusion_level": level}, info=dict(info))


METRIC = ProbabilisticCount()


def poisson_tail(mean: float, t: int) -> float:
    """Pr(N >= t) for N ~ Poisson(max(mean, 0))."""
    lam = max(float(mean), 0.0)
    term, below = math.exp(-lam), 0.0
    for k in range(t):
        below += term
        term *= lam / (k + 1)
    return max(0.0, 1.0 - below)
