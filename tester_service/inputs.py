"""The Tester's prepared probability table, used as given (docs/inputs.md; the
alternative to the preparation, design §2.5).

`member_id` and one column per group: the six races (`white, black, api, aian,
multiple, hispanic`) or any other groups (e.g. `member_id, hsm, non_hsm`, a split made
elsewhere); each row non-negative, finite and summing to 1 within 1e-6. A group
mapping (`--group-mapping`) coarsens a table of the six races as it does BISG's
output. Read per audit through `common.tables.read_table` (file size, encoding,
consistency and member-id rules), held only in the session's memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np
import pandas as pd

from common.errors import InputError
from common.races import RACES, GroupMapping
from common.tables import first_row, misspelling_hint, missing_column, numeric_column, read_table, source_label

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


#: most group columns a probability table may have (the peer protocol's limit)
MAX_GROUPS = 64
#: a group may not be called this: results add an "overall" entry
RESERVED_GROUP = "overall"


def read_probability_table(path: str | Path, mapping: GroupMapping | None = None,
                           columns: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The table's groups as given, or coarsened by `mapping` (which needs the six races).
    ``columns``: the column mapping (`common.tables.parse_column_mapping`)."""
    label = source_label(path)
    frame = read_table(path, None, columns=columns)
    columns = tuple(c for c in frame.columns if c != "member_id")
    if any(c in RACES for c in columns):
        # a table of the six races: all six are needed, other columns are ignored (but a
        # misspelt race is named, never taken for a group of its own)
        missing = [r for r in RACES if r not in columns]
        if missing:
            hint = misspelling_hint(missing[0], [c for c in columns if c not in RACES])
            raise missing_column(missing[0], frame.attrs.get("file_columns", columns), label, hint)
        columns = RACES
    if not columns:
        raise InputError("has no group columns (member_id and one column per group)", file=label)
    if len(columns) > MAX_GROUPS:
        raise InputError(f"has {len(columns)} group columns; at most {MAX_GROUPS}", file=label)
    if RESERVED_GROUP in columns:
        raise InputError(f"'{RESERVED_GROUP}' is reserved for the overall estimate; rename the group",
                         file=label, column=RESERVED_GROUP)
    table = validate_probabilities(frame, label, columns)
    if mapping is None:
        return table
    if set(columns) != set(RACES):
        raise InputError(f"a group mapping needs the six race columns ({', '.join(RACES)}); the table has "
                         f"{', '.join(columns)}", file=label)
    coarse = pd.DataFrame(mapping.apply(table[list(RACES)].to_numpy()), columns=list(mapping.names))
    coarse.insert(0, "member_id", table["member_id"].to_numpy())
    coarse.attrs["group_mapping"] = str(mapping)  # for the result (`AuditReport.group_mapping`)
    return coarse
