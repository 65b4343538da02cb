"""Coverage of the sampled MQOS-AUC interval (common.metrics.mqos_auc, `sampled`).

Pairs are drawn uniformly from all positive-negative pairs (among dummy rows valued 0),
members are put in G random groups, and the interval is the random-groups t interval
over the G within-group estimates (rows whose two members share a group). Resampling the pairs instead would
ignore that pairs share members: this test shows that such intervals cover far too
rarely, while the random-groups ones reach the nominal level. Plaintext simulation of
exactly the estimator the services compute (hard groups: weights 0 or 1).
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from common.metrics import get_metric
from common.stats.intervals import marginal_intervals


def _binormal(n: int, auc_shift: float, rng: np.random.Generator):
    y = (rng.random(n) < 0.4).astype(int)
    score = rng.normal(0, 1, n) + auc_shift * y
    return y, score


def test_sampled_auc_random_group_intervals_cover_and_pair_bootstrap_does_not():
    metric = get_metric("mqos-auc").for_option("sampled")
    params = metric.parse_params({"pairs": "20000", "pairs_per_member": "1000"})
    rng = np.random.default_rng(21)
    shift = 1.0
    truth = 0.5 * (1 + math.erf(shift / 2))  # AUC of N(shift, 1) against N(0, 1): Φ(shift/√2)
    trials, covered, covered_pairs = 150, 0, 0
    G = metric.random_groups
    for _ in range(trials):
        y, score = _binormal(600, shift, rng)
        frame = pd.DataFrame({"member_id": [f"m{i}" for i in range(600)], "y_true": y, "score": score})
        rows = metric.client_rows(frame, "d.csv", "sampled", params, rng)
        win, one = rows.values[:, 0], rows.values[:, 1]  # dummy rows: (0, 0)
        full = win.sum() / one.sum()
        per_group = np.array([win[rows.units == g].sum() / one[rows.units == g].sum() for g in range(G)])
        win = win[one == 1]
        low, high = marginal_intervals(np.concatenate([[full], per_group])[:, None], 0.95, "random_groups")
        covered += low[0] <= truth <= high[0]
        # the naive alternative: resample the real pairs as if they were independent
        boot = np.array([win[rng.integers(0, len(win), len(win))].mean() for _ in range(200)])
        lo, hi = np.quantile(boot, [0.025, 0.975])
        covered_pairs += lo <= truth <= hi
    assert 0.90 <= covered / trials <= 1.0, covered / trials
    assert covered_pairs / trials < 0.75, covered_pairs / trials
