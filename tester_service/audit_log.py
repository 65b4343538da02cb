"""The Tester's tamper-evident audit log: one hash-chained record per audit request.

Every `RunAudit` request and its outcome is appended as one line of JSON:
``{"seq": n, "time": "...Z", "prev": <hash of record n-1>, "record": {...}, "hash": h}``
with ``h = SHA-256(prev ‖ canonical JSON of {"seq", "time", "record"})`` (the first
record's ``prev`` is 64 zeros). Changing, removing, reordering or inserting a record
breaks the chain at that record, and `verify` (``ppre log verify FILE``) names the first
broken one. A record holds who asked, when, the metric, option, parameters, dataset
name, sizes (joined rows) and the outcome: a SHA-256 digest of the result, or the error
code and message (which never carry member data), never a member id, a probability, a
test value or an estimate.

Appends are serialised within the process by a lock and across processes by ``flock``;
each record is one ``write`` followed by ``fsync``. A log whose last record cannot be
read is not appended to (the audit fails with a clear error) until it is repaired.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import PPREError

GENESIS = "0" * 64
#: the most bytes read back from the end of the log to find its last record
TAIL_BYTES = 1 << 20


class AuditLogError(PPREError):
    code = "audit_log"


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def record_hash(prev: str, seq: int, time: str, record: dict) -> str:
    return hashlib.sha256(prev.encode("ascii") + _canonical({"seq": seq, "time": time, "record": record})).hexdigest()


def result_digest(report_json: str) -> str:
    """The digest of a result as the operator received it (`AuditResult.report_json`)."""
    return hashlib.sha256(report_json.encode("utf-8")).hexdigest()


def _last_line(fh) -> bytes | None:
    fh.seek(0, os.SEEK_END)
    size = fh.tell()
    if size == 0:
        return None
    start = max(0, size - TAIL_BYTES)
    fh.seek(start)
    tail = fh.read()
    if not tail.endswith(b"\n"):
        raise AuditLogError(f"the audit log {fh.name} ends in an incomplete record; run `ppre log verify`")
    lines = tail[:-1].split(b"\n")
    return lines[-1]


class AuditLog:
    """Appends hash-chained records to one file (created on the first append)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def append(self, record: dict) -> dict:
        """Append `record` (JSON-serialisable, no member-level data) and return the entry."""
        with self._lock:
            try:
                fh = open(self.path, "a+b")
            except OSError as exc:
                raise AuditLogError(f"the audit log {self.path} cannot be opened ({exc.strerror})") from None
            with fh:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
                try:
                    last = _last_line(fh)
                    if last is None:
                        seq, prev = 1, GENESIS
                    else:
                        try:
                            entry = json.loads(last)
                            seq, prev = int(entry["seq"]) + 1, str(entry["hash"])
                        except (ValueError, KeyError, TypeError):
                            raise AuditLogError(f"the last record of the audit log {self.path} cannot be read; "
                                                "run `ppre log verify`") from None
                    time = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                    entry = {"seq": seq, "time": time, "prev": prev, "record": record,
                             "hash": record_hash(prev, seq, time, record)}
                    fh.seek(0, os.SEEK_END)
                    fh.write(_canonical(entry) + b"\n")
                    fh.flush()
                    os.fsync(fh.fileno())
                    return entry
                finally:
                    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


@dataclass(frozen=True)
class Verification:
    ok: bool
    records: int            # records checked and intact
    broken_line: int | None  # 1-based line of the first broken record
    reason: str


def verify(path: str | Path) -> Verification:
    """Check the whole chain; the first broken record is named by its line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return Verification(False, 0, None, f"cannot be read ({exc.strerror})")
    if not data:
        return Verification(True, 0, None, "empty log")
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")
    if complete:
        lines = lines[:-1]
    prev = GENESIS
    for number, raw in enumerate(lines, start=1):
        if number == len(lines) and not complete:
            return Verification(False, number - 1, number, "incomplete record (no end of line)")
        try:
            entry = json.loads(raw)
            seq, time, record, stored = entry["seq"], entry["time"], entry["record"], entry["hash"]
            claimed_prev = entry["prev"]
        except (ValueError, KeyError, TypeError):
            return Verification(False, number - 1, number, "not a log record")
        if seq != number:
            return Verification(False, number - 1, number, f"sequence number {seq} where {number} was expected "
                                                           "(a record was removed, inserted or reordered)")
        if claimed_prev != prev:
            return Verification(False, number - 1, number, "does not follow the previous record "
                                                           "(a record was removed, inserted or changed)")
        if record_hash(prev, seq, time, record) != stored:
            return Verification(False, number - 1, number, "its content does not match its hash (it was changed)")
        prev = stored
    return Verification(True, len(lines), None, "chain intact")
