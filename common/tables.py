"""Reading the parties' input tables (CSV or Parquet) with errors that name the place.

I/O at the edge: both parties read their files through `read_table`, which checks the
file exists, has the required columns (suggesting the close spelling of a misspelt
one), keeps member ids as strings and refuses empty or duplicate ids. Error messages
name the file, column and row, never a member id or a value.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from common.errors import InputError


def read_table(path: str | Path, required: Sequence[str], *, id_column: str = "member_id") -> pd.DataFrame:
    path = Path(path)
    name = str(path)
    if not path.is_file():
        raise InputError("file not found", file=name)
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            frame = pd.read_parquet(path)
            if id_column in frame.columns:
                frame[id_column] = frame[id_column].astype("string")
        else:
            frame = pd.read_csv(path, dtype={id_column: str}, keep_default_na=False, na_values=[""],
                                encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not valid UTF-8 (byte offset {exc.start})", file=name) from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, OSError, ValueError) as exc:
        raise InputError(f"cannot be read as a table ({type(exc).__name__})", file=name) from None
    frame.columns = [str(c).strip() for c in frame.columns]
    for column in [id_column, *required]:
        if column not in frame.columns:
            close = difflib.get_close_matches(column, list(frame.columns), n=1)
            hint = f" (found '{close[0]}': misspelt?)" if close else ""
            raise InputError(f"required column is missing{hint}", file=name, column=column)
    if len(frame) == 0:
        raise InputError("the table has no rows", file=name)
    ids = frame[id_column]
    missing = ids.isna() | (ids.astype(str).str.strip() == "")
    if missing.any():
        raise InputError("empty member id", file=name, column=id_column, row=first_row(missing))
    frame[id_column] = ids.astype(str).str.strip()
    dup = frame[id_column].duplicated()
    if dup.any():
        raise InputError("duplicate member id", file=name, column=id_column, row=first_row(dup))
    return frame.reset_index(drop=True)


def first_row(mask: pd.Series | np.ndarray) -> int:
    """1-based data row number of the first True (the header is row 0)."""
    return int(np.flatnonzero(np.asarray(mask))[0]) + 1


def numeric_column(frame: pd.DataFrame, column: str, file: str) -> np.ndarray:
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = values.isna()
    if bad.any():
        raise InputError("not a number", file=file, column=column, row=first_row(bad))
    return values.to_numpy(dtype=np.float64)


def binary_column(frame: pd.DataFrame, column: str, file: str) -> np.ndarray:
    values = numeric_column(frame, column, file)
    bad = ~np.isin(values, (0.0, 1.0))
    if bad.any():
        raise InputError("label must be 0 or 1", file=file, column=column, row=first_row(bad))
    return values.astype(np.int64)
