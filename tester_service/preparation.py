"""The Tester's per-audit demographic preparation (SPEC.md section 2, steps 1–4).

Everything happens in memory; nothing here writes a file (SPEC.md 2: "ephemeral:
computed per audit, never stored").

1. Drop opted-out members, members outside the US (``country`` not blank/US/USA) and
   members in excluded states (`drop_out_of_scope`).
2. BISG / BIFSG for the remaining members (`common.bisg`, SPEC.md 2.2).
3. Self-ID members: their reported race, one-hot and privatised by k-ary randomized
   response (`common.randomized_response`, SPEC.md 2.3), replaces their BISG row.
   Self-ID rows of dropped members are dropped too (an opt-out wins).
4. Probabilistic clipping of every row (`common.clipping`, SPEC.md 2.4) with ``T``
   fixed or, by default, from the 90% rule over the kept members' BISG rows.

Then an optional `common.races.GroupMapping` sums the six categories into groups.

Readers `load_members` / `load_self_id` read CSV or Parquet with every column as text
(member ids are always strings) and validate the input; errors name the file, column
and row (rows are numbered from 1, the first row after the header; CSV messages also
give the line) but never member ids, names or race values.
"""
from __future__ import annotations

import csv
import difflib
import io
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from common import bisg as bisg_mod
from common.bisg import arrow_to_numpy, fill_empty, string_scalar, strings_to_arrow
from common import clipping, randomized_response
from common.errors import InputError
from common.races import RACES, GroupMapping, race_label_to_index

if TYPE_CHECKING:  # pandas is imported where it is needed (startup time of ``ppre bisg``)
    import pandas as pd

log = logging.getLogger(__name__)

MEMBER_REQUIRED = ("member_id", "surname", "zip")
MEMBER_OPTIONAL = ("first_name", "tract", "state", "country", "opt_out")
SELF_ID_REQUIRED = ("member_id", "race")

_US_COUNTRIES = frozenset({"", "US", "USA", "U.S.", "U.S.A.", "UNITED STATES", "UNITED STATES OF AMERICA"})
_TRUE = frozenset({"1", "true", "t", "yes", "y"})
_FALSE = frozenset({"", "0", "false", "f", "no", "n"})


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreparationConfig:
    """Parameters of `prepare` (defaults: SPEC.md section 6)."""

    epsilon: float = randomized_response.DEFAULT_EPSILON
    threshold: float | None = None  # fixed T, or None for the 90% rule
    excluded_states: tuple[str, ...] = ()
    geo: str = "zcta"  # 'zcta' or 'tract'
    first_names: bool = False  # BIFSG when the members have a first_name column
    group_mapping: GroupMapping | None = None
    opt_out_column: str = "opt_out"
    seed: int | np.random.Generator | None = None

    def __post_init__(self) -> None:
        randomized_response.keep_probability(self.epsilon)  # validates epsilon
        if self.threshold is not None:
            clipping.check_threshold(self.threshold)
        if self.geo not in ("zcta", "tract"):
            raise InputError(f"must be 'zcta' or 'tract', got '{self.geo}'", parameter="geo")
        if isinstance(self.excluded_states, str):
            raise InputError("must be a list of state codes, not one string", parameter="excluded_states")
        if self.group_mapping is not None and not isinstance(self.group_mapping, GroupMapping):
            raise InputError("must be a GroupMapping", parameter="group mapping")

    def rng(self) -> np.random.Generator:
        """The generator for randomized response and clipping."""
        if isinstance(self.seed, np.random.Generator):
            return self.seed
        return np.random.default_rng(self.seed)


@dataclass(frozen=True)
class PreparationStats:
    """Counts only (no member-level data), for logs and audit records."""

    members_in: int
    dropped_opt_out: int
    dropped_non_us: int
    dropped_excluded_state: int
    self_id_used: int
    self_id_dropped: int
    threshold: float
    clipped_rows: int
    sources: dict[str, int] = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Reading and validating files
# --------------------------------------------------------------------------------------
def _text(values: pd.Series | pa.Array | pa.ChunkedArray) -> pa.Array:
    """A pandas or Arrow column as one Arrow string array ('' for missing)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        arr = values
    elif values.dtype == object:
        arr = pa.array(values.to_numpy(dtype=object), from_pandas=True)
    else:
        arr = pa.array(values, from_pandas=True)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    return fill_empty(arr)


def _suggest(name: str, present: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(present), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _read_csv_text(path: Path) -> pa.Table:
    label = str(path)
    raw = path.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        if line == 1:
            raise InputError("the header is not valid UTF-8 text", file=label) from None
        raise InputError(f"is not valid UTF-8 text (line {line})", file=label, row=line - 1) from None
    if not raw.strip():
        raise InputError("is empty (no header)", file=label)
    first_line = raw.split(b"\n", 1)[0].decode("utf-8").rstrip("\r")
    header = next(csv.reader([first_line]))
    names = [h.strip() for h in header]
    if len(set(names)) != len(names):
        names = [f"{h}\0{i}" for i, h in enumerate(names)]  # keep unique here; reported by _read_any
    try:
        return pacsv.read_csv(
            io.BytesIO(raw),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False),
        )
    except pa.ArrowInvalid:
        # Locate the first bad record with the csv module (slow path, errors only); the
        # Arrow message quotes the row's content, so it is not passed on.
        reader = csv.reader(io.StringIO(raw.decode("utf-8"), newline=""))
        next(reader, None)
        for record_no, record in enumerate(reader, start=1):
            if record and len(record) != len(names):
                raise InputError(f"has {len(record)} fields where the header has {len(names)} "
                                 f"(line {reader.line_num})", file=label, row=record_no) from None
        raise InputError("cannot be parsed as CSV", file=label) from None


def _read_parquet_text(path: Path) -> tuple[pa.Table, set[str]]:
    """Parquet -> all-text table; also the names of columns of a type that is not text/whole numbers."""
    label = str(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"cannot be read as Parquet ({type(exc).__name__})", file=label) from None
    cols: dict[str, pa.Array | pa.ChunkedArray] = {}
    bad_type: set[str] = set()
    for name, col in zip(table.column_names, table.columns):
        t = col.type
        if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
                or pa.types.is_boolean(t) or pa.types.is_null(t)):
            cols[name] = fill_empty(col.cast(pa.string()).combine_chunks())
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            out = []
            for i, v in enumerate(col.to_pylist()):
                try:
                    out.append("" if v is None else v.decode("utf-8"))
                except UnicodeDecodeError:
                    raise InputError("is not valid UTF-8 text", file=label, column=name, row=i + 1) from None
            cols[name] = strings_to_arrow(out)
        elif pa.types.is_floating(t):  # e.g. ZIPs written as floats: 2134.0 -> "2134"
            cols[name] = strings_to_arrow(["" if v is None or v != v else (str(int(v)) if float(v).is_integer()
                                                                           else repr(v)) for v in col.to_pylist()])
        else:
            bad_type.add(name.strip().lower())
            cols[name] = pa.nulls(table.num_rows, pa.string())
    return pa.Table.from_arrays(list(cols.values()), names=list(cols)), bad_type


def _read_any(path: str | Path, required: tuple[str, ...], optional: tuple[str, ...]) -> pd.DataFrame:
    return _read_any_table(path, required, optional).to_pandas()


def _read_any_table(path: str | Path, required: tuple[str, ...], optional: tuple[str, ...]) -> pa.Table:
    """`_read_any` as an Arrow table (every column text, no nulls)."""
    p = Path(path)
    label = str(path)
    if not p.exists():
        raise InputError("does not exist", file=label)
    if not p.is_file():
        raise InputError("is not a file", file=label)
    suffix = p.suffix.lower()
    bad_type: set[str] = set()
    if suffix in (".parquet", ".pq"):
        table, bad_type = _read_parquet_text(p)
    elif suffix in (".csv", ".txt", ""):
        table = _read_csv_text(p)
    else:
        raise InputError(f"has unknown type '{suffix}'; use .csv or .parquet", file=label)
    # Column names: case-insensitive, surrounding whitespace ignored.
    present = [c.split("\0", 1)[0].strip().lower() for c in table.column_names]
    dup = sorted({c for c in present if present.count(c) > 1})
    if dup:
        raise InputError(f"column '{dup[0]}' appears more than once in the header", file=label)
    table = table.rename_columns(present)
    for col in required:
        if col not in present:
            raise InputError(f"is missing column '{col}'{_suggest(col, present)}", file=label)
    known = set(required) | set(optional)
    for col in present:
        if col not in known:
            hint = _suggest(col, sorted(known - set(present)))
            if hint:  # probably a misspelt optional column (e.g. the opt-out flag): refuse
                raise InputError(f"has unknown column '{col}'{hint}", file=label)
    for col in bad_type & known:
        raise InputError("must hold text or whole numbers", file=label, column=col)
    keep = [c for c in present if c in known]
    table = table.select(keep)
    if table.num_rows == 0:
        raise InputError("has no data rows", file=label)
    return table


def _first_row(mask: np.ndarray) -> int:
    """common.tables.first_row without importing pandas (the `ppre bisg` path avoids it)."""
    return int(np.flatnonzero(mask)[0]) + 1


def _blank(arr: pa.Array) -> np.ndarray:
    """Empty or whitespace-only cells."""
    return (arrow_to_numpy(pc.equal(arr, string_scalar("")), null=False)
            | arrow_to_numpy(pc.utf8_is_space(arr), null=False))


def _all_distinct(values: pd.Series) -> bool:
    """True when no two cells are equal (Arrow hashing, which releases the GIL); False
    means "maybe not" and the caller checks with pandas."""
    try:
        arr = _text(values) if values.dtype != object else None
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return False
    if arr is None or len(arr) != len(values) or values.isna().any():
        return False
    return len(pc.unique(arr)) == len(arr)


def _check_ids(df: pd.DataFrame | pa.Table, label: str) -> None:
    empty = _blank(_text(df["member_id"]))
    if empty.any():
        raise InputError("is empty", file=label, column="member_id", row=_first_row(empty))
    ids = df["member_id"]
    if isinstance(ids, (pa.Array, pa.ChunkedArray)):
        _check_ids_arrow(ids, label)
        return
    if _all_distinct(ids):
        return
    if not ids.is_unique:
        dup = ids.duplicated(keep=False).to_numpy()
        rows = np.flatnonzero(dup)
        same = rows[ids.to_numpy(dtype=object)[rows] == ids.iat[rows[0]]]
        raise InputError(f"rows {same[0] + 1} and {same[1] + 1} have the same member id",
                         file=label, column="member_id")


def _check_ids_arrow(ids: pa.Array | pa.ChunkedArray, label: str) -> None:
    """`_check_ids` for an Arrow column without empty cells (same message as with pandas)."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    if len(ids) > 1:  # sorting is faster than hashing: equal ids are then neighbours
        ordered = ids.take(pc.array_sort_indices(ids))
        if not arrow_to_numpy(pc.equal(ordered.slice(1), ordered.slice(0, len(ids) - 1)), null=True).any():
            return
    enc = pc.dictionary_encode(ids)
    if len(enc.dictionary) == len(ids):
        return
    codes = arrow_to_numpy(enc.indices)
    dup = np.bincount(codes, minlength=len(enc.dictionary))[codes] > 1
    first = int(np.flatnonzero(dup)[0])
    same = np.flatnonzero(codes == codes[first])
    raise InputError(f"rows {same[0] + 1} and {same[1] + 1} have the same member id",
                     file=label, column="member_id")


def _columns(df: pd.DataFrame | pa.Table) -> list[str]:
    return df.column_names if isinstance(df, pa.Table) else list(df.columns)


def validate_members(df: pd.DataFrame | pa.Table, label: str = "members", opt_out_column: str = "opt_out") -> None:
    """Check a members table (columns as text; a DataFrame or an Arrow table); raise
    `InputError` naming the first bad row."""
    columns = _columns(df)
    for col in MEMBER_REQUIRED:
        if col not in columns:
            raise InputError(f"is missing column '{col}'{_suggest(col, columns)}", file=label)
    _check_ids(df, label)
    if isinstance(df, pa.Table):
        t = df.schema.field("surname").type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_null(t)):
            raise InputError("must hold text", file=label, column="surname")
    else:
        _check_surname_cells(df, label)
    surnames = _text(df["surname"])
    # A surname is usable when it has at least one letter (in any script).
    no_letter = ~arrow_to_numpy(pc.match_substring_regex(surnames, r"\pL"), null=False)
    if no_letter.any():
        row = _first_row(no_letter)
        what = "is empty" if _blank(surnames.slice(row - 1, 1))[0] else "has no letters"
        raise InputError(what, file=label, column="surname", row=row)
    if opt_out_column in columns:
        parse_opt_out(df[opt_out_column], label, opt_out_column)


def _check_surname_cells(df: pd.DataFrame, label: str) -> None:
    import pandas as pd
    if not (pd.api.types.is_string_dtype(df["surname"]) or df["surname"].dtype == object):
        raise InputError("must hold text", file=label, column="surname")
    non_str = df["surname"].map(lambda v: not isinstance(v, str) and not pd.isna(v)).to_numpy(dtype=bool) \
        if df["surname"].dtype == object else np.zeros(len(df), dtype=bool)
    if non_str.any():
        raise InputError("must be text", file=label, column="surname", row=_first_row(non_str))


def parse_opt_out(values: pd.Series | pa.Array | pa.ChunkedArray, label: str = "members",
                  column: str = "opt_out") -> np.ndarray:
    """Opt-out flags: 1/true/yes/y/t opt out; blank/0/false/no/n/f do not (case-insensitive)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_boolean(values.type) and values.null_count == 0:
            return arrow_to_numpy(values)
    elif values.dtype == bool:
        return values.to_numpy(dtype=bool)
    enc = pc.dictionary_encode(pc.utf8_lower(pc.utf8_trim_whitespace(_text(values))))
    uniq = enc.dictionary.to_pylist()
    flags = np.array([u in _TRUE for u in uniq], dtype=bool)
    unknown = np.array([u not in _TRUE and u not in _FALSE for u in uniq], dtype=bool)
    codes = arrow_to_numpy(enc.indices)
    if unknown.any():
        raise InputError("must be blank, 0/1, true/false or yes/no", file=label, column=column,
                         row=_first_row(unknown[codes]))
    return flags[codes]


def load_members(path: str | Path, opt_out_column: str = "opt_out") -> pd.DataFrame:
    """Read and validate a members file (CSV or Parquet); every column is text.

    Columns: ``member_id, surname, zip`` and optionally ``first_name, tract, state,
    country`` and the opt-out column. Raises `InputError` for a missing file, missing
    or misspelt columns, non-UTF-8 bytes, empty ids, duplicate ids, empty surnames or
    surnames without letters, and bad opt-out values.
    """
    df = read_members(path, opt_out_column)
    validate_members(df, str(path), opt_out_column)
    return df


def read_members(path: str | Path, opt_out_column: str = "opt_out") -> pd.DataFrame:
    """`load_members` without `validate_members` (the caller validates, e.g. in a thread)."""
    return read_members_table(path, opt_out_column).to_pandas()


def read_members_table(path: str | Path, opt_out_column: str = "opt_out") -> pa.Table:
    """`read_members` as an Arrow table of text columns (no pandas; `validate_members` takes it)."""
    optional = tuple(dict.fromkeys((*MEMBER_OPTIONAL, opt_out_column.strip().lower())))
    table = _read_any_table(path, MEMBER_REQUIRED, optional)
    lower = opt_out_column.strip().lower()
    if opt_out_column != lower and lower in table.column_names:
        table = table.rename_columns([opt_out_column if c == lower else c for c in table.column_names])
    return table


def self_id_categories(df: pd.DataFrame, label: str = "self-id") -> np.ndarray:
    """Race column -> category indices (RACES order); unknown labels name the row only."""
    enc = pc.dictionary_encode(_text(df["race"]))
    idx = np.array([(-1 if (i := race_label_to_index(u)) is None else i) for u in enc.dictionary.to_pylist()],
                   dtype=np.int64)
    codes = enc.indices.to_numpy(zero_copy_only=False)
    cats = idx[codes]
    if (cats < 0).any():
        raise InputError(f"unknown race label; expected one of {', '.join(RACES)}",
                         file=label, column="race", row=_first_row(cats < 0))
    return cats


def validate_self_id(df: pd.DataFrame, label: str = "self-id",
                     member_ids: Iterable[str] | pd.Series | None = None) -> np.ndarray:
    """Check a Self-ID table; returns its category indices."""
    for col in SELF_ID_REQUIRED:
        if col not in df.columns:
            raise InputError(f"is missing column '{col}'{_suggest(col, df.columns)}", file=label)
    _check_ids(df, label)
    cats = self_id_categories(df, label)
    if member_ids is not None:
        member_positions(df["member_id"], member_ids, label)
    return cats


def member_positions(self_ids: pd.Series, member_ids: Iterable[str] | pd.Series,
                     label: str = "self-id") -> np.ndarray:
    """Row of each Self-ID id among ``member_ids``; an id not among them is an `InputError`."""
    import pandas as pd
    members = member_ids if isinstance(member_ids, pd.Series) else pd.Series(list(member_ids), dtype=object)
    pos = pc.index_in(_text(self_ids), value_set=_text(members)).fill_null(-1)
    pos = pos.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if (pos < 0).any():
        raise InputError("member id is not among the members", file=label, column="member_id",
                         row=_first_row(pos < 0))
    return pos


def load_self_id(path: str | Path, member_ids: Iterable[str] | pd.Series | None = None) -> pd.DataFrame:
    """Read and validate a Self-ID file (``member_id, race``; CSV or Parquet).

    With ``member_ids`` (e.g. ``members["member_id"]``) every Self-ID id must be among them.
    """
    df = read_self_id(path)
    validate_self_id(df, str(path), member_ids)
    return df


def read_self_id(path: str | Path) -> pd.DataFrame:
    """`load_self_id` without `validate_self_id` (`prepare` validates)."""
    return _read_any(path, SELF_ID_REQUIRED, ())


# --------------------------------------------------------------------------------------
# Preparation
# --------------------------------------------------------------------------------------
def drop_out_of_scope(members: pd.DataFrame, config: PreparationConfig,
                      label: str = "members") -> tuple[np.ndarray, dict[str, int]]:
    """Step 1: boolean mask of members kept, and counts of each reason for dropping."""
    n = len(members)
    keep = np.ones(n, dtype=bool)
    counts = {"opt_out": 0, "non_us": 0, "excluded_state": 0}
    if config.opt_out_column in members.columns:
        opted = parse_opt_out(members[config.opt_out_column], label, config.opt_out_column)
        counts["opt_out"] = int(opted.sum())
        keep &= ~opted
    if "country" in members.columns:
        upper = pc.utf8_upper(pc.utf8_trim_whitespace(_text(members["country"])))
        us = pc.is_in(upper, value_set=pa.array(sorted(_US_COUNTRIES))).to_numpy(zero_copy_only=False)
        counts["non_us"] = int((keep & ~us).sum())
        keep &= us
    if config.excluded_states:
        if "state" not in members.columns:
            raise InputError("excluded states are configured but the members have no 'state' column",
                             parameter="excluded_states")
        excluded = sorted({str(s).strip().upper() for s in config.excluded_states})
        upper = pc.utf8_upper(pc.utf8_trim_whitespace(_text(members["state"])))
        out = pc.is_in(upper, value_set=pa.array(excluded)).to_numpy(zero_copy_only=False)
        counts["excluded_state"] = int((keep & out).sum())
        keep &= ~out
    return keep, counts


def prepare(members: pd.DataFrame, self_id: pd.DataFrame | None = None,
            config: PreparationConfig | None = None, *,
            labels: tuple[str, str] = ("members", "self-id")) -> pd.DataFrame:
    """SPEC.md section 2, steps 1–4: returns ``member_id`` (str) + six race columns
    (or the group mapping's columns), one row per kept member, input order.

    Both tables are validated here (errors name ``labels``: the members' and the
    Self-ID's file). ``df.attrs["preparation"]`` holds a `PreparationStats` (counts only).
    """
    import pandas as pd
    cfg = config or PreparationConfig()
    rng = cfg.rng()
    members_label, self_id_label = labels
    validate_members(members, members_label, cfg.opt_out_column)
    cats_all = pos_all = None
    if self_id is not None:
        cats_all = validate_self_id(self_id, self_id_label)
        pos_all = member_positions(self_id["member_id"], members["member_id"], self_id_label)

    keep, counts = drop_out_of_scope(members, cfg)
    kept = members.loc[keep]
    if len(kept) == 0:
        raise InputError("no members are left after dropping opted-out, non-US and excluded-state rows",
                         file="members")
    ids = kept["member_id"].astype(str).to_numpy(dtype=object)

    # Step 2: BISG / BIFSG.
    if cfg.geo == "tract" and "tract" not in kept.columns:
        raise InputError("geo 'tract' needs a 'tract' column in the members", parameter="geo")
    if cfg.first_names and "first_name" not in kept.columns:
        raise InputError("first names are requested but the members have no 'first_name' column",
                         parameter="first_names")
    res = bisg_mod.bisg(kept["surname"], zips=kept["zip"],
                        tracts=kept["tract"] if cfg.geo == "tract" else None,
                        first_names=kept["first_name"] if cfg.first_names else None, geo=cfg.geo)
    probs = res.probabilities
    threshold = cfg.threshold if cfg.threshold is not None else clipping.threshold_from_rule(probs)

    # Step 3: Self-ID rows, privatised, replace BISG rows.
    used = dropped_sid = 0
    if self_id is not None and cats_all is not None and pos_all is not None and len(self_id):
        kept_row = np.cumsum(keep) - 1  # member row -> row among the kept members
        present = keep[pos_all]
        pos = np.where(present, kept_row[pos_all], -1)
        dropped_sid = int((~present).sum())
        if present.any():
            probs = probs.copy()
            probs[pos[present]] = randomized_response.privatize_one_hot(cats_all[present], rng, cfg.epsilon)
            used = int(present.sum())

    # Step 4: clipping.
    before = probs.max(axis=1) > threshold
    clipped = clipping.clip(probs, threshold, rng)

    values = cfg.group_mapping.apply(clipped) if cfg.group_mapping is not None else clipped
    columns = list(cfg.group_mapping.names) if cfg.group_mapping is not None else list(RACES)
    out = pd.DataFrame(values, columns=columns)
    out.insert(0, "member_id", pd.array(ids, dtype=object))
    src = np.bincount(res.source_codes, minlength=len(bisg_mod.SOURCES))
    out.attrs["preparation"] = PreparationStats(
        members_in=len(members), dropped_opt_out=counts["opt_out"], dropped_non_us=counts["non_us"],
        dropped_excluded_state=counts["excluded_state"], self_id_used=used, self_id_dropped=dropped_sid,
        threshold=float(threshold), clipped_rows=int(before.sum()),
        sources={s: int(c) for s, c in zip(bisg_mod.SOURCES, src)})
    log.info("prepared %d of %d members (T=%.4f, %d Self-ID rows, %d clipped)",
             len(out), len(members), threshold, used, int(before.sum()))
    return out
