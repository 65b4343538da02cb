"""The Test-Client's named datasets (README "Inputs"; SPEC.md section 5 metrics).

A dataset is a file `<name>.csv` or `<name>.parquet` in the client's data directory
(or an explicit `name=path` mapping). It is read when an audit asks for it, by the
metric (`common.metrics`: its columns through `common.tables.read_table`, with the
file size, encoding, consistency and member-id rules), checked by the metric, and held
only in that session's memory.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from common.errors import InputError
from common.metrics.base import Metric

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SUFFIXES = (".csv", ".parquet")


class DatasetRegistry:
    def __init__(self, data_dir: str | Path | None = None, named: dict[str, str | Path] | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir else None
        self.named = {k: Path(v) for k, v in (named or {}).items()}

    def names(self) -> list[str]:
        found = set(self.named)
        if self.data_dir and self.data_dir.is_dir():
            found |= {p.stem for p in self.data_dir.iterdir() if p.suffix in _SUFFIXES}
        return sorted(found)

    def path(self, name: str) -> Path:
        if not _NAME.match(name or ""):
            raise InputError("dataset names are letters, digits, '.', '_' or '-'", parameter="client dataset")
        if name in self.named:
            return self.named[name]
        if self.data_dir:
            for suffix in _SUFFIXES:
                candidate = self.data_dir / f"{name}{suffix}"
                if candidate.is_file():
                    return candidate
        raise InputError(f"unknown dataset '{name}' (known: {', '.join(self.names()) or 'none'})",
                         parameter="client dataset")

    def load(self, name: str, metric: Metric) -> pd.DataFrame:
        """The dataset as the metric reads it; its file label in `frame.attrs["file"]`
        (the metric's own checks name it)."""
        path = self.path(name)
        frame = metric.read(str(path))
        frame.attrs["file"] = str(path)
        return frame
