"""Reading the parties' input files: one reader, one member-id rule (docs/inputs.md).

Every input goes through here: the Tester's members and Self-ID files (design
§2, via `tester_service.demographics.preparation`), its prepared probability table and the
Test-Client's datasets (`read_table`). Errors are `InputError`s that name the file and,
where there is one, the column and the row (rows are data records numbered from 1, the
first record after the header; blank lines are not records; CSV messages also give the
line). They never contain a member id or any other value from the file.

* **Size.** A file larger than `max_input_bytes()` (default 1 GiB, environment variable
  ``PPRE_MAX_INPUT_BYTES``) is refused before it is read: a file, and the table made
  from it, are held in memory whole (design §2: the preparation is in memory only).
* **One consistent version.** A file is opened once and read whole through that handle.
  Its identity (device, inode), size and modification time are taken before and after
  the read, and compared with what the path names after the read: a file that was
  replaced, truncated, appended to or rewritten while it was read is refused ("changed
  while it was read"), never used as a mix of two versions. Run the audit again once
  the file is complete (write it elsewhere and rename it into place). Not detectable:
  an in-place rewrite to the same size within one tick of the file system's clock.
* **Empty.** A 0-byte file is refused; so is a file with a header and no data rows.
* **CSV.** UTF-8 (a byte-order mark is skipped; UTF-16 and other encodings are refused
  with the line of the first bad byte and how to convert the file: `not_utf8`); one
  header row; every record has as many fields as the header; a quoted value may not
  span lines. Fields are separated by commas; a header that is one field holding ``;``
  or a tab is refused as "looks semicolon-separated" (`separator_hint`).
  Neither is guessed: any byte sequence is valid Latin-1, so a guessed encoding would
  silently misread a file in another one (surnames feed BISG), and a file separated by
  semicolons usually comes from a locale that writes decimal commas, which a guessed
  separator would then misread as text or refuse row by row; both parties must also
  read ids byte for byte the same way. The message says how to save the file instead.
* **Parquet.** Read with pyarrow; a file that is not Parquet, or is cut short, is
  refused. Text columns must be valid UTF-8 (row named).
* **Header.** Names are matched case-insensitively with surrounding whitespace ignored;
  a name twice is refused; a missing required column is named (with the close spelling
  that was found, and the file's columns: `missing_column`); an unknown column close to
  an optional one is refused (a misspelt opt-out flag must not be silently ignored);
  other columns are ignored.
* **Column mapping** (``columns``: our name -> the file's name, e.g. ``{"member_id":
  "Member ID", "y_pred": "prediction"}``; `parse_column_mapping`; docs/inputs.md, "Column
  mapping: the fine print"): a file's column is read under our name. An entry applies to a file when
  the reader looks for its name (so one mapping serves a party's several files); the
  file must then have the mapped column, and must not also have a column of our name.
* **Member ids** (`clean_member_ids`, `check_member_ids`): text, never numbers (``007``
  stays ``007``; a Parquet integer column is written in decimal, a float column is
  refused: it may have lost digits); surrounding whitespace (any Unicode space) is
  removed; an empty id and an id that appears twice (after that rule) are refused.
  Every reader applies this rule, so the two parties' ids join the same way.
* **Numbers** (`read_table`): each value must parse as a number; ``NaN`` and empty cells
  are "not a number"; infinities are left to the caller's range check, which names them.
  ``True``/``False`` (any case) are not numbers either: the message says to write 1/0
  (`not_a_number`). They are not read as 1/0 because the reader does not know which
  columns are yes/no ones (a score column holding "True" is a broken export, not a
  score of 1); Parquet booleans are typed, and are read as 1/0.
* **Error names** (`shown_column`): an error about a column the mapping renamed names
  the file's own column (``'Customer Key'``, not ``'member_id'``).
* Nothing here writes a file.
"""
from __future__ import annotations

import csv
import difflib
import io
import os
import re
import stat as stat_mod
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from common.errors import InputError

if TYPE_CHECKING:  # pandas is imported where it is needed (start-up time of ``ppre bisg``)
    import pandas as pd

ID_COLUMN = "member_id"
MAX_INPUT_BYTES_ENV = "PPRE_MAX_INPUT_BYTES"
DEFAULT_MAX_INPUT_BYTES = 1 << 30  # 1 GiB
PARQUET_SUFFIXES = (".parquet", ".pq")
CSV_SUFFIXES = (".csv", ".txt", "")


# --------------------------------------------------------------------------------------
# Arrow <-> numpy without pandas. pyarrow imports pandas (about half a second) the first
# time `pa.array`, `pa.scalar` (also implicit: ``pc.equal(arr, "")``) or ``to_numpy`` is
# used; these helpers build arrays from buffers instead, so reading a file (and ``ppre
# bisg``) never loads it.
# --------------------------------------------------------------------------------------
_NP_TYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
             pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.uint64(): np.uint64,
             pa.float32(): np.float32, pa.float64(): np.float64}


def _bits(buf: pa.Buffer, offset: int, n: int) -> np.ndarray:
    """An Arrow bitmap (validity or boolean values) as a numpy bool array."""
    return np.unpackbits(np.frombuffer(buf, dtype=np.uint8), count=offset + n,
                         bitorder="little")[offset:].astype(bool)


def arrow_to_numpy(arr: pa.Array | pa.ChunkedArray, null: object = None) -> np.ndarray:
    """Numeric or boolean Arrow values as a new (writable) numpy array; nulls become
    ``null`` (required when there are nulls). Like ``to_numpy`` but without pandas."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n, off = len(arr), arr.offset
    bufs = arr.buffers()
    if pa.types.is_boolean(arr.type):
        out = _bits(bufs[1], off, n) if n else np.zeros(0, dtype=bool)
    elif arr.type in _NP_TYPES:
        dt = np.dtype(_NP_TYPES[arr.type])
        out = np.frombuffer(bufs[1], dtype=dt, count=n, offset=off * dt.itemsize).copy() if n \
            else np.zeros(0, dtype=dt)
    else:  # pragma: no cover - other types keep pyarrow's own conversion
        return arr.to_numpy(zero_copy_only=False, writable=True)
    if arr.null_count:
        if null is None:
            raise ValueError("nulls need a fill value")
        out[~_bits(bufs[0], off, n)] = null
    return out


def numpy_to_arrow(values: np.ndarray) -> pa.Array:
    """1-D numeric or boolean numpy values as an Arrow array (no nulls), without pandas."""
    v = np.ascontiguousarray(values)
    if v.dtype == bool:
        return pa.Array.from_buffers(pa.bool_(), len(v), [None, pa.py_buffer(np.packbits(v, bitorder="little"))])
    return pa.Array.from_buffers(pa.from_numpy_dtype(v.dtype), len(v), [None, pa.py_buffer(v)])


def strings_to_arrow(values: Sequence[str]) -> pa.Array:
    """Python strings (no None) as an Arrow string array, without pandas."""
    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=offsets[1:])
    if offsets[-1] >= 2**31:  # pragma: no cover - more than 2 GB of text
        return pa.array(list(values), type=pa.string())
    return pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets.astype(np.int32)),
                                       pa.py_buffer(b"".join(encoded)))


def string_scalar(value: str) -> pa.Scalar:
    """An Arrow string scalar (for compute functions), without pandas."""
    return strings_to_arrow([value])[0]


def fill_empty(arr: pa.Array) -> pa.Array:
    """``arr.fill_null("")`` for a string array."""
    return arr.fill_null(string_scalar("")) if arr.null_count else arr


# --------------------------------------------------------------------------------------
# The file itself: size, one consistent version
# --------------------------------------------------------------------------------------
def max_input_bytes() -> int:
    """The largest input file accepted, in bytes (``PPRE_MAX_INPUT_BYTES``; default 1 GiB)."""
    value = os.environ.get(MAX_INPUT_BYTES_ENV, "").strip()
    if not value:
        return DEFAULT_MAX_INPUT_BYTES
    if not value.isdigit() or int(value) == 0:
        raise InputError(f"must be a positive whole number of bytes, got '{value}'", parameter=MAX_INPUT_BYTES_ENV)
    return int(value)


def size_text(n: int) -> str:
    """A byte count as people read it (bytes, KiB, MiB, GiB)."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def _read_fully(fh: io.BufferedReader, size: int) -> bytes:
    """All of an open file (the read itself; a seam for tests of files changed meanwhile)."""
    return fh.read(size + 1)  # one byte more than expected: a file that grew is noticed


def _same_version(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino, a.st_size, a.st_mtime_ns) == (b.st_dev, b.st_ino, b.st_size, b.st_mtime_ns)


def read_file_bytes(path: str | Path, suffixes: Sequence[str] | None = None) -> bytes:
    """The whole content of one input file, as one consistent version (module docstring);
    with ``suffixes``, a file whose name ends otherwise is refused (once it is found)."""
    p = Path(path)
    label = str(path)
    try:
        if not stat_mod.S_ISREG(os.stat(p).st_mode):  # before open(): a named pipe would block it
            raise InputError("is not a file", file=label)
        if suffixes is not None and p.suffix.lower() not in suffixes:
            raise InputError(f"has unknown type '{p.suffix.lower()}'; use .csv or .parquet", file=label)
        fh = open(p, "rb")
    except FileNotFoundError:
        raise InputError("file not found", file=label) from None
    except OSError as exc:
        raise InputError(f"cannot be opened ({type(exc).__name__})", file=label) from None
    with fh:
        before = os.fstat(fh.fileno())
        if not stat_mod.S_ISREG(before.st_mode):
            raise InputError("is not a file", file=label)
        limit = max_input_bytes()
        if before.st_size > limit:
            raise InputError(f"is {size_text(before.st_size)}, larger than the limit of {size_text(limit)} "
                             f"(set {MAX_INPUT_BYTES_ENV} to raise it)", file=label)
        if before.st_size == 0:
            raise InputError("is empty (0 bytes)", file=label)
        try:
            raw = _read_fully(fh, before.st_size)
        except OSError as exc:
            raise InputError(f"cannot be read ({type(exc).__name__})", file=label) from None
        after = os.fstat(fh.fileno())
    try:
        now = os.stat(p)
    except OSError:
        now = None
    if len(raw) != before.st_size or not _same_version(before, after) or now is None \
            or not _same_version(before, now):
        raise InputError("changed while it was read (replaced, truncated or rewritten); nothing was used: "
                         "run again once the file is complete", file=label)
    return raw


# --------------------------------------------------------------------------------------
# CSV and Parquet -> Arrow
# --------------------------------------------------------------------------------------
def first_row(mask: Sequence[bool] | np.ndarray) -> int:
    """1-based data row number of the first True (the header is row 0)."""
    return int(np.flatnonzero(np.asarray(mask))[0]) + 1


def not_utf8(label: str, line: int) -> InputError:
    """A CSV file that is not UTF-8 (docs/inputs.md, "File rules"): the line of the first
    bad byte, and how to convert the file (most often a Latin-1 / Windows-1252 export)."""
    converted = Path(label).with_suffix(".utf8.csv").name
    how = (f"convert it to UTF-8, e.g. iconv -f latin1 -t utf-8 {label} > {converted} (an export from Windows: "
           f"-f cp1252), or save it as 'CSV UTF-8' from the spreadsheet")
    if line == 1:
        return InputError(f"the header is not valid UTF-8 text: {how}", file=label)
    return InputError(f"is not valid UTF-8 text (line {line}): {how}", file=label, row=line - 1)


def separator_hint(header_text: str, header: Sequence[str], label: str) -> None:
    """Refuse a header that is one field holding ``;`` or a tab: a file separated by
    semicolons (a spreadsheet's export in a locale with decimal commas) or tabs, which
    would otherwise be read as one column (module docstring: why it is not guessed)."""
    if len(header) != 1:
        return
    for mark, words in ((";", "semicolon"), ("\t", "tab")):
        if header_text.count(mark) > header_text.count(","):
            raise InputError(f"looks {words}-separated: its header is one column holding {words}s, and PPRE "
                             "reads comma-separated files; save it as CSV with commas between fields (a "
                             "spreadsheet's 'CSV UTF-8 (comma delimited)') and decimal points, not commas",
                             file=label)


def _locate_bad_utf8(raw: bytes | memoryview, label: str) -> None:
    try:
        bytes(raw).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(label, bytes(raw[: exc.start]).count(b"\n") + 1) from None


def _csv_text_table(raw: bytes, label: str, numeric: frozenset[str] = frozenset()) -> pa.Table:
    """A CSV file's bytes -> Arrow table, every column text, no nulls (header names as given);
    columns named in ``numeric`` (lower case) are parsed as float64 where they all parse
    (else the whole file is read as text, and the caller finds the bad value).

    The fast path copies nothing: Arrow parses the bytes and checks that they are UTF-8;
    only when it refuses them is the file decoded again here to find the line."""
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise InputError("is UTF-16 text; save it as UTF-8", file=label)
    data = memoryview(raw)[3:] if raw.startswith(b"\xef\xbb\xbf") else memoryview(raw)
    if re.search(rb"\S", data) is None:
        raise InputError("is empty (no header)", file=label)
    end = raw.find(b"\n", len(raw) - len(data))
    first = bytes(data[: (end if end >= 0 else len(raw)) - (len(raw) - len(data))])
    try:
        header_text = first.decode("utf-8").rstrip("\r")
    except UnicodeDecodeError:
        raise not_utf8(label, 1) from None
    if not header_text.strip():
        raise InputError("the first line (the header) is blank", file=label)
    try:
        header = next(csv.reader([header_text], strict=True))
    except csv.Error:
        raise InputError("the header is not valid CSV", file=label) from None
    separator_hint(header_text, header, label)
    names = [f"{h}\0{i}" for i, h in enumerate(header)]  # unique here; duplicates are reported by _header
    types = {n: pa.float64() if h.strip().lower() in numeric else pa.string() for n, h in zip(names, header)}
    try:
        table = pacsv.read_csv(
            pa.BufferReader(pa.py_buffer(data)),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1),
            parse_options=pacsv.ParseOptions(newlines_in_values=False),
            convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False,
                                                 quoted_strings_can_be_null=False),
        )
        lines = raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)
        # One record per line, unless there are blank lines or a quoted value over several
        # lines (which Arrow's parallel reader may split anywhere): then look for the latter.
        if table.num_rows + 1 == lines or not any(
                arrow_to_numpy(pc.match_substring(c, "\n").combine_chunks(), null=False).any()
                for c in table.columns if _is_text(c.type)):
            return table
    except pa.ArrowException:
        if numeric:  # perhaps a value that is no number: read it all as text, to name its row
            return _csv_text_table(raw, label)
    # Errors only: find the first bad byte or record (Arrow's message quotes the record's
    # content, so it is not passed on).
    _locate_bad_utf8(data, label)
    reader = csv.reader(io.StringIO(bytes(data).decode("utf-8"), newline=""), strict=True)
    row, line = 0, 1
    try:
        next(reader)
        line = reader.line_num
        for record in reader:
            start = line + 1
            line = reader.line_num
            if not record:
                continue
            row += 1
            if line != start:
                raise InputError(f"a quoted value spans lines (line {start})", file=label, row=row)
            if len(record) != len(names):
                fields = f"{len(record)} field{'s' if len(record) != 1 else ''}"
                raise InputError(f"has {fields} where the header has {len(names)} (line {start})",
                                 file=label, row=row)
    except csv.Error:  # e.g. a quote that is never closed: the record starts after `line`
        raise InputError(f"is not valid CSV: unbalanced quotes (line {line + 1})", file=label,
                         row=row + 1) from None
    raise InputError("cannot be parsed as CSV", file=label)


def _parquet_table(raw: bytes, label: str) -> pa.Table:
    try:
        return pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InputError(f"cannot be read as Parquet ({type(exc).__name__})", file=label) from None


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _binary_as_text(col: pa.Array, label: str, column: str) -> pa.Array:
    out = []
    for i, v in enumerate(col.to_pylist()):
        try:
            out.append("" if v is None else v.decode("utf-8"))
        except UnicodeDecodeError:
            raise InputError("is not valid UTF-8 text", file=label, column=column, row=i + 1) from None
    return strings_to_arrow(out)


def as_text(col: pa.Array | pa.ChunkedArray, label: str, column: str) -> pa.Array:
    """A Parquet column as text ('' for missing): text, whole numbers (also floats that are
    whole, e.g. ZIPs written as 2134.0) and booleans; anything else is refused."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if _is_text(t) or pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_null(t):
        return fill_empty(col.cast(pa.string()))
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _binary_as_text(col, label, column)
    if pa.types.is_floating(t):
        v = arrow_to_numpy(col.cast(pa.float64()), null=np.nan)
        missing = np.isnan(v)
        whole = np.isfinite(v) & (np.abs(v) < 2.0 ** 53)
        whole[whole] = v[whole] == np.floor(v[whole])
        bad = ~missing & ~whole
        if bad.any():
            raise InputError("must be text or a whole number", file=label, column=column, row=first_row(bad))
        text = np.where(missing, "", np.where(missing, 0, v).astype(np.int64).astype(str))
        return strings_to_arrow(text.tolist())
    raise InputError(f"must hold text or whole numbers, not {t}", file=label, column=column)


def misspelling_hint(name: str, present: Iterable[str]) -> str:
    """`` (found 'x': misspelt?)`` for the column among ``present`` closest to ``name``, or ''."""
    close = difflib.get_close_matches(name, list(present), n=1, cutoff=0.6)
    return f" (found '{close[0]}': misspelt?)" if close else ""


def did_you_mean(name: str, choices: Iterable[str], *, cutoff: float = 0.6) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``name`` (case, ``_`` and ``-``
    ignored in the comparison), or ''."""
    def key(text: str) -> str:
        return text.strip().lower().replace("-", "_")
    by_key = {key(c): c for c in choices}
    close = difflib.get_close_matches(key(name), list(by_key), n=1, cutoff=cutoff)
    return f" (did you mean '{by_key[close[0]]}'?)" if close else ""


#: most header names a message lists
MAX_LISTED_COLUMNS = 30
_VALUE_LIKE = re.compile(r"\d{3}")


def _looks_like_value(name: str) -> bool:
    """A header name that may be a data value (a file without its header row: its first
    record would be listed): a number, or a name with 3+ digits in a row (an id, a ZIP)."""
    try:
        float(name)
        return True
    except ValueError:
        return _VALUE_LIKE.search(name) is not None


def column_listing(file_columns: Sequence[str]) -> str:
    """The file's column names for a message, as `'a', 'b'`; names that may be data
    values are withheld (counted), never printed (errors never carry a value)."""
    names = [c for c in file_columns if c and not _looks_like_value(c)]
    withheld = sum(1 for c in file_columns if c and _looks_like_value(c))
    shown = ", ".join(f"'{c}'" for c in names[:MAX_LISTED_COLUMNS])
    more = len(names) - MAX_LISTED_COLUMNS
    parts = [shown] if shown else []
    if more > 0:
        parts.append(f"{more} more")
    if withheld:
        parts.append(f"{withheld} withheld: {'it looks' if withheld == 1 else 'they look'} like data values "
                     "(is the header row missing?)")
    return ", ".join(parts) or "none"


def mapping_flag(column: str) -> str:
    """How to map a file's column to ``column`` (the flag; the TOML key is ``[columns]``)."""
    return "--id-column NAME" if column == ID_COLUMN else f"--column {column}=NAME"


def prefixed_mapping(prefix: str) -> Callable[[str], str]:
    """`mapping_flag` for flags with a prefix: ``prefixed_mapping("client-")`` says
    ``--client-column y_pred=NAME`` (`ppre audit --local`)."""
    return lambda column: f"--{prefix}{mapping_flag(column)[2:]}"


#: where a `MissingColumn`'s message says how to map a column
HOW_TO_MAP = "\0how\0"


class MissingColumn(InputError):
    """A column a reader needs is not in the file. The message says how to map one of
    the file's columns to it: by default with the services' flags (`mapping_flag`); a
    caller that knows better (`ppre audit --local`'s prefixed flags, the Python API's
    parameters) says it in its own words with `in_context`."""

    def __init__(self, template: str, missing: str, *, how: Callable[[str], str] = mapping_flag,
                 **where) -> None:
        super().__init__(template.replace(HOW_TO_MAP, how(missing)), **where)
        self.template, self.missing, self.where = template, missing, where

    def in_context(self, how: Callable[[str], str]) -> "MissingColumn":
        return MissingColumn(self.template, self.missing, how=how, **self.where)


def missing_column(column: str, file_columns: Sequence[str], label: str, hint: str = "",
                   also: str = "") -> MissingColumn:
    """The error for a required column the file lacks: the file's columns and how to map
    one (``also``: another way out, appended)."""
    return MissingColumn(f"required column is missing{hint}; the file has {column_listing(file_columns)} "
                         f"(if one of them holds '{column}', map it: {HOW_TO_MAP}){also}", column,
                         file=label, column=column)


def parse_column_mapping(id_column: str | None = None, items: Iterable[str] | Mapping[str, str] = (),
                         *, parameter: str = "--column") -> dict[str, str]:
    """``--id-column NAME`` and ``--column OURS=THEIRS`` (repeatable; or a mapping, as in
    a TOML ``[columns]`` table) -> {our column name: the file's column name}. Our names
    are lower case; a name mapped twice, or two of ours mapped to one column, is refused."""
    pairs: list[tuple[str, str]] = []
    if isinstance(items, Mapping):
        pairs = [(str(k), str(v)) for k, v in items.items()]
    else:
        for item in items:
            ours, sep, theirs = str(item).partition("=")
            if not sep:
                raise InputError(f"expected OURS=THEIRS (e.g. y_pred=prediction), got '{item}'", parameter=parameter)
            pairs.append((ours, theirs))
    if id_column is not None and str(id_column).strip():
        pairs.insert(0, (ID_COLUMN, str(id_column)))
    out: dict[str, str] = {}
    for ours, theirs in pairs:
        ours, theirs = ours.strip().lower(), theirs.strip()
        if not ours or not theirs:
            raise InputError(f"a column mapping needs both names, got '{ours}={theirs}'", parameter=parameter)
        if ours in out and out[ours].lower() != theirs.lower():
            raise InputError(f"'{ours}' is mapped twice ('{out[ours]}' and '{theirs}')", parameter=parameter)
        out[ours] = theirs
    targets: dict[str, str] = {}
    for ours, theirs in out.items():
        if theirs.lower() in targets:
            raise InputError(f"'{targets[theirs.lower()]}' and '{ours}' are both mapped to the column '{theirs}'",
                             parameter=parameter)
        targets[theirs.lower()] = ours
    return out


def _file_name(column: str, columns: Mapping[str, str] | None) -> str:
    """Where our ``column`` is in the file, lower case (the mapping's name, or its own)."""
    return (columns or {}).get(column, column).strip().lower()


def _mapped(present: list[str], shown: list[str], label: str, columns: Mapping[str, str] | None,
            wanted: Iterable[str] | None, may_lack: Iterable[str] = ()) -> list[str]:
    """Header names (lower case) with the column mapping applied: each entry whose name
    is ``wanted`` (None: every entry) renames the file's column to ours (a file may lack
    the column of an entry in ``may_lack``: a lenient column, checked by its user)."""
    if not columns:
        return present
    wanted = None if wanted is None else set(wanted)
    out = list(present)
    for ours, theirs in columns.items():
        if wanted is not None and ours not in wanted:
            continue
        t = theirs.strip().lower()
        if t == ours:
            continue
        if t not in present:
            if ours in may_lack:
                continue
            raise InputError(f"the column mapping {ours}={theirs} names a column the file does not have"
                             f"{did_you_mean(theirs, shown)}; the file has {column_listing(shown)}",
                             file=label, column=theirs)
        if ours in present:
            raise InputError(f"the file has both '{ours}' and '{theirs}', which the column mapping reads as "
                             f"'{ours}': remove the mapping or rename a column", file=label, column=ours)
        out[present.index(t)] = ours
    return out


def _header(table: pa.Table, label: str, required: Sequence[str], optional: Sequence[str],
            columns: Mapping[str, str] | None = None, lenient: Sequence[str] = (),
            may_lack: Sequence[str] | None = None) -> pa.Table:
    """Header rules (module docstring): the known columns only, named in lower case
    (our names, after the column mapping). ``lenient``: optional columns a caller may
    not use (no misspelling check against them); ``may_lack`` (default: the lenient
    ones): columns whose mapping entry may name a column the file does not have."""
    shown = [c.split("\0", 1)[0].strip() for c in table.column_names]
    present = [c.lower() for c in shown]
    seen: set[str] = set()
    for c in present:
        if c in seen:
            raise InputError("appears more than once in the header", file=label, column=c)
        seen.add(c)
    known = set(required) | set(optional)
    present = _mapped(present, shown, label, columns, known | set(lenient), lenient if may_lack is None else may_lack)
    seen = set(present)
    table = table.rename_columns(present)
    for col in required:
        if col not in seen:
            hint = misspelling_hint(col, [c for c in present if c not in known and c not in lenient])
            raise missing_column(col, shown, label, hint)
    for col in present:
        if col not in known and col not in lenient:
            close = difflib.get_close_matches(col, sorted(known - seen), n=1, cutoff=0.6)
            if close:  # probably a misspelt optional column (e.g. the opt-out flag): refuse
                raise InputError(f"unknown column (did you mean '{close[0]}'?)", file=label, column=col)
    table = table.select([c for c in present if c in known or c in lenient])
    if table.num_rows == 0:
        raise InputError("has no data rows", file=label)
    return table


#: how errors name a table given as a pandas DataFrame (the Python API: `ppre.api`)
DATAFRAME_LABEL = "<DataFrame>"


def source_label(source) -> str:
    """How errors name an input: its path, or `DATAFRAME_LABEL` for an in-memory table
    (never its content)."""
    return str(source) if isinstance(source, (str, Path)) else DATAFRAME_LABEL


def _frame_table(frame) -> pa.Table:
    """An in-memory DataFrame as the Arrow table its file would give (typed, as Parquet):
    the same checks follow, and nothing of it touches the disk."""
    frame = frame.reset_index(drop=True)
    frame.columns = [str(c) for c in frame.columns]
    try:
        table = pa.Table.from_pandas(frame, preserve_index=False)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InputError(f"cannot be read as a table ({type(exc).__name__})", file=DATAFRAME_LABEL) from None
    if table.num_rows == 0:
        raise InputError("has no data rows", file=DATAFRAME_LABEL)
    return table


def _raw_table(path, numeric: frozenset[str] = frozenset()) -> tuple[pa.Table, bool]:
    """(the file — or an in-memory pandas DataFrame — as an Arrow table, whether it is
    typed like Parquet); CSV columns are text, or float64 for the ``numeric`` ones when
    all their values parse."""
    if not isinstance(path, (str, Path)):
        return _frame_table(path), True
    label = str(path)
    suffix = Path(path).suffix.lower()
    raw = read_file_bytes(path, PARQUET_SUFFIXES + CSV_SUFFIXES)
    if suffix in PARQUET_SUFFIXES:
        return _parquet_table(raw, label), True
    return _csv_text_table(raw, label, numeric), False


def file_header(path: str | Path) -> tuple[list[str], int]:
    """(the file's column names as written, stripped; its number of data rows): the whole
    file is read under the rules above (`ppre ... check-config`)."""
    table, _ = _raw_table(path)
    return [n.split("\0", 1)[0].strip() for n in table.column_names], table.num_rows


def mapped_name(column: str, columns: Mapping[str, str] | None) -> str:
    """Where our ``column`` is looked for in a file, lower case (the column mapping's name,
    else its own)."""
    return _file_name(column, columns)


def shown_column(column: str, columns: Mapping[str, str] | None) -> str:
    """How an error names our ``column``: the file's own name for it where the column
    mapping renames it (``'Customer Key'``, not ``'member_id'``), else ours."""
    theirs = (columns or {}).get(column)
    return theirs.strip() if theirs and theirs.strip().lower() != column else column


def column_mapping_of(table: pa.Table | pd.DataFrame) -> dict[str, str]:
    """The column mapping a table was read with (`read_text_table`'s schema metadata, or
    `read_table`'s ``frame.attrs["column_mapping"]``); {} if none."""
    import json
    if isinstance(table, pa.Table):
        raw = (table.schema.metadata or {}).get(COLUMN_MAPPING_KEY)
        return dict(json.loads(raw)) if raw else {}
    return dict(getattr(table, "attrs", {}).get("column_mapping") or {})


def table_column(table: pa.Table | pd.DataFrame, column: str) -> str:
    """`shown_column` for a table read here: the name an error about its ``column`` uses."""
    return shown_column(column, column_mapping_of(table))


#: schema metadata key of `read_text_table`'s result: the file's header names as written (JSON)
FILE_COLUMNS_KEY = b"file_columns"
#: schema metadata key of `read_text_table`'s result: the column mapping it applied (JSON)
COLUMN_MAPPING_KEY = b"column_mapping"


def read_text_table(path: str | Path, required: Sequence[str], optional: Sequence[str] = (),
                    columns: Mapping[str, str] | None = None, lenient: Sequence[str] = ()) -> pa.Table:
    """The file's known columns as Arrow text (no nulls), lower-case names (ours, after
    the ``columns`` mapping); the member ids follow `clean_member_ids` (not yet checked:
    see `check_member_ids`). ``lenient``: optional columns that only some settings use
    (read when present; an unknown column close to one of them is ignored, not refused:
    the setting that needs one checks for it, `file_columns` helps its message)."""
    import json
    label = source_label(path)
    table, _ = _raw_table(path)
    shown = [c.split("\0", 1)[0].strip() for c in table.column_names]
    table = _header(table, label, required, optional, columns, lenient, may_lack=())  # a mapped name must be there
    cols = [clean_member_ids(c, label, shown_column(n, columns)) if n == ID_COLUMN
            else as_text(c, label, shown_column(n, columns)) for n, c in zip(table.column_names, table.columns)]
    return pa.Table.from_arrays(cols, names=table.column_names,
                                metadata={FILE_COLUMNS_KEY: json.dumps(shown).encode("utf-8"),
                                          COLUMN_MAPPING_KEY: json.dumps(dict(columns or {})).encode("utf-8")})


def file_columns(table: pa.Table) -> list[str]:
    """The header names, as written, of the file `read_text_table` read (else [])."""
    import json
    raw = (table.schema.metadata or {}).get(FILE_COLUMNS_KEY)
    return list(json.loads(raw)) if raw else []


# --------------------------------------------------------------------------------------
# Member ids: the one rule
# --------------------------------------------------------------------------------------
def clean_member_ids(values: pa.Array | pa.ChunkedArray, label: str, column: str = ID_COLUMN) -> pa.Array:
    """THE member-id rule (module docstring): ids as text, surrounding whitespace removed.

    Every reader (members, Self-ID, probability table, Test-Client dataset) and `prepare`
    apply it, so `' 007 '` in one file joins `'007'` in another. Idempotent.
    """
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    t = values.type
    if pa.types.is_integer(t) or pa.types.is_null(t):
        values = values.cast(pa.string())
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        values = _binary_as_text(values, label, column)
    elif not _is_text(t):
        raise InputError(f"member ids must be text or whole numbers, not {t}", file=label, column=column)
    return fill_empty(pc.utf8_trim_whitespace(values))


def check_member_ids(ids: pa.Array | pa.ChunkedArray, label: str, column: str = ID_COLUMN) -> None:
    """Refuse an empty id and an id that appears twice (ids already `clean_member_ids`)."""
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    empty = arrow_to_numpy(pc.equal(fill_empty(ids), string_scalar("")), null=False)
    if empty.any():
        raise InputError("empty member id", file=label, column=column, row=first_row(empty))
    if len(ids) > 1:  # sorting is faster than hashing: equal ids are then neighbours
        ordered = ids.take(pc.array_sort_indices(ids))
        if not arrow_to_numpy(pc.equal(ordered.slice(1), ordered.slice(0, len(ids) - 1)), null=True).any():
            return
    # Slow path (errors only): dictionary codes are given in order of first appearance,
    # so a row repeats an earlier id when its code is not above all earlier codes.
    codes = arrow_to_numpy(pc.dictionary_encode(ids).indices).astype(np.int64)
    if len(codes) < 2:
        return
    repeat = np.concatenate([[False], codes[1:] <= np.maximum.accumulate(codes)[:-1]])
    if not repeat.any():
        return
    second = int(np.flatnonzero(repeat)[0])
    first = int(np.flatnonzero(codes == codes[second])[0])
    raise InputError(f"duplicate member id (the same as data row {first + 1})", file=label, column=column,
                     row=second + 1)


# --------------------------------------------------------------------------------------
# Numeric tables: the probability table and the Test-Client's datasets
# --------------------------------------------------------------------------------------
def _casts(arr: pa.Array) -> bool:
    try:
        arr.cast(pa.float64())
        return True
    except pa.ArrowException:
        return False


#: values that are no number but say how to write one (`not_a_number`), lower case
BOOLEAN_WORDS = frozenset({"true", "false"})


def not_a_number(label: str, column: str, row: int, boolean: bool = False) -> InputError:
    """The error of a value that is no number; ``boolean``: the value is True/False (any
    case), and the message says to write 1/0 (module docstring: why it is not read as 1/0)."""
    hint = ": expected 0/1 (True/False: write 1/0)" if boolean else ""
    return InputError("not a number" + hint, file=label, column=column, row=row)


def _is_boolean_word(value) -> bool:
    return isinstance(value, str) and value.strip().lower() in BOOLEAN_WORDS


def _first_boolean_word(arr: pa.Array) -> int | None:
    """1-based row of the first True/False (any case) of a text column, else None."""
    if not _is_text(arr.type):
        return None
    lowered = pc.utf8_lower(pc.utf8_trim_whitespace(fill_empty(arr)))
    hits = arrow_to_numpy(pc.or_(pc.equal(lowered, string_scalar("true")), pc.equal(lowered, string_scalar("false"))),
                          null=False)
    return first_row(hits) if hits.any() else None


def _text_numbers(arr: pa.Array, label: str, column: str) -> np.ndarray:
    arr = pc.utf8_trim_whitespace(fill_empty(arr))
    try:
        return arrow_to_numpy(arr.cast(pa.float64()), null=np.nan)
    except pa.ArrowException:
        pass
    lo, hi = 0, len(arr)  # a value in arr[lo:hi] does not parse: halve until it is found
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _casts(arr.slice(lo, mid - lo)):
            lo = mid
        else:
            hi = mid
    raise not_a_number(label, column, lo + 1, _is_boolean_word(arr[lo].as_py()))


def _numbers(col: pa.Array | pa.ChunkedArray, label: str, column: str) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if _is_text(t):
        values = _text_numbers(col, label, column)
    elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
        values = _text_numbers(_binary_as_text(col, label, column), label, column)
    elif (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
          or pa.types.is_decimal(t) or pa.types.is_null(t)):
        values = arrow_to_numpy(col.cast(pa.float64()), null=np.nan)
    else:
        raise InputError(f"must hold numbers, not {t}", file=label, column=column)
    bad = np.isnan(values)
    if bad.any():
        row = first_row(bad)
        raise not_a_number(label, column, row, _is_text(col.type) and _is_boolean_word(col[row - 1].as_py()))
    return values


def _lenient_numbers(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A column as float64 where its values parse, NaN elsewhere (the caller checks)."""
    import pandas as pd
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    t = col.type
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_decimal(t) or pa.types.is_null(t)):
        return arrow_to_numpy(col.cast(pa.float64()), null=np.nan)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        col = col.cast(pa.string(), safe=False)
    if _is_text(t) or pa.types.is_string(col.type):
        text = pc.utf8_trim_whitespace(fill_empty(col)).to_numpy(zero_copy_only=False)
        return pd.to_numeric(pd.Series(text, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    return np.full(len(col), np.nan)


def read_table(path: str | Path, numeric: Sequence[str] | None, *, text: Sequence[str] = (),
               optional: Sequence[str] = (), unique_ids: bool = True, lenient: Sequence[str] = (),
               columns: Mapping[str, str] | None = None) -> pd.DataFrame:
    """A probability table or a Test-Client dataset: ``member_id`` (the id rule; checked
    unique unless ``unique_ids`` is false, as in ranked lists where a member appears in
    many queries), the ``numeric`` columns as float64 (NaN and unparsable values refused,
    row named) and the ``text`` columns as text. ``optional`` columns (numeric or text)
    may be absent. ``lenient`` columns are optional numeric columns read with NaN where a
    value is missing or does not parse, for the caller to check (ERO reads ``y_pred`` or
    ``score``, as its parameters say). Other columns are ignored; with ``numeric=None``
    every column but the member id and the text columns is numeric (a probability
    table's group columns). ``columns``: the column mapping (module docstring). The
    file's own header names are in ``frame.attrs["file_columns"]``, the mapping in
    ``frame.attrs["column_mapping"]``. ``path`` may be a pandas DataFrame (`ppre.api`):
    read from memory under the same rules."""
    import pandas as pd
    label = source_label(path)
    table, _ = _raw_table(path, frozenset(_file_name(c, columns) for c in (numeric or ())))
    shown = [n.split("\0", 1)[0].strip() for n in table.column_names]
    if numeric is None:
        names = _mapped([c.lower() for c in shown], shown, label, columns, None)
        numeric = tuple(c for c in names if c != ID_COLUMN and c not in text and c not in lenient)
    required = [c for c in (ID_COLUMN, *numeric, *text) if c not in optional]
    table = _header(table, label, required, optional, columns, lenient)
    id_name = shown_column(ID_COLUMN, columns)  # errors name the file's column
    ids = clean_member_ids(table.column(ID_COLUMN), label, id_name)
    if unique_ids:
        check_member_ids(ids, label, id_name)
    else:
        empty = arrow_to_numpy(pc.equal(fill_empty(ids), string_scalar("")), null=False)
        if empty.any():
            raise InputError("empty member id", file=label, column=id_name, row=first_row(empty))
    present = set(table.column_names)
    data = {c: _numbers(table.column(c), label, shown_column(c, columns)) for c in numeric if c in present}
    lenient_read = [c for c in lenient if c in present and c not in data]
    data.update({c: _lenient_numbers(table.column(c)) for c in lenient_read})
    data.update({c: as_text(table.column(c), label, shown_column(c, columns)).to_numpy(zero_copy_only=False)
                 for c in text if c in present})
    frame = pd.DataFrame(data)
    frame.insert(0, ID_COLUMN, ids.to_numpy(zero_copy_only=False))
    frame.attrs["file_columns"] = shown
    frame.attrs["column_mapping"] = dict(columns or {})
    # a lenient column's first True/False, for `numeric_column`'s message (rows only, no values)
    frame.attrs["boolean_words"] = {c: row for c in lenient_read
                                    if (row := _first_boolean_word(table.column(c).combine_chunks())) is not None}
    return frame


def numeric_column(frame: pd.DataFrame, column: str, file: str) -> np.ndarray:
    """A column of a `read_table` frame as float64; a value that is no number is refused,
    naming the file's column (`table_column`) and saying how to write True/False."""
    import pandas as pd
    values = pd.to_numeric(frame[column], errors="coerce")
    bad = values.isna()
    if bad.any():
        row = first_row(bad)
        words = frame.attrs.get("boolean_words", {}).get(column)
        text = frame[column].iloc[row - 1]
        raise not_a_number(file, table_column(frame, column), row, words == row or _is_boolean_word(text))
    return values.to_numpy(dtype=np.float64)


def binary_column(frame: pd.DataFrame, column: str, file: str) -> np.ndarray:
    values = numeric_column(frame, column, file)
    bad = ~np.isin(values, (0.0, 1.0))
    if bad.any():
        raise InputError("label must be 0 or 1", file=file, column=table_column(frame, column), row=first_row(bad))
    return values.astype(np.int64)
