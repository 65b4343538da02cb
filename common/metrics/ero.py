"""ERO, false-positive burden (SPEC.md section 5; paper eq. 6).

Dataset: `member_id, y_true, y_pred` (labels 0/1). Per row f = 1(ŷ=1, y=0) and
d = 1(y=0) (option `fpr`, the standard false-positive rate) or d = 1 (option
`unconditional`, the paper's eq. 6). Cells: each group and overall. Verdict: the
largest gap between two groups (see `common.results`, rule "range").
"""
from __future__ import annotations

import numpy as np

from common.metrics.base import ClientRows, Component, Metric
from common.tables import binary_column


class Ero(Metric):
    name = "ero"
    corrects = True
    description = "false-positive burden: per-group false-positive rate"
    options = ("fpr", "unconditional")
    option_help = "fpr (default): d = 1(y=0); unconditional: d = 1 (paper eq. 6)"
    numeric_columns = ("y_true", "y_pred")
    verdict_rule = "range"

    def components(self, option, params, info):
        return (Component("f", 0, 1), Component("d", 0, 1))

    def client_rows(self, frame, file, option, params, rng):
        y = binary_column(frame, "y_true", file)
        yhat = binary_column(frame, "y_pred", file)
        f = ((yhat == 1) & (y == 0)).astype(np.float64)
        d = (y == 0).astype(np.float64) if option == "fpr" else np.ones_like(f)
        return ClientRows(ids=(frame["member_id"].to_numpy(dtype=object),), values=np.column_stack([f, d]))


METRIC = Ero()
