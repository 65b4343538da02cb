"""The Tester's per-audit demographic preparation (design §2.1-§2.4).

Everything happens in memory; nothing here writes a file (design §2: computed per audit,
never stored).

1. Drop opted-out members, members outside the US (``country`` not blank/US/USA) and
   members in excluded states (`drop_out_of_scope`).
2. BISG / BIFSG for the remaining members (`tester_service.demographics.bisg`, design §2.2).
3. Self-ID members: their reported race, one-hot and privatised by k-ary randomized
   response (`tester_service.demographics.randomized_response`, design §2.3), replaces their BISG row. Each
   member's draw is fixed for the Tester's epoch (`process_epoch`): every audit of one
   Tester process releases the same privatised answer, so audits cannot average it away.
   Self-ID rows of dropped members are dropped too (an opt-out wins), and so are rows
   of people who are not in the members file at all (a survey often covers people the
   members export left out): counted (``self_id_not_among_members``), not an error —
   unless no row at all matches a member (the wrong file or id column, surely).
4. Probabilistic clipping of every row (`tester_service.demographics.clipping`, design §2.4) with ``T``
   fixed or, by default, from the 90% rule over the kept members' BISG rows.

Then an optional `common.races.GroupMapping` sums the six categories into groups.

`read_members` / `read_self_id` read the files through `common.tables` (CSV or Parquet,
every column text, its size, encoding and consistency rules and the one member-id
rule); `prepare` validates both tables, once. Errors name the file, column and row
(as "data row N", numbered from 1, the first record after the header: line N + 1 of a
CSV file) but never member ids, names or race values.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from common.errors import InputError
from common.races import RACES, GroupMapping, race_label_to_index
from common.tables import (HOW_TO_MAP, MissingColumn, arrow_to_numpy, check_member_ids, clean_member_ids,
                           column_mapping_of, did_you_mean, file_columns, fill_empty, first_row, misspelling_hint,
                           read_text_table, string_scalar, table_column)
from tester_service.demographics import bisg as bisg_mod
from tester_service.demographics import clipping, randomized_response

if TYPE_CHECKING:  # pandas is imported where it is needed (startup time of ``ppre bisg``)
    import pandas as pd

log = logging.getLogger(__name__)

MEMBER_REQUIRED = ("member_id", "surname", "zip")
MEMBER_OPTIONAL = ("first_name", "tract", "state", "country", "opt_out")
#: optional member columns only a setting uses (--first-names, --geo tract, --excluded-states):
#: read when present, but a column of another name close to one (e.g. "First Name") is not
#: refused as its misspelling — the setting that needs one says so (`_needed_column`)
SETTING_COLUMNS = ("first_name", "tract", "state")
SELF_ID_REQUIRED = ("member_id", "race")

_US_COUNTRIES = frozenset({"", "US", "USA", "U.S.", "U.S.A.", "UNITED STATES", "UNITED STATES OF AMERICA"})
_TRUE = frozenset({"1", "true", "t", "yes", "y"})
_FALSE = frozenset({"", "0", "false", "f", "no", "n"})


# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PreparationConfig:
    """Parameters of `prepare` (defaults: design §6)."""

    epsilon: float = randomized_response.DEFAULT_EPSILON
    threshold: float | None = None  # fixed T, or None for the 90% rule
    excluded_states: tuple[str, ...] = ()
    geo: str = "zcta"  # 'zcta', 'tract' or 'none' (no geography: `tester_service.demographics.bisg.GEOS`)
    first_names: bool = False  # BIFSG when the members have a first_name column
    group_mapping: GroupMapping | None = None
    opt_out_column: str = "opt_out"
    #: seeds clipping; an int seeds randomized response too (`response_epoch`)
    seed: int | np.random.Generator | None = None
    #: the randomized-response epoch; None: `response_epoch` decides
    epoch: randomized_response.ResponseEpoch | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        randomized_response.keep_probability(self.epsilon)  # validates epsilon
        if self.threshold is not None:
            clipping.check_threshold(self.threshold)
        if self.geo not in bisg_mod.GEOS:
            raise InputError(f"must be one of {', '.join(bisg_mod.GEOS)}, got '{self.geo}'", parameter="geo")
        if isinstance(self.excluded_states, str):
            raise InputError("must be a list of state codes, not one string", parameter="excluded_states")
        if self.group_mapping is not None and not isinstance(self.group_mapping, GroupMapping):
            raise InputError("must be a GroupMapping", parameter="group mapping")

    def rng(self) -> np.random.Generator:
        """The generator for clipping."""
        if isinstance(self.seed, np.random.Generator):
            return self.seed
        return np.random.default_rng(self.seed)

    def response_epoch(self) -> randomized_response.ResponseEpoch:
        """Where each member's randomized response comes from (design §2.3): ``epoch`` if
        given; for an int ``seed`` a reproducible, not secret, epoch (tests, benchmarks);
        else this process's epoch (`process_epoch`)."""
        if self.epoch is not None:
            return self.epoch
        if self.seed is not None and not isinstance(self.seed, np.random.Generator):
            return randomized_response.ResponseEpoch.from_seed(self.seed)
        return process_epoch()


# --------------------------------------------------------------------------------------
# The Tester's randomized-response epoch (design §2.3)
# --------------------------------------------------------------------------------------
_epoch_lock = threading.Lock()
_epoch: randomized_response.ResponseEpoch | None = None


def process_epoch() -> randomized_response.ResponseEpoch:
    """This process's randomized-response epoch, made at its first use and kept in memory
    only (design §2.3): a long-lived ``ppre tester serve`` draws each member's response
    once for its whole life; a new process is a new epoch."""
    global _epoch
    with _epoch_lock:
        if _epoch is None:
            _epoch = randomized_response.ResponseEpoch.new()
            log.info("randomized-response epoch %s started (one draw per Self-ID member until it is rotated)",
                     _epoch.fingerprint)
        return _epoch


def rotate_epoch() -> randomized_response.ResponseEpoch:
    """End this process's epoch and start a new one (design §2.3): every Self-ID member
    gets a fresh, independent draw from the next audit on, which spends their ε once more.
    Rotate deliberately (a new survey, a new key period), never per audit. The old secret
    goes with its last reference (an audit still preparing finishes with it)."""
    global _epoch
    with _epoch_lock:
        _epoch = None
    return process_epoch()


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
    #: the randomized-response ε the Self-ID answers were privatised with
    epsilon: float | None = None
    #: Self-ID rows whose id is not in the members file (dropped)
    self_id_not_among_members: int = 0

    def counts(self) -> dict[str, float]:
        """Flat counts for the audit result (`--json` "preparation"; never member data)."""
        out = {"members_read": self.members_in, "dropped_opt_out": self.dropped_opt_out,
               "dropped_non_us": self.dropped_non_us, "dropped_excluded_state": self.dropped_excluded_state,
               "self_id_used": self.self_id_used, "self_id_not_among_kept": self.self_id_dropped,
               "self_id_not_among_members": self.self_id_not_among_members,
               "clipped_rows": self.clipped_rows, "threshold": self.threshold}
        if self.epsilon is not None:
            out["epsilon"] = self.epsilon
        out.update({f"bisg_{source.replace('+', '_')}": count for source, count in self.sources.items()})
        return {k: float(v) for k, v in out.items()}


# --------------------------------------------------------------------------------------
# Reading and validating the members and Self-ID tables
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


def _ids(values: pd.Series | pa.Array | pa.ChunkedArray, label: str) -> pa.Array:
    """Member ids under the one id rule (`common.tables.clean_member_ids`)."""
    if not isinstance(values, (pa.Array, pa.ChunkedArray)):
        try:
            values = pa.array(values.to_numpy(dtype=object) if values.dtype == object else values,
                              from_pandas=True)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # e.g. numbers mixed with text
            raise InputError("member ids must be text", file=label, column="member_id") from None
    return clean_member_ids(values, label)


def _blank(arr: pa.Array) -> np.ndarray:
    """Empty or whitespace-only cells."""
    return (arrow_to_numpy(pc.equal(arr, string_scalar("")), null=False)
            | arrow_to_numpy(pc.utf8_is_space(arr), null=False))


def _columns(df: pd.DataFrame | pa.Table) -> list[str]:
    return df.column_names if isinstance(df, pa.Table) else list(df.columns)


def _require(df: pd.DataFrame | pa.Table, required: tuple[str, ...], label: str) -> None:
    columns = _columns(df)
    for col in required:
        if col not in columns:
            hint = misspelling_hint(col, [c for c in columns if c not in required])
            raise InputError(f"required column is missing{hint}", file=label, column=col)


def validate_members(df: pd.DataFrame | pa.Table, label: str = "members", opt_out_column: str = "opt_out",
                     ids: pa.Array | None = None) -> None:
    """Check a members table (columns as text; a DataFrame or an Arrow table); raise
    `InputError` naming the first bad row. ``ids``: the table's ids already cleaned."""
    _require(df, MEMBER_REQUIRED, label)
    check_member_ids(ids if ids is not None else _ids(df["member_id"], label), label,
                     table_column(df, "member_id"))  # the file's name for it (column mapping)
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
        row = first_row(no_letter)
        what = "is empty" if _blank(surnames.slice(row - 1, 1))[0] else "has no letters"
        raise InputError(what, file=label, column=table_column(df, "surname"), row=row)
    if opt_out_column in _columns(df):
        parse_opt_out(df[opt_out_column], label, opt_out_column)


def _check_surname_cells(df: pd.DataFrame, label: str) -> None:
    import pandas as pd
    if not (pd.api.types.is_string_dtype(df["surname"]) or df["surname"].dtype == object):
        raise InputError("must hold text", file=label, column="surname")
    non_str = df["surname"].map(lambda v: not isinstance(v, str) and not pd.isna(v)).to_numpy(dtype=bool) \
        if df["surname"].dtype == object else np.zeros(len(df), dtype=bool)
    if non_str.any():
        raise InputError("must be text", file=label, column="surname", row=first_row(non_str))


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
                         row=first_row(unknown[codes]))
    return flags[codes]


def read_members(path: str | Path, opt_out_column: str = "opt_out",
                 columns: Mapping[str, str] | None = None) -> pd.DataFrame:
    """A members file (CSV or Parquet; `common.tables` rules) as text columns, not yet
    validated (`prepare` validates, naming the file). ``columns``: the column mapping
    (our name -> the file's, `common.tables.parse_column_mapping`)."""
    table = read_members_table(path, opt_out_column, columns)
    frame = table.to_pandas()
    frame.attrs["file_columns"] = file_columns(table)
    frame.attrs["column_mapping"] = column_mapping_of(table)  # errors name the file's columns
    return frame


def read_members_table(path: str | Path, opt_out_column: str = "opt_out",
                       columns: Mapping[str, str] | None = None) -> pa.Table:
    """`read_members` as an Arrow table of text columns (no pandas; `validate_members` takes it).

    Columns: ``member_id, surname, zip`` and optionally ``first_name, tract, state,
    country`` and the opt-out column."""
    lower = opt_out_column.strip().lower()
    optional = tuple(dict.fromkeys((*MEMBER_OPTIONAL, lower)))
    table = read_text_table(path, MEMBER_REQUIRED, [c for c in optional if c not in SETTING_COLUMNS], columns,
                            lenient=SETTING_COLUMNS)
    if opt_out_column != lower and lower in table.column_names:
        table = table.rename_columns([opt_out_column if c == lower else c for c in table.column_names])
    return table


def read_self_id(path: str | Path, columns: Mapping[str, str] | None = None) -> pd.DataFrame:
    """A Self-ID file (``member_id, race``; CSV or Parquet) as text, not yet validated
    (`prepare` validates). ``columns``: the column mapping, as `read_members`."""
    frame = read_text_table(path, SELF_ID_REQUIRED, columns=columns).to_pandas()
    frame.attrs["column_mapping"] = dict(columns or {})  # errors name the file's columns
    return frame


def self_id_categories(df: pd.DataFrame, label: str = "self-id") -> np.ndarray:
    """Race column -> category indices (RACES order); unknown labels name the row only."""
    enc = pc.dictionary_encode(_text(df["race"]))
    idx = np.array([(-1 if (i := race_label_to_index(u)) is None else i) for u in enc.dictionary.to_pylist()],
                   dtype=np.int64)
    codes = enc.indices.to_numpy(zero_copy_only=False)
    cats = idx[codes]
    if (cats < 0).any():
        raise InputError(f"unknown race label; expected one of {', '.join(RACES)}",
                         file=label, column=table_column(df, "race"), row=first_row(cats < 0))
    return cats


def member_positions(self_ids: pa.Array, member_ids: pa.Array, label: str = "self-id",
                     members_label: str = "members") -> np.ndarray:
    """Row of each Self-ID id among ``member_ids`` (both cleaned), -1 for an id not among
    them (dropped and counted by `prepare`). No id at all among them is an `InputError`:
    the wrong file, or ids in another column or form."""
    pos = pc.index_in(self_ids, value_set=member_ids).fill_null(-1)
    pos = pos.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    if len(pos) and (pos < 0).all():
        raise InputError(f"no member id is among the members of {members_label}: is it the survey of these "
                         "members, with their ids in the same form?",
                         file=label, column="member_id")
    return pos


# --------------------------------------------------------------------------------------
# Preparation
# --------------------------------------------------------------------------------------
def needed_column(column: str, setting: str, file_columns, label: str, parameter: str) -> MissingColumn:
    """The error for a members column a setting needs that the file lacks: the closest
    column found, and how to map it."""
    hint = did_you_mean(column, file_columns)
    return MissingColumn(f"{setting} needs a '{column}' column, which the members file does not have{hint}; "
                         f"map the file's column with the column mapping ({HOW_TO_MAP})", column,
                         file=label, parameter=parameter)


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


def privatise_self_id(categories: np.ndarray, member_ids: list[str], config: PreparationConfig) -> np.ndarray:
    """Step 3: the members' answers as one-hot rows after randomized response, each
    member's draw fixed by the configuration's epoch (design §2.3)."""
    return randomized_response.privatize_per_member_one_hot(categories, member_ids, config.response_epoch(),
                                                            config.epsilon)


def prepare(members: pd.DataFrame, self_id: pd.DataFrame | None = None,
            config: PreparationConfig | None = None, *,
            labels: tuple[str, str] = ("members", "self-id")) -> pd.DataFrame:
    """Design §2.1-§2.4: returns ``member_id`` (str) + six race columns
    (or the group mapping's columns), one row per kept member, input order.

    Both tables are validated here (errors name ``labels``: the members' and the
    Self-ID's file). ``df.attrs["preparation"]`` holds a `PreparationStats` (counts only).
    """
    import pandas as pd
    cfg = config or PreparationConfig()
    rng = cfg.rng()
    members_label, self_id_label = labels
    _require(members, MEMBER_REQUIRED, members_label)
    member_ids = _ids(members["member_id"], members_label)  # the one id rule, whoever read the table
    validate_members(members, members_label, cfg.opt_out_column, ids=member_ids)
    cats_all = pos_all = self_id_ids = None
    if self_id is not None:
        _require(self_id, SELF_ID_REQUIRED, self_id_label)
        self_id_ids = _ids(self_id["member_id"], self_id_label)
        check_member_ids(self_id_ids, self_id_label, table_column(self_id, "member_id"))
        cats_all = self_id_categories(self_id, self_id_label)
        pos_all = member_positions(self_id_ids, member_ids, self_id_label, members_label)

    keep, counts = drop_out_of_scope(members, cfg, members_label)
    kept = members.loc[keep]
    if len(kept) == 0:
        raise InputError("no members are left after dropping opted-out, non-US and excluded-state rows",
                         file=members_label)
    ids = member_ids.filter(pa.array(keep)).to_numpy(zero_copy_only=False)

    # Step 2: BISG / BIFSG.
    if cfg.geo == "tract" and "tract" not in kept.columns:
        raise needed_column("tract", "geo 'tract'", members.attrs.get("file_columns", ()), members_label, "geo")
    if cfg.first_names and "first_name" not in kept.columns:
        raise needed_column("first_name", "first names (BIFSG)", members.attrs.get("file_columns", ()),
                            members_label, "first_names")
    res = bisg_mod.bisg(kept["surname"], zips=kept["zip"],
                        tracts=kept["tract"] if cfg.geo == "tract" else None,
                        first_names=kept["first_name"] if cfg.first_names else None, geo=cfg.geo)
    probs = res.probabilities
    threshold = cfg.threshold if cfg.threshold is not None else clipping.threshold_from_rule(probs)

    # Step 3: Self-ID rows, privatised, replace BISG rows.
    used = dropped_sid = not_members = 0
    if self_id is not None and cats_all is not None and pos_all is not None and len(self_id):
        kept_row = np.cumsum(keep) - 1  # member row -> row among the kept members
        among = pos_all >= 0
        not_members = int((~among).sum())
        present = among & keep[np.where(among, pos_all, 0)]
        pos = np.where(present, kept_row[np.where(among, pos_all, 0)], -1)
        dropped_sid = int((among & ~present).sum())
        if present.any():
            probs = probs.copy()
            probs[pos[present]] = privatise_self_id(cats_all[present],
                                                    self_id_ids.filter(pa.array(present)).to_pylist(), cfg)
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
        sources={s: int(c) for s, c in zip(bisg_mod.SOURCES, src)}, epsilon=float(cfg.epsilon),
        self_id_not_among_members=not_members)
    if cfg.group_mapping is not None:
        out.attrs["group_mapping"] = str(cfg.group_mapping)
    log.info("prepared %d of %d members (T=%.4f, %d Self-ID rows, %d of people not among the members, "
             "%d clipped)", len(out), len(members), threshold, used, not_members, int(before.sum()))
    return out
