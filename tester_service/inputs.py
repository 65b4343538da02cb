"""The Tester's prepared probability table, used as given (README "Inputs"; the
alternative to SPEC.md section 2's preparation).

`member_id, white, black, api, aian, multiple, hispanic`; each row non-negative, finite
and summing to 1 within 1e-6. Read per audit through `common.tables.read_table` (file
size, encoding, consistency and member-id rules), held only in the session's memory.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from common.errors import InputError
from common.races import RACES
from common.tables import first_row, numeric_column, read_table

SUM_TOLERANCE = 1e-6


def validate_probabilities(frame: pd.DataFrame, file: str, columns: tuple[str, ...] = RACES) -> pd.DataFrame:
    matrix = np.column_stack([numeric_column(frame, c, file) for c in columns])
    for j, column in enumerate(columns):
        bad = (matrix[:, j] < 0) | ~np.isfinite(matrix[:, j])
        if bad.any():
            raise InputError("probability is negative or not finite", file=file, column=column, row=first_row(bad))
    off = np.abs(matrix.sum(axis=1) - 1.0) > SUM_TOLERANCE
    if off.any():
        raise InputError(f"probabilities do not sum to 1 (tolerance {SUM_TOLERANCE:g})", file=file, row=first_row(off))
    out = pd.DataFrame(matrix, columns=list(columns))
    out.insert(0, "member_id", frame["member_id"].to_numpy())
    return out


def read_probability_table(path: str | Path) -> pd.DataFrame:
    frame = read_table(path, RACES)
    return validate_probabilities(frame, str(path))
