"""The Test-Client's named datasets (docs/inputs.md; design §5 metrics).

A dataset is a file `<name>.csv` or `<name>.parquet` in the client's data directory
(or an explicit `name=path` mapping). It is read when an audit asks for it (its columns
renamed by the registry's column mapping, if any), by the
metric (`common.metrics`: its columns through `common.tables.read_table`, with the
file size, encoding, consistency and member-id rules), checked by the metric, and held
only in that session's memory.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

import pandas as pd

from common.errors import InputError
from common.metrics.base import Metric
from common.tables import DATAFRAME_LABEL, MissingColumn, mapping_flag

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SUFFIXES = (".csv", ".parquet")


class DatasetRegistry:
    """`columns`: the column mapping every dataset is read with (our column name -> the
    file's, `common.tables.parse_column_mapping`: `--id-column`, `--column`). `frames`:
    datasets held in memory as pandas DataFrames (the Python API, `ppre.api`), read under
    the same rules as files and never written anywhere. `how`: how the owner of these
    datasets maps a column, for a missing column's message (`common.tables.MissingColumn`;
    default: `ppre client serve`'s flags)."""

    def __init__(self, data_dir: str | Path | None = None, named: dict[str, str | Path] | None = None,
                 columns: dict[str, str] | None = None, frames: dict[str, pd.DataFrame] | None = None,
                 how: Callable[[str], str] | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir else None
        self.named = {k: Path(v) for k, v in (named or {}).items()}
        self.columns = dict(columns or {})
        self.frames = dict(frames or {})
        self.how = how or served_mapping

    def names(self) -> list[str]:
        found = set(self.named) | set(self.frames)
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

    def check_servable(self) -> None:
        """A service must have something to serve (`ppre client serve`, checked before it
        listens, as the Tester's members file is): a `--data-dir` that is a directory, each
        `--dataset NAME=FILE` an existing file, and at least one dataset in all. Each
        failure is one InputError naming the directory, file or flag and what to do."""
        if self.data_dir is not None and not self.data_dir.is_dir():
            what = "is not a directory" if self.data_dir.exists() else "does not exist"
            raise InputError(f"'{self.data_dir}' {what}: give the directory that holds the datasets NAME.csv / "
                             f"NAME.parquet (a typo?), or --dataset NAME=FILE", parameter="--data-dir")
        for name, path in self.named.items():
            if not path.is_file():
                raise InputError(f"{name}={path}: no such file (give NAME=FILE with an existing CSV or Parquet "
                                 f"file)", parameter="--dataset")
        if not self.names():
            where = (f"'{self.data_dir}' holds no NAME.csv or NAME.parquet file" if self.data_dir is not None
                     else "no dataset given")
            raise InputError(f"{where}: a Test-Client with no dataset serves nothing; give --data-dir DIR with "
                             f"files NAME.csv / NAME.parquet, or --dataset NAME=FILE",
                             parameter="--data-dir" if self.data_dir is not None else "--dataset")

    def load(self, name: str, metric: Metric) -> pd.DataFrame:
        """The dataset as the metric reads it; its file label in `frame.attrs["file"]`
        (the metric's own checks name it)."""
        if name in self.frames:
            source, label = self.frames[name], DATAFRAME_LABEL
        else:
            source = label = str(self.path(name))
        try:
            frame = metric.read(source, columns=self.columns) if self.columns else metric.read(source)
        except MissingColumn as exc:
            raise self._missing(name, metric, exc) from None
        frame.attrs["file"] = label
        return frame

    def _missing(self, name: str, metric: Metric, exc: MissingColumn) -> InputError:
        """A dataset that lacks a column the metric needs: when its name is another
        metric's, the audit named the wrong dataset (or metric), which no mapping fixes."""
        from common.metrics import METRICS
        other = name.strip().lower().replace("_", "-")
        if other in METRICS and other != metric.name:
            return InputError(f"dataset '{name}' is not one for {metric.name}: it lacks the column "
                              f"'{exc.missing}' {metric.name} needs, and its name says it is for {other}; check "
                              f"the dataset name (--client-dataset) against the metric (--metric)",
                              parameter="client dataset")
        return exc.in_context(self.how)


def served_mapping(column: str) -> str:
    """How a served dataset's column is mapped, said to whoever reads the audit's error:
    the Test-Client's own flag."""
    return f"`ppre client serve {mapping_flag(column)}` (the Test-Client's setting)"
