"""Output metric (paper appendix C.1, eq. 18): per-group means of a plain outcome.

Dataset: `member_id, outcome` (real-valued, negative allowed, |outcome| <= 10^9).
Per row f = outcome (fixed point, 2^-24 resolution) and d = 1. Cells: each group and
overall. Verdict: the largest gap between two groups (rule "range").
"""
from __future__ import annotations

import numpy as np

from common.metrics.base import ClientRows, Component, Metric, finite_column

#: outcomes are encoded with 24 fractional bits; |outcome| up to 10^9
SCALE_BITS = 24
MAX_OUTCOME = 1e9


class OutputMetric(Metric):
    name = "output"
    corrects = True
    description = "output metric: per-group mean of an outcome"
    numeric_columns = ("outcome",)
    verdict_rule = "range"

    def components(self, option, params, info):
        bound = int(MAX_OUTCOME * (1 << SCALE_BITS)) + 1
        return (Component("outcome", SCALE_BITS, bound), Component("one", SCALE_BITS, 1 << SCALE_BITS))

    def client_rows(self, frame, file, option, params, rng):
        y = finite_column(frame, "outcome", file, limit=MAX_OUTCOME)
        return ClientRows(ids=(frame["member_id"].to_numpy(dtype=object),),
                          values=np.column_stack([y, np.ones_like(y)]))


METRIC = OutputMetric()
