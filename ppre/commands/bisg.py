"""``ppre bisg``: BISG / BIFSG race probabilities for a members file (design §2.2).

Reads ``member_id, surname, zip`` (optional ``first_name``, ``tract``) from CSV or
Parquet (``--geo none`` leaves the geography out: BISF with ``--first-names``,
`tester_service.demographics.bisg`), validates it
(`tester_service.demographics.preparation.read_members_table`, `validate_members`), and
writes ``member_id``, the six probability columns (`common.races.RACES`) and ``source``
(`tester_service.demographics.bisg.SOURCES`) as CSV, or Parquet when the output ends in
``.parquet``.
The output is written to a temporary file next to it and renamed into place, so an
error never leaves a half-written file. This is a diagnostic tool: an audit itself
never writes probabilities to disk (design §2).
"""
from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from common.errors import InputError
from common.races import RACES
from common.tables import numpy_to_arrow, strings_to_arrow
from tester_service.demographics.bisg import GEOS, SOURCES, bisg
from tester_service.demographics.preparation import read_members_table, validate_members

log = logging.getLogger(__name__)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bisg", help="BISG race probabilities for a members file (docs/design.md §2.2)",
                              description=__doc__.splitlines()[0])
    p.add_argument("--input", required=True, help="members CSV/Parquet: member_id, surname, zip[, first_name, tract]")
    p.add_argument("--output", required=True, help="probabilities CSV (or .parquet)")
    p.add_argument("--geo", choices=GEOS, default="zcta",
                   help="geography: ZCTA from zip (default), tract GEOID from tract, or none "
                        "(surname only; with --first-names: BISF)")
    p.add_argument("--first-names", action="store_true", help="BIFSG: also use first_name")
    from ppre.columns import add_column_arguments
    add_column_arguments(p, env=False, whose="the members file (the output names PPRE's columns)")
    p.set_defaults(func=run)


def _floats_as_text(table: pa.Table) -> pa.Table:
    """Format float columns as text on all cores (the CSV writer does it on one); the
    text is the writer's own shortest round-trip form, so the file is unchanged."""
    floats = [i for i, f in enumerate(table.schema) if pa.types.is_floating(f.type)]
    if len(floats) < 2:
        return table
    with ThreadPoolExecutor(max_workers=min(len(floats), os.cpu_count() or 1)) as pool:
        texts = list(pool.map(lambda i: pc.cast(table.column(i), pa.string()), floats))
    for i, text in zip(floats, texts):
        table = table.set_column(i, table.schema.field(i).name, text)
    return table


_D4 = np.array([int.from_bytes(f"{i:04d}".encode(), "little") for i in range(10000)], dtype=np.uint32)
_D2 = np.array([int.from_bytes(f"{i:02d}".encode(), "little") for i in range(100)], dtype=np.uint32)


def _probabilities_as_text(x: np.ndarray) -> pa.Array:
    """Probabilities in [0, 1] as 16-character text ``d.dddddddddddddd`` (14 decimals:
    within 5e-15 of the value, so rows still sum to 1 within 1e-13), built with numpy
    (releases the GIL) instead of Arrow's slower shortest round-trip formatting."""
    n = len(x)
    v = np.rint(np.clip(x, 0.0, 1.0) * 1e14)
    ip = v >= 1e14
    v -= ip * 1e14
    a = np.floor(v * 1e-8)
    b = (v - a * 1e8).astype(np.uint32)
    ah, al = np.divmod(a.astype(np.uint32), np.uint32(10000))
    bh, bl = np.divmod(b, np.uint32(10000))
    out = np.empty((n, 4), dtype=np.uint32)  # 4 ASCII bytes per word (little-endian)
    out[:, 0] = (ip.view(np.uint8) + np.uint32(48)) | np.uint32(46 << 8) | (_D2[ah] << np.uint32(16))
    out[:, 1] = _D4[al]
    out[:, 2] = _D4[bh]
    out[:, 3] = _D4[bl]
    if not np.little_endian:  # pragma: no cover
        out = out.byteswap()
    offsets = np.arange(0, (n + 1) * 16, 16, dtype=np.int32)
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(out))


def _quoting(table: pa.Table) -> str:
    """'none' when no text cell needs quotes (plain CSV), else 'needed' (Arrow then quotes
    every text cell). Scans the raw text buffers, so a million cells take milliseconds."""
    specials = (b",", b'"', b"\n", b"\r")
    if any(any(ch.decode() in name for ch in specials) for name in table.column_names):
        return "needed"
    for field, column in zip(table.schema, table.columns):
        if not (pa.types.is_string(field.type) or pa.types.is_large_string(field.type)):
            continue
        for chunk in column.chunks:
            data = chunk.buffers()[2]
            if data is not None:
                raw = data.to_pybytes()  # one copy; ``in`` then searches at memchr speed
                if any(ch in raw for ch in specials):
                    return "needed"
    return "none"


def write_table_atomic(table: pa.Table, output: str | Path) -> None:
    """Write ``table`` as CSV (or Parquet for ``.parquet``/``.pq``) via a temp file + rename."""
    out = Path(output)
    directory = out.parent if str(out.parent) else Path(".")
    if not directory.is_dir():
        raise InputError("its folder does not exist", file=str(output))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            if out.suffix.lower() in (".parquet", ".pq"):
                pq.write_table(table, fh)
            else:
                pacsv.write_csv(_floats_as_text(table), fh,
                                write_options=pacsv.WriteOptions(quoting_style=_quoting(table)))
        os.replace(tmp, out)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def run(args: argparse.Namespace) -> int:
    from ppre.columns import members_columns
    t0 = time.perf_counter()
    members = read_members_table(args.input, columns=members_columns(args))  # Arrow, all text: no pandas here
    csv_out = not str(args.output).lower().endswith((".parquet", ".pq"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        # Validation (hashing, regex: Arrow releases the GIL) runs beside BISG; its error,
        # if any, is raised first, exactly as if it had run before.
        checked = pool.submit(validate_members, members, str(args.input))
        try:
            if args.geo == "tract" and "tract" not in members.column_names:
                raise InputError("is missing column 'tract' needed by --geo tract", file=str(args.input))
            if args.first_names and "first_name" not in members.column_names:
                raise InputError("is missing column 'first_name' needed by --first-names", file=str(args.input))
            t1 = time.perf_counter()
            res = bisg(members["surname"], zips=members["zip"],
                       tracts=members["tract"] if args.geo == "tract" else None,
                       first_names=members["first_name"] if args.first_names else None, geo=args.geo)
            t2 = time.perf_counter()
            probs = res.probabilities
            if csv_out:
                texts = list(pool.map(lambda j: _probabilities_as_text(probs[:, j]), range(len(RACES))))
        except Exception:
            checked.result()
            raise
        checked.result()
    columns = {"member_id": members.column("member_id").cast(pa.string())}
    for j, race in enumerate(RACES):
        columns[race] = texts[j] if csv_out else numpy_to_arrow(probs[:, j])
    columns["source"] = pa.DictionaryArray.from_arrays(numpy_to_arrow(res.source_codes), strings_to_arrow(SOURCES))
    table = pa.table(columns)
    if csv_out:
        table = table.set_column(len(columns) - 1, "source", table.column("source").cast(pa.string()))
    write_table_atomic(table, args.output)
    t3 = time.perf_counter()
    log.info("bisg: %d members; read %.2fs, compute %.2fs, write %.2fs", members.num_rows, t1 - t0, t2 - t1, t3 - t2)
    return 0
