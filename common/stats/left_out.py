"""The groups left out of a verdict for their size (design §5.10).

A group takes no part in a verdict (its estimate is still reported) when the
Tester finds it too small (`small_groups`). Without release noise, for a rate metric
(ERO: rows are 0/1 events) its Kish effective sample size n_K = (Σ_i p_ij)² / Σ_i p_ij²
among the joined rows is below MIN_KISH_SIZE (300; `small_for_verdict`; other metrics:
Σ_i p_ij below MIN_EFFECTIVE_SIZE, as their outcomes can vary far less than a rate's
r(1 − r), so a group of a few hundred can be informative).

Reason: an estimate carried by few effective members has a bootstrap interval whose
width follows its own few events, narrow exactly when the estimate is far from the truth
(`ppre synth` data, 10,000 members: aian, n_K ≈ 270, has a bootstrap sd down to 0.4 of
the true one and |t| > 2.9 in 6% of datasets, a normal 0.4%; with it the null flag rate
was 12.6%, `bench/bench_null.py`); and below 300 effective members no rate in [0.05,
0.95] can be informative (z·√(r(1−r)/n_K) ≤ τ/2 needs n_K ≥ (2z/τ)²·r(1−r), 300 at r =
0.05, τ = 0.05), so such a group looks informative only through too narrow an interval.
Kish rather than Σ_i p_ij: it counts the rows that carry the estimate (one-hot
probabilities: the group's count, so small test populations keep their groups of 300 or
more), and it depends on the Tester's probabilities alone, not on outcomes. Under
release noise exact sizes would leak (the list reaches the Test-Client): the Tester
decides on the noised effective sizes it releases anyway (Σ_i p_ij plus Gaussian noise,
`tester_service.release`), below MIN_EFFECTIVE_SIZE or below the policy's minimum (then
also withheld). A left-out group rules out a green "none": nothing significant then
reads "inconclusive".
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

#: a group whose effective size among the joined rows (Σ_i p_ij) is below this takes no
#: part in a verdict: with a handful of effective members the bootstrap cannot see how
#: much the estimate could vary (a few members with no event give a narrow interval
#: around a rate far from the truth). Its estimate is still reported. Under release
#: noise the Tester decides on the noised size (module docstring).
MIN_EFFECTIVE_SIZE = 30.0
#: without release noise (bootstrap intervals), a group of a rate metric whose Kish
#: effective sample size (Σ_i p_ij)² / Σ_i p_ij² among the joined rows is below this takes
#: no part in a verdict (module docstring); Kish ≥ Σ_i p_ij, so this subsumes
#: MIN_EFFECTIVE_SIZE
MIN_KISH_SIZE = 300.0
#: metrics whose rows are 0/1 events, so that a group's estimate is a rate: the premise of
#: MIN_KISH_SIZE (a rate's variance is r(1 − r)/n; other outcomes in a range vary less)
RATE_METRICS = ("ero",)


def kish_sizes(probabilities: np.ndarray) -> np.ndarray:
    """Per column of `probabilities` ((rows, groups), probabilities or integers on one
    common scale): the Kish effective sample size (Σ_i p_ij)² / Σ_i p_ij² (0 for an
    empty group). One-hot probabilities give the group's count; a group spread thinly
    over many rows gets more than Σ_i p_ij, one carried by a few rows with large p_ij
    about that few."""
    p = np.asarray(probabilities, dtype=np.float64)
    total, squares = p.sum(axis=0), np.square(p).sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(squares > 0, total * total / np.where(squares > 0, squares, 1.0), 0.0)


def small_for_verdict(probabilities: np.ndarray, groups: Sequence[str], metric: str,
                      scale: float = 1.0) -> list[str]:
    """The groups left out of a verdict without release noise (module docstring): for a
    rate metric (RATE_METRICS) a Kish effective sample size below MIN_KISH_SIZE, for any
    other an effective size Σ_i p_ij below MIN_EFFECTIVE_SIZE (`probabilities` on the
    scale `scale`: 2^32 for quantised ones). Exact sizes: only for audits without
    release noise (the list is sent to the Test-Client)."""
    if metric in RATE_METRICS:
        sizes, floor = kish_sizes(probabilities), MIN_KISH_SIZE
    else:
        sizes, floor = np.asarray(probabilities, dtype=np.float64).sum(axis=0) / scale, MIN_EFFECTIVE_SIZE
    return [g for g, size in zip(groups, sizes) if size < floor]

