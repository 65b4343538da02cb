"""Bad input files at every reader (docs/inputs.md; `common.tables` rules).

Every Tester input (members and Self-ID files, design §2; the prepared
probability table) and the Test-Client's dataset, as CSV and as Parquet: malformed
files, wrong encodings, NaN and infinite values, duplicate and empty ids, missing
columns, 0-byte files, files changed while they are read and files over the size
limit. Each must give an `InputError` that names the file (and the column and row
where there is one), never contains a member id or a value from the file, and writes
nothing. Then the one member-id rule, and two of these errors end to end.
"""
from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from client_service.datasets import DatasetRegistry
from common import tables
from common.errors import InputError
from common.metrics.ero import METRIC as ERO
from common.races import RACES
from tester_service.inputs import read_probability_table
from tester_service.demographics.preparation import PreparationConfig, prepare, read_members, read_self_id

IDS = ["zq11a", "zq12b", "zq13c", "zq14d", "zq15e", "zq16f"]
SURNAMES = ["Smithers", "Garcia", "Nguyen", "Washington", "Lopez", "Kimball"]


def members_frame() -> pd.DataFrame:
    return pd.DataFrame({"member_id": IDS, "surname": SURNAMES,
                         "zip": ["60614", "00601", "02134", "20001", "90012", "10027"]})


def self_id_frame() -> pd.DataFrame:
    return pd.DataFrame({"member_id": IDS[:4], "race": ["hispanic", "black", "white", "api"]})


def probabilities_frame() -> pd.DataFrame:
    df = pd.DataFrame([[0.615, 0.125, 0.105, 0.05, 0.05, 0.055]] * len(IDS), columns=list(RACES))
    df.insert(0, "member_id", IDS)
    return df


def client_frame() -> pd.DataFrame:
    return pd.DataFrame({"member_id": IDS, "y_true": [0, 1, 0, 1, 1, 0], "y_pred": [1, 1, 0, 0, 1, 0]})


@dataclass(frozen=True)
class Kind:
    """One input: a good table, its first non-id required column, and how it is read."""

    name: str
    frame: Callable[[], pd.DataFrame]
    column: str  # a required column besides member_id
    read: Callable[[Path, Path], object]  # (bad file, directory of good files) -> result


def _good_members(directory: Path) -> Path:
    path = directory / "good_members.csv"
    if not path.exists():
        members_frame().to_csv(path, index=False)
    return path


def _read_members(path: Path, directory: Path):
    return prepare(read_members(path), None, PreparationConfig(seed=0), labels=(str(path), "self-id"))


def _read_self_id(path: Path, directory: Path):
    good = _good_members(directory)
    return prepare(read_members(good), read_self_id(path), PreparationConfig(seed=0), labels=(str(good), str(path)))


def _read_client(path: Path, directory: Path):
    frame = DatasetRegistry(named={"d": path}).load("d", ERO)
    ERO.client_rows(frame, str(path), "fpr", {}, np.random.default_rng(0))  # the metric's own checks
    return frame


KINDS = {
    "members": Kind("members", members_frame, "surname", _read_members),
    "self_id": Kind("self_id", self_id_frame, "race", _read_self_id),
    "probabilities": Kind("probabilities", probabilities_frame, "black",
                          lambda path, directory: read_probability_table(path)),
    "client": Kind("client", client_frame, "y_true", _read_client),
}
FORMATS = ("csv", "parquet")


def to_bytes(frame: pd.DataFrame, fmt: str, na_rep: str = "") -> bytes:
    if fmt == "csv":
        return frame.to_csv(index=False, na_rep=na_rep).encode("utf-8")
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), buf)
    return buf.getvalue()


def secrets(kind: Kind) -> set[str]:
    """Cells that must never appear in a message: ids and every value of 4+ characters."""
    cells = {str(v) for v in kind.frame().to_numpy().ravel()} | set(IDS) | set(SURNAMES)
    return {c for c in cells if len(c) >= 4 and c not in RACES}


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.iterdir()}


def expect_error(kind: Kind, path: Path, directory: Path, *, column=None, row=None, text: str) -> InputError:
    """Read ``path`` as ``kind``: an InputError naming the place; nothing written; no data."""
    _good_members(directory)
    before = snapshot(directory)
    with pytest.raises(InputError) as info:
        kind.read(path, directory)
    e = info.value
    msg = str(e)
    assert e.file == str(path) and str(path) in msg, msg
    assert (e.column, e.row) == (column, row), msg
    assert text in msg, msg
    leaked = [s for s in secrets(kind) if s in msg.replace(str(directory), "")]
    assert not leaked, (leaked, msg)
    assert snapshot(directory) == before  # nothing written, the bad file untouched
    return e


# --------------------------------------------------------------------------------------
# Table-level cases: every input, CSV and Parquet
# --------------------------------------------------------------------------------------
def _misspelt(name: str) -> str:
    return name[:2] + name[3:]


def _drop(col_of):
    return lambda k, f: f.drop(columns=[col_of(k)])


def _set(row: int, col_of, value):
    def change(k, f):
        f = f.copy()
        col = col_of(k)
        f[col] = f[col].astype(object)
        f.loc[row - 1, col] = value(f, row) if callable(value) else value
        return f
    return change


def _column(k: Kind) -> str:
    return k.column


def _id(k: Kind) -> str:
    return "member_id"


def _last_row(k: Kind) -> int:
    return len(k.frame())


#: (case, change the good frame, expected (column, row) for the kind, text)
TABLE_CASES = [
    ("missing column", _drop(_column), lambda k: (k.column, None), "required column is missing"),
    ("missing id column", _drop(_id), lambda k: ("member_id", None), "required column is missing"),
    ("misspelt column", lambda k, f: f.rename(columns={k.column: _misspelt(k.column)}),
     lambda k: (k.column, None), "misspelt?"),
    ("header twice", lambda k, f: f.rename(columns={k.column: k.column.upper()}).assign(**{k.column: f[k.column]}),
     lambda k: (k.column, None), "appears more than once in the header"),
    ("no rows", lambda k, f: f.iloc[:0], lambda k: (None, None), "has no data rows"),
    ("duplicate id", _set(3, _id, lambda f, r: f.loc[0, "member_id"]), lambda k: ("member_id", 3),
     "duplicate member id (the same as data row 1)"),
    ("duplicate id after whitespace rule", _set(3, _id, lambda f, r: "  " + f.loc[1, "member_id"] + "\t"),
     lambda k: ("member_id", 3), "duplicate member id (the same as data row 2)"),
    ("empty id", _set(2, _id, "   "), lambda k: ("member_id", 2), "empty member id"),
    ("missing id", _set(2, _id, None), lambda k: ("member_id", 2), "empty member id"),
]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind_name", list(KINDS))
@pytest.mark.parametrize("case, change, where, text", TABLE_CASES, ids=[c[0] for c in TABLE_CASES])
def test_bad_tables(tmp_path, kind_name, fmt, case, change, where, text):
    kind = KINDS[kind_name]
    path = tmp_path / f"bad.{fmt}"
    path.write_bytes(to_bytes(change(kind, kind.frame()), fmt))
    column, row = where(kind)
    expect_error(kind, path, tmp_path, column=column, row=row, text=text)


# NaN and infinite values: what each input makes of them.
NAN_INF_CASES = [
    # kind, format, column, value, expected row, text  (row 2 is changed)
    ("probabilities", "csv", "black", float("nan"), 2, "not a number"),
    ("probabilities", "parquet", "black", float("nan"), 2, "not a number"),
    ("probabilities", "csv", "black", float("inf"), 2, "probability is negative or not finite"),
    ("probabilities", "parquet", "api", float("-inf"), 2, "probability is negative or not finite"),
    ("probabilities", "parquet", "api", None, 2, "not a number"),
    ("probabilities", "csv", "white", "0,615", 2, "not a number"),
    ("client", "csv", "y_pred", float("nan"), 2, "not a number"),
    ("client", "parquet", "y_true", float("nan"), 2, "not a number"),
    ("client", "csv", "y_true", float("inf"), 2, "label must be 0 or 1"),
    ("client", "parquet", "y_pred", float("inf"), 2, "label must be 0 or 1"),
    ("client", "csv", "y_pred", "yes", 2, "not a number"),
    ("members", "parquet", "zip", float("inf"), 2, "must be text or a whole number"),
    ("members", "parquet", "zip", 2134.5, 2, "must be text or a whole number"),
    ("members", "csv", "surname", "", 2, "is empty"),
    ("self_id", "csv", "race", float("nan"), 2, "unknown race label"),
    ("self_id", "parquet", "race", None, 2, "unknown race label"),
]


@pytest.mark.parametrize("kind_name, fmt, column, value, row, text", NAN_INF_CASES,
                         ids=[f"{c[0]}-{c[1]}-{c[2]}-{c[3]!r}" for c in NAN_INF_CASES])
def test_nan_and_infinite_values(tmp_path, kind_name, fmt, column, value, row, text):
    kind = KINDS[kind_name]
    frame = kind.frame()
    if isinstance(value, float) and kind_name in ("members",):
        frame[column] = frame[column].astype(float)  # a float ZIP column, as a Parquet writer makes it
    elif isinstance(value, str) or value is None or kind_name == "self_id":
        frame[column] = frame[column].astype(object)
    else:
        frame[column] = frame[column].astype(float)
    frame.loc[row - 1, column] = value
    path = tmp_path / f"bad.{fmt}"
    path.write_bytes(to_bytes(frame, fmt, na_rep="NaN"))
    expect_error(kind, path, tmp_path, column=column, row=row, text=text)


def test_nan_text_is_a_name_and_a_missing_float_zip_is_blank(tmp_path):
    # "NaN" is a real surname, not a missing value; a missing ZIP in a float column is a
    # member without a ZIP (design §2.2 fallback), not an error.
    frame = members_frame().assign(surname=["NaN", "Null", "NA", "None", "Lopez", "Kim"])
    frame["zip"] = [60614.0, 601.0, np.nan, 20001.0, 90012.0, np.nan]
    path = tmp_path / "m.parquet"
    path.write_bytes(to_bytes(frame, "parquet"))
    table = read_members(path)
    assert list(table["surname"]) == ["NaN", "Null", "NA", "None", "Lopez", "Kim"]
    assert list(table["zip"]) == ["60614", "601", "", "20001", "90012", ""]


# --------------------------------------------------------------------------------------
# Byte-level cases: malformed CSV, wrong encodings, malformed Parquet
# --------------------------------------------------------------------------------------
def _csv_lines(kind: Kind) -> list[bytes]:
    return to_bytes(kind.frame(), "csv").split(b"\n")


def _replace_line(lines: list[bytes], line: int, new: bytes) -> bytes:
    lines = list(lines)
    lines[line - 1] = new
    return b"\n".join(lines)


def _field_count(kind: Kind) -> int:
    return len(kind.frame().columns)


CSV_CASES = [
    # case, bytes from the kind's good CSV lines, expected (column, row), text
    ("0-byte file", lambda k, ls: b"", (None, None), "is empty (0 bytes)"),
    ("blank lines only", lambda k, ls: b"\n\r\n\n", (None, None), "is empty (no header)"),
    ("blank header line", lambda k, ls: b"\n" + b"\n".join(ls), (None, None), "the first line (the header) is blank"),
    ("too many fields", lambda k, ls: _replace_line(ls, 4, ls[3] + b",extra"), (None, 3),
     "fields where the header has"),
    ("too few fields", lambda k, ls: _replace_line(ls, 3, ls[2].rsplit(b",", 1)[0]), (None, 2),
     "where the header has"),
    ("unbalanced quote", lambda k, ls: _replace_line(ls, 3, b'"' + ls[2]), (None, 2),
     "is not valid CSV: unbalanced quotes (line 3)"),
    ("quoted value over two lines", lambda k, ls: _replace_line(ls, 3, b'"' + ls[2].replace(b",", b'\n",', 1)),
     (None, 2), "a quoted value spans lines (line 3)"),
    ("latin-1 byte in a row", lambda k, ls: _replace_line(ls, 4, ls[3] + b"\xe9"), (None, 3),
     "is not valid UTF-8 text (line 4)"),
    ("latin-1 byte in the header", lambda k, ls: _replace_line(ls, 1, ls[0].replace(b"member_id", b"m\xe9mber_id")),
     (None, None), "the header is not valid UTF-8 text"),
    ("UTF-16", lambda k, ls: b"\n".join(ls).decode().encode("utf-16"), (None, None), "is UTF-16 text"),
    ("Windows-1252 smart quotes", lambda k, ls: _replace_line(ls, 2, b"\x93" + ls[1] + b"\x94"), (None, 1),
     "is not valid UTF-8 text (line 2)"),
]


@pytest.mark.parametrize("kind_name", list(KINDS))
@pytest.mark.parametrize("case, make, where, text", CSV_CASES, ids=[c[0] for c in CSV_CASES])
def test_malformed_csv(tmp_path, kind_name, case, make, where, text):
    kind = KINDS[kind_name]
    path = tmp_path / "bad.csv"
    path.write_bytes(make(kind, _csv_lines(kind)))
    expect_error(kind, path, tmp_path, column=where[0], row=where[1], text=text)


@pytest.mark.parametrize("kind_name", list(KINDS))
def test_a_utf8_byte_order_mark_and_windows_line_ends_are_fine(tmp_path, kind_name):
    kind = KINDS[kind_name]
    plain = tmp_path / "plain.csv"
    plain.write_bytes(to_bytes(kind.frame(), "csv"))
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbf" + to_bytes(kind.frame(), "csv").replace(b"\n", b"\r\n"))
    a, b = kind.read(plain, tmp_path), kind.read(bom, tmp_path)
    pd.testing.assert_frame_equal(a, b)
    assert list(a["member_id"])[:2] == IDS[:2]


def _parquet_with(kind: Kind, column: str, array: pa.Array) -> bytes:
    table = pa.Table.from_pandas(kind.frame(), preserve_index=False)
    table = table.set_column(table.column_names.index(column), column, array)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _ids_binary(kind: Kind, bad_row: int) -> pa.Array:
    values = [i.encode() for i in IDS[:_n(kind)]]
    values[bad_row - 1] = b"\xffzq"
    return pa.array(values, type=pa.binary())


def _n(kind: Kind) -> int:
    return len(kind.frame())


PARQUET_CASES = [
    ("0-byte file", lambda k, good: b"", (None, None), "is empty (0 bytes)"),
    ("not Parquet", lambda k, good: b"member_id,surname\nzq11a,Smithers\n", (None, None), "cannot be read as Parquet"),
    ("garbage with magic bytes", lambda k, good: b"PAR1" + bytes(range(256)) + b"PAR1", (None, None),
     "cannot be read as Parquet"),
    ("cut short", lambda k, good: good[: len(good) // 2], (None, None), "cannot be read as Parquet"),
    ("footer missing", lambda k, good: good[:-8], (None, None), "cannot be read as Parquet"),
    ("ids not UTF-8", lambda k, good: _parquet_with(k, "member_id", _ids_binary(k, 3)), ("member_id", 3),
     "is not valid UTF-8 text"),
    ("float ids", lambda k, good: _parquet_with(k, "member_id", pa.array(np.arange(_n(k), dtype=float) + 7)),
     ("member_id", None), "member ids must be text or whole numbers, not double"),
    ("timestamp column", lambda k, good: _parquet_with(k, k.column, pa.array(
        np.arange(_n(k)).astype("datetime64[s]"))), ("COLUMN", None), "not timestamp"),
]


@pytest.mark.parametrize("kind_name", list(KINDS))
@pytest.mark.parametrize("case, make, where, text", PARQUET_CASES, ids=[c[0] for c in PARQUET_CASES])
def test_malformed_parquet(tmp_path, kind_name, case, make, where, text):
    kind = KINDS[kind_name]
    path = tmp_path / "bad.parquet"
    path.write_bytes(make(kind, to_bytes(kind.frame(), "parquet")))
    column = kind.column if where[0] == "COLUMN" else where[0]
    expect_error(kind, path, tmp_path, column=column, row=where[1], text=text)


def test_integer_parquet_ids_are_their_decimal_text(tmp_path):
    path = tmp_path / "p.parquet"
    path.write_bytes(_parquet_with(KINDS["probabilities"], "member_id", pa.array(range(7, 7 + len(IDS)))))
    assert list(read_probability_table(path)["member_id"]) == [str(i) for i in range(7, 7 + len(IDS))]


# --------------------------------------------------------------------------------------
# The file: missing, a directory, an unknown type, too large, changed while read
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind_name", list(KINDS))
def test_missing_file_directory_and_unknown_type(tmp_path, kind_name, fmt):
    kind = KINDS[kind_name]
    expect_error(kind, tmp_path / f"nope.{fmt}", tmp_path, text="file not found")
    expect_error(kind, tmp_path / f"nope.{fmt}.old", tmp_path, text="file not found")  # before its type
    (tmp_path / f"dir.{fmt}").mkdir()
    expect_error(kind, tmp_path / f"dir.{fmt}", tmp_path, text="is not a file")
    (tmp_path / "table.xlsx").write_bytes(to_bytes(kind.frame(), fmt))
    expect_error(kind, tmp_path / "table.xlsx", tmp_path, text="has unknown type '.xlsx'")
    os.mkfifo(tmp_path / f"pipe.{fmt}")  # opening it would wait for a writer forever
    expect_error(kind, tmp_path / f"pipe.{fmt}", tmp_path, text="is not a file")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind_name", list(KINDS))
def test_a_2_gib_file_is_refused_before_it_is_read(tmp_path, kind_name, fmt, monkeypatch):
    # A sparse file: 2 GiB long, no disk blocks, never read (the test would take minutes
    # and 2 GiB of memory if it were).
    kind = KINDS[kind_name]
    path = tmp_path / f"huge.{fmt}"
    path.write_bytes(to_bytes(kind.frame(), fmt))
    try:
        os.truncate(path, 2 << 30)
        real = tables._read_fully

        def read(fh, size):
            assert Path(fh.name) != path, "a file over the limit was read"
            return real(fh, size)
        monkeypatch.setattr(tables, "_read_fully", read)
        expect_error(kind, path, tmp_path, text="is 2.0 GiB, larger than the limit of 1.0 GiB "
                                                 "(set PPRE_MAX_INPUT_BYTES to raise it)")
    finally:
        path.unlink()


def test_the_size_limit_is_configurable(tmp_path, monkeypatch):
    kind = KINDS["probabilities"]
    path = tmp_path / "p.csv"
    path.write_bytes(to_bytes(kind.frame(), "csv"))
    size = path.stat().st_size
    monkeypatch.setenv("PPRE_MAX_INPUT_BYTES", str(size - 1))
    expect_error(kind, path, tmp_path, text=f"is {size} bytes, larger than the limit of {size - 1} bytes")
    monkeypatch.setenv("PPRE_MAX_INPUT_BYTES", str(size))
    assert len(read_probability_table(path)) == len(IDS)  # exactly at the limit: read
    for bad in ("lots", "0", "-5", "1e9"):
        monkeypatch.setenv("PPRE_MAX_INPUT_BYTES", bad)
        with pytest.raises(InputError) as info:
            read_probability_table(path)
        assert info.value.parameter == "PPRE_MAX_INPUT_BYTES"


def _replace(path: Path, data: bytes) -> None:
    new = path.with_name(path.name + ".new")
    new.write_bytes(data)
    os.replace(new, path)


CHANGES = {
    # what happens to the file while it is being read
    "replaced by rename": lambda path, good, other: _replace(path, other),
    "appended to": lambda path, good, other: path.open("ab").write(b"\n" + good[-40:]),
    "truncated": lambda path, good, other: os.truncate(path, len(good) // 2),
    "rewritten in place": lambda path, good, other: (path.write_bytes(other),
                                                     os.utime(path, ns=(1, 1))),
    "deleted": lambda path, good, other: path.unlink(),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind_name", list(KINDS))
@pytest.mark.parametrize("change", list(CHANGES))
def test_a_file_changed_while_it_is_read_is_refused(tmp_path, kind_name, fmt, change, monkeypatch):
    """The reader sees one version or refuses: never a mix, never the half of a write."""
    kind = KINDS[kind_name]
    good = to_bytes(kind.frame(), fmt)
    other = to_bytes(kind.frame().iloc[::-1].reset_index(drop=True), fmt)
    path = tmp_path / f"input.{fmt}"
    path.write_bytes(good)
    _good_members(tmp_path)
    real = tables._read_fully
    calls = []

    def read_then_change(fh, size):
        data = real(fh, size)
        if Path(fh.name) == path:
            calls.append(1)
            CHANGES[change](path, good, other)
        return data

    monkeypatch.setattr(tables, "_read_fully", read_then_change)
    with pytest.raises(InputError) as info:
        kind.read(path, tmp_path)
    e = info.value
    assert calls and e.file == str(path)
    assert "changed while it was read" in str(e) and (e.column, e.row) == (None, None)
    assert not (tmp_path / f"input.{fmt}.new").exists()
    monkeypatch.setattr(tables, "_read_fully", real)
    if path.exists() and path.stat().st_size in (len(good), len(other)):
        kind.read(path, tmp_path)  # once the file is complete again, it reads


def test_reading_twice_unchanged_is_fine(tmp_path):
    # The version check does not fire for a file that nobody touches.
    path = tmp_path / "p.parquet"
    path.write_bytes(to_bytes(probabilities_frame(), "parquet"))
    a, b = read_probability_table(path), read_probability_table(path)
    pd.testing.assert_frame_equal(a, b)


# --------------------------------------------------------------------------------------
# The one member-id rule
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_reader_strips_ids_the_same_way(tmp_path, fmt):
    raw = [" 007 ", "\t008", "009\u00a0", "010"]
    clean = ["007", "008", "009", "010"]
    m = tmp_path / f"m.{fmt}"
    m.write_bytes(to_bytes(pd.DataFrame({"member_id": raw, "surname": ["Lee"] * 4, "zip": ["60614"] * 4}), fmt))
    s = tmp_path / f"s.{fmt}"
    s.write_bytes(to_bytes(pd.DataFrame({"member_id": ["007", " 010"], "race": ["api", "white"]}), fmt))
    p = tmp_path / f"p.{fmt}"
    p.write_bytes(to_bytes(pd.DataFrame({"member_id": raw, **{r: [1.0 if r == "white" else 0.0] * 4
                                                                for r in RACES}}), fmt))
    c = tmp_path / f"c.{fmt}"
    c.write_bytes(to_bytes(pd.DataFrame({"member_id": raw, "y_true": [0, 1, 0, 1], "y_pred": [1, 1, 0, 0]}), fmt))
    assert list(read_members(m)["member_id"]) == clean
    assert list(read_self_id(s)["member_id"]) == ["007", "010"]
    prepared = prepare(read_members(m), read_self_id(s), PreparationConfig(seed=0))
    assert list(prepared["member_id"]) == clean and prepared.attrs["preparation"].self_id_used == 2
    assert list(read_probability_table(p)["member_id"]) == clean
    assert list(DatasetRegistry(named={"c": c}).load("c", ERO)["member_id"]) == clean
    # prepare applies the rule to tables that did not come through a reader, too
    direct = prepare(pd.DataFrame({"member_id": raw, "surname": ["Lee"] * 4, "zip": ["60614"] * 4}),
                     pd.DataFrame({"member_id": ["008 "], "race": ["api"]}), PreparationConfig(seed=0))
    assert list(direct["member_id"]) == clean and direct.attrs["preparation"].self_id_used == 1


def test_spaced_member_ids_join_the_client_dataset_sans_io(tmp_path):
    from tests.helpers import local_audit
    n = 40
    ids = [f"{i:03d}" for i in range(n)]
    members = pd.DataFrame({"member_id": [f" {i} " if k % 2 == 0 else i for k, i in enumerate(ids)],
                            "surname": ["Garcia", "Lee", "Smith", "Washington"] * (n // 4),
                            "zip": ["60614"] * n})
    members.to_csv(tmp_path / "members.csv", index=False)
    rng = np.random.default_rng(0)
    client = pd.DataFrame({"member_id": ids, "y_true": rng.integers(0, 2, n), "y_pred": rng.integers(0, 2, n)})
    client.to_csv(tmp_path / "ero.csv", index=False)
    tester_df = prepare(read_members(tmp_path / "members.csv"), None, PreparationConfig(seed=0, threshold=0.9))
    client_df = DatasetRegistry(named={"d": tmp_path / "ero.csv"}).load("d", ERO)
    result, _, _ = local_audit(tester_df, client_df)
    assert result.n_matched == n  # not n/2: ' 007 ' is member 007


# --------------------------------------------------------------------------------------
# End to end: the operator sees the error; nothing is written
# --------------------------------------------------------------------------------------
def _audit_args(members: Path, client: Path) -> list[str]:
    return ["audit", "--local", "--no-release-controls", "--metric", "ero", "--tester-members", str(members), "--client-data", str(client),
            "--bootstrap", "20", "--seed", "2", "--json"]


def _synth(tmp_path: Path):
    from ppre.synth import SynthConfig, synthesize
    data = synthesize(SynthConfig(members=120, seed=5))
    members = data.members.copy()
    members["member_id"] = [f" {m}\t" for m in members["member_id"]]  # the id rule at work
    members.to_csv(tmp_path / "members.csv", index=False)
    data.ero.to_csv(tmp_path / "ero.csv", index=False)
    return tmp_path / "members.csv", tmp_path / "ero.csv", data


def test_end_to_end_spaced_ids_join_and_bad_files_are_reported(tmp_path, capsys):
    from ppre.cli import main as ppre_main
    members, ero, data = _synth(tmp_path)
    assert ppre_main(_audit_args(members, ero)) == 0
    assert json.loads(capsys.readouterr().out)["n_matched"] == len(data.ero)

    # The Test-Client's dataset has a Latin-1 byte on line 5: the audit's JSON error names it.
    lines = ero.read_bytes().split(b"\n")
    lines[4] += b"\xe9"
    bad_client = tmp_path / "bad_ero.csv"
    bad_client.write_bytes(b"\n".join(lines))
    before = snapshot(tmp_path)
    assert ppre_main(_audit_args(members, bad_client)) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["error"]["code"] == "bad_input"
    assert f"file {bad_client}, data row 4: is not valid UTF-8 text (line 5)" in out["error"]["message"]
    assert snapshot(tmp_path) == before

    # The Tester's members file has a duplicate id (after the whitespace rule): refused
    # before any service starts, with the file, column and rows, and no id.
    frame = pd.read_csv(members, dtype=str, keep_default_na=False)
    frame.loc[9, "member_id"] = frame.loc[2, "member_id"].strip()
    bad_members = tmp_path / "bad_members.csv"
    frame.to_csv(bad_members, index=False)
    before = snapshot(tmp_path)
    assert ppre_main(_audit_args(bad_members, ero)) == 2
    captured = capsys.readouterr()
    assert (f"file {bad_members}, column 'member_id', data row 10: duplicate member id (the same as data row 3)"
            in captured.err + captured.out)  # with --json: the error object on stdout
    assert frame.loc[2, "member_id"].strip() not in captured.err + captured.out
    assert snapshot(tmp_path) == before
