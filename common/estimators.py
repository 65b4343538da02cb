"""Metric definitions as ratio estimators (SPEC.md section 5).

Every metric is mu[j] = sum_i p_ij f_i / sum_i p_ij d_i. A metric here only says how
the Test-Client turns its model outputs into the per-row values (f_i, d_i), in
plaintext and before encryption, and which columns it needs; the encrypted
aggregation is the same for all of them (fairlearn's MetricFrame idea: small
metric functions, one shared machinery).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd

from common.errors import InputError
from common.tables import binary_column


@dataclass(frozen=True)
class RatioMetric:
    name: str
    description: str
    columns: tuple[str, ...]
    #: (frame, option) -> (f, d) integer arrays; the frame is already validated.
    values: Callable[[pd.DataFrame, str], tuple[np.ndarray, np.ndarray]]
    #: magnitude bound on |f| and |d| (for the slot plan)
    value_bound: int
    options: tuple[str, ...] = ("default",)
    #: (frame, file name) -> None; raises InputError naming the column and row
    validate: Callable[[pd.DataFrame, str], None] = lambda frame, file: None


def _ero_values(frame: pd.DataFrame, form: str) -> tuple[np.ndarray, np.ndarray]:
    """ERO, false-positive burden: f = 1(yhat=1, y=0); d = 1(y=0) (FPR) or 1 (paper eq. 6)."""
    y = pd.to_numeric(frame["y_true"]).to_numpy(dtype=np.int64)
    yhat = pd.to_numeric(frame["y_pred"]).to_numpy(dtype=np.int64)
    f = ((yhat == 1) & (y == 0)).astype(np.int64)
    if form == "fpr":
        d = (y == 0).astype(np.int64)
    elif form == "unconditional":
        d = np.ones_like(f)
    else:
        raise InputError(f"unknown ERO form '{form}' (fpr, unconditional)", parameter="ero_form")
    return f, d


def _validate_binary_labels(frame: pd.DataFrame, file: str) -> None:
    for column in ("y_true", "y_pred"):
        binary_column(frame, column, file)


ERO = RatioMetric(
    name="ero",
    description="false-positive burden: per-group false-positive rate",
    columns=("y_true", "y_pred"),
    values=_ero_values,
    value_bound=1,
    options=("fpr", "unconditional"),
    validate=_validate_binary_labels,
)

METRICS: dict[str, RatioMetric] = {m.name: m for m in (ERO,)}


def get_metric(name: str) -> RatioMetric:
    try:
        return METRICS[name]
    except KeyError:
        raise InputError(f"unknown metric '{name}' (known: {', '.join(sorted(METRICS))})",
                         parameter="metric") from None


def plain_ratio(probabilities: np.ndarray, f: np.ndarray, d: np.ndarray) -> np.ndarray:
    """The plaintext weighted formula mu[j] (reference for tests and the demo's truth)."""
    p = np.asarray(probabilities, dtype=np.float64)
    num = p.T @ np.asarray(f, dtype=np.float64)
    den = p.T @ np.asarray(d, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)
