"""ERO, false-positive burden (design §5.2; paper eq. 6).

Dataset: `member_id, y_true, y_pred` (labels 0/1). Per row f = 1(ŷ=1, y=0) and
d = 1(y=0) (option `fpr`, the standard false-positive rate) or d = 1 (option
`unconditional`, the paper's eq. 6). Cells: each group and overall. Verdict: the
largest gap between two groups (see `common.stats.verdict`, rule "range").

From model scores: with the parameter `decision_threshold` X (`ppre audit
--decision-threshold X`), the Test-Client reads a `score` column instead of `y_pred`
and decides ŷ = 1(score >= X) itself, in plaintext, before anything is encrypted; a
score that is missing, no number or infinite is refused with its row. Both columns are
optional when the file is read (`common.tables.read_table`, ``lenient``), so a dataset
may hold either or both; the one the parameters name is checked in `client_rows`.
"""
from __future__ import annotations

import math

import numpy as np

from common.errors import InputError
from common.metrics.base import ClientRows, Component, Metric, Param
from common.tables import binary_column, first_row, misspelling_hint, missing_column

#: the column ERO reads with a decision threshold
SCORE_COLUMN = "score"


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


class Ero(Metric):
    name = "ero"
    corrects = True
    moment_interval = True
    estimate_range = (0.0, 1.0)
    description = "false-positive burden: per-group false-positive rate"
    options = ("fpr", "unconditional")
    option_help = "fpr (default): d = 1(y=0); unconditional: d = 1 (paper eq. 6)"
    params = (Param("decision_threshold", "read a 'score' column instead of y_pred, with y_pred = 1(score >= X), "
                                          "decided by the Test-Client before encryption", finite_float),)
    numeric_columns = ("y_true", "y_pred")
    #: the columns with a decision threshold (`score` instead of `y_pred`)
    threshold_columns = ("y_true", SCORE_COLUMN)
    verdict_rule = "range"

    def read(self, path, columns=None):
        from common.tables import read_table
        return read_table(path, ("y_true",), lenient=("y_pred", SCORE_COLUMN), columns=columns)

    def components(self, option, params, info):
        return (Component("f", 0, 1), Component("d", 0, 1))

    def predictions(self, frame, file, params) -> np.ndarray:
        """ŷ: the `y_pred` labels, or 1(score >= X) with a decision threshold X."""
        threshold = params.get("decision_threshold")
        column = "y_pred" if threshold is None else SCORE_COLUMN
        if column not in frame.columns:
            listed = frame.attrs.get("file_columns", list(frame.columns))
            hint = misspelling_hint(column, [c for c in listed if c.strip().lower() not in frame.columns])
            mapping = frame.attrs.get("column_mapping") or {}
            if column in mapping:
                hint += f" (the column mapping reads it from '{mapping[column]}')"
            also = (f"; or decide from its '{SCORE_COLUMN}' column with a decision threshold "
                    "(--decision-threshold X)") if threshold is None and SCORE_COLUMN in frame.columns else ""
            raise missing_column(column, listed, file, hint, also)
        if threshold is None:
            return binary_column(frame, "y_pred", file)
        scores = frame[SCORE_COLUMN].to_numpy(dtype=np.float64)
        nan = np.isnan(scores)
        if nan.any():
            raise InputError("not a number (a score is needed for every row)", file=file, column=SCORE_COLUMN,
                             row=first_row(nan))
        infinite = ~np.isfinite(scores)
        if infinite.any():
            raise InputError("must be a finite number", file=file, column=SCORE_COLUMN, row=first_row(infinite))
        return (scores >= threshold).astype(np.int64)

    def client_rows(self, frame, file, option, params, rng):
        y = binary_column(frame, "y_true", file)
        yhat = self.predictions(frame, file, params)
        f = ((yhat == 1) & (y == 0)).astype(np.float64)
        d = (y == 0).astype(np.float64) if option == "fpr" else np.ones_like(f)
        return ClientRows(ids=(frame["member_id"].to_numpy(dtype=object),), values=np.column_stack([f, d]))


METRIC = Ero()
