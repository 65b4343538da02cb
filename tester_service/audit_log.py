"""The Tester's tamper-evident audit log: one keyed, chained record per audit request.

Every `RunAudit` request and its outcome is appended as one line of JSON:
``{"seq": n, "time": "...Z", "prev": <MAC of record n-1>, "record": {...}, "mac": m}``
with ``m = HMAC-SHA256(key, prev ‖ canonical JSON of {"seq", "time", "record"})`` (the
first record's ``prev`` is 64 zeros). The key (`load_key`) lives in a file outside the
log's directory, so whoever can rewrite the log cannot recompute the chain: changing,
removing, reordering or inserting a record — even re-chaining every later record —
breaks it, and `verify` (``ppre log verify FILE --key KEYFILE``) names the first broken
one. Dropping the *tail* leaves a shorter chain that is still intact, so after each
append the log also exports its head (the record count and the last MAC, ``N:MAC``) to a
second file, by default next to the key (`head_path`); `verify` given that head
(``--expect-head``) detects a truncated or rewritten tail (docs/operations.md, "The
audit log").

Logs written before keyed logs (records with a plain ``"hash"``, ``SHA-256(prev ‖ ...)``)
are still read and verified as a plain hash chain, which anyone who can write the file
can re-chain; a keyed record is never appended to such a log, nor a plain one to a keyed
log (the error says what to do).

A record holds who asked, when, the metric, option, parameters, dataset name, sizes
(joined rows) and the outcome: a SHA-256 digest of the result, or the error code and
message (which never carry member data), never a member id, a probability, a test value
or an estimate.

Appends are serialised within the process by a lock and across processes by ``flock``;
each record is one ``write`` followed by ``fsync``. A log whose last record cannot be
read, or was not made with this key, is not appended to (the audit fails with a clear
error) until it is repaired.
"""
from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import hmac
import json
import os
import re
import secrets
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import PPREError

GENESIS = "0" * 64
#: the most bytes read back from the end of the log to find its last record
TAIL_BYTES = 1 << 20
#: bytes of a key `load_key` creates (and the fewest it accepts)
KEY_BYTES = 32
#: the suffix of the head file `head_path` puts beside the key
HEAD_SUFFIX = ".head"


class AuditLogError(PPREError):
    code = "audit_log"


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _link_message(prev: str, seq: int, time: str, record: dict) -> bytes:
    """What a record's link covers: the previous link and every field of the record."""
    return prev.encode("ascii") + _canonical({"seq": seq, "time": time, "record": record})


def record_hash(prev: str, seq: int, time: str, record: dict) -> str:
    return hashlib.sha256(_link_message(prev, seq, time, record)).hexdigest()


def record_mac(key: bytes, prev: str, seq: int, time: str, record: dict) -> str:
    """The keyed link of one record: HMAC-SHA256 over what `record_hash` hashes."""
    return hmac.new(key, _link_message(prev, seq, time, record), hashlib.sha256).hexdigest()


def _inside(path: Path, directory: Path) -> bool:
    return path == directory or directory in path.parents


def load_key(key_path: str | Path, log_path: str | Path | None = None, *, create: bool = False) -> bytes:
    """The audit log's key: the hex text of at least `KEY_BYTES` random bytes in
    `key_path`, which must not lie in the log's directory (whoever can rewrite the log
    must not read its key). `create`: a missing key file is made (mode 0600) — only for
    a log that does not hold records yet, as a new key cannot vouch for old records."""
    key_file = Path(key_path).expanduser().absolute()
    if log_path is not None:
        log_dir = Path(log_path).expanduser().absolute().parent
        if _inside(key_file.resolve(), log_dir.resolve()):
            raise AuditLogError(f"the audit log's key {key_path} lies in the log's directory {log_dir}: keep it "
                                "where whoever can write the log cannot read it (another directory or volume), "
                                "--audit-log-key FILE")
    if not key_file.exists() and create:
        if log_path is not None and Path(log_path).exists() and Path(log_path).stat().st_size > 0:
            raise AuditLogError(f"the audit log {log_path} holds records but its key {key_path} is missing: give "
                                "the key those records were made with (--audit-log-key), or start a new log file")
        _create_key(key_file)
    try:
        text = key_file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditLogError(f"the audit log's key {key_path} cannot be read "
                            f"({getattr(exc, 'strerror', None) or exc})") from None
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < KEY_BYTES:
        raise AuditLogError(f"the audit log's key {key_path} is not a key: expected the hex text of at least "
                            f"{KEY_BYTES} random bytes (a missing key file is created by `ppre tester serve`)")
    return key


def _create_key(key_file: Path) -> None:
    key_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return  # another process made it first
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(secrets.token_hex(KEY_BYTES) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def head_path(key_path: str | Path) -> Path:
    """Where the log's head is exported by default: beside its key (outside the log's
    directory)."""
    return Path(str(key_path) + HEAD_SUFFIX)


def format_head(records: int, mac: str) -> str:
    return f"{records}:{mac}"


def parse_head(text: str) -> tuple[int, str]:
    """``N:MAC`` (as `ppre log head` prints it), or the path of a file holding it."""
    value = text.strip()
    if Path(value).is_file():
        try:
            value = Path(value).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise AuditLogError(f"the log head {text} cannot be read ({exc})") from None
    count, sep, mac = value.partition(":")
    if not sep or not count.strip().isdigit() or not re.fullmatch(r"[0-9a-f]{64}", mac.strip()):
        raise AuditLogError(f"'{text}' is not a log head: expected N:MAC as `ppre log head` prints it "
                            "(or a file holding it)")
    return int(count), mac.strip()


def _write_head(path: Path, records: int, mac: str) -> None:
    """Replace the head file atomically (a reader sees the old head or the new one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="ascii") as fh:
            fh.write(format_head(records, mac) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise AuditLogError(f"the audit log's head {path} cannot be written ({exc.strerror or exc}); "
                            "--audit-log-head FILE") from None


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


#: why a keyed record is not appended to a log of the older, unkeyed kind
UNKEYED_LOG = ("the audit log {path} was written without a key (a plain hash chain): keep it as it is "
               "(`ppre log verify` still reads it) and give --audit-log a new file")


def _unkeyed_tail(path: Path) -> bool:
    """Whether `path` holds records whose last one is of the unkeyed kind."""
    try:
        with open(path, "rb") as fh:
            last = _last_line(fh)
        return last is not None and "mac" not in json.loads(last)
    except (OSError, ValueError, TypeError, AuditLogError):
        return False  # missing (a new log), or damaged: `check_tail` says what is wrong


class AuditLog:
    """Appends chained records to one file (created on the first append): keyed with
    `key` (`load_key`; without one, the plain hash chain of older logs), and, keyed,
    its head (`N:MAC`) written to the file `head` after each append (`keyed`: beside
    the key by default)."""

    def __init__(self, path: str | Path, key: bytes | None = None, head: str | Path | None = None) -> None:
        self.path = Path(path)
        self.key = key
        self.head = Path(head) if head is not None else None
        self._lock = threading.Lock()

    @classmethod
    def keyed(cls, path: str | Path, key_file: str | Path, head: str | Path | None = None) -> "AuditLog":
        """The service's log: its key read from (or, for a new log, created in) `key_file`,
        its head exported to `head` (default `head_path(key_file)`)."""
        if _unkeyed_tail(Path(path)):  # an older log: say so before asking for a key it never had
            raise AuditLogError(UNKEYED_LOG.format(path=path))
        key = load_key(key_file, path, create=True)
        head = Path(head) if head is not None else head_path(key_file)
        log_dir = Path(path).expanduser().absolute().parent.resolve()
        if _inside(head.expanduser().absolute().resolve(), log_dir):
            raise AuditLogError(f"the audit log's head {head} lies in the log's directory {log_dir}: export it "
                                "where whoever can write the log cannot (--audit-log-head FILE)")
        log = cls(path, key, head)
        log.check_tail()
        return log

    def check_tail(self) -> None:
        """Refuse now (not at the first audit) a log that cannot be appended to."""
        with self._lock, self._open() as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH)
            try:
                self._next_link(fh)
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _open(self):
        try:
            return open(self.path, "a+b")
        except OSError as exc:
            raise AuditLogError(f"the audit log {self.path} cannot be opened ({exc.strerror})") from None

    def append(self, record: dict) -> dict:
        """Append `record` (JSON-serialisable, no member-level data) and return the entry."""
        with self._lock, self._open() as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                seq, prev = self._next_link(fh)
                time = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                entry = {"seq": seq, "time": time, "prev": prev, "record": record}
                if self.key is not None:
                    entry["mac"] = record_mac(self.key, prev, seq, time, record)
                else:
                    entry["hash"] = record_hash(prev, seq, time, record)
                fh.seek(0, os.SEEK_END)
                fh.write(_canonical(entry) + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
                if self.head is not None and self.key is not None:
                    _write_head(self.head, seq, entry["mac"])
                return entry
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _next_link(self, fh) -> tuple[int, str]:
        """(seq, prev) of the next record, after checking that the last one is readable,
        of this log's kind (keyed or not) and, keyed, made with this key."""
        last = _last_line(fh)
        if last is None:
            return 1, GENESIS
        try:
            entry = json.loads(last)
            seq, prev = int(entry["seq"]), str(entry["prev"])
            link = str(entry["mac"] if "mac" in entry else entry["hash"])
        except (ValueError, KeyError, TypeError):
            raise AuditLogError(f"the last record of the audit log {self.path} cannot be read; "
                                "run `ppre log verify`") from None
        if self.key is not None and "mac" not in entry:
            raise AuditLogError(UNKEYED_LOG.format(path=self.path))
        if self.key is None and "mac" in entry:
            raise AuditLogError(f"the audit log {self.path} is keyed: give its key (--audit-log-key)")
        if self.key is not None and not hmac.compare_digest(
                record_mac(self.key, prev, seq, entry["time"], entry["record"]), link):
            raise AuditLogError(f"the last record of the audit log {self.path} was not made with this key (another "
                                "key, or the record was changed): run `ppre log verify --key FILE`")
        return seq + 1, link


@dataclass(frozen=True)
class Verification:
    ok: bool
    records: int            # records checked and intact
    broken_line: int | None  # 1-based line of the first broken record
    reason: str
    keyed: bool = False      # the records carry MACs, checked with the key
    last: str = GENESIS      # the last intact record's link (MAC or hash): the head is (records, last)


#: the reason of an intact keyed log whose tail was not checked against an exported head
UNANCHORED = "tail not anchored: give --expect-head to detect records removed from the end"
#: the reason of an intact log of the older, unkeyed kind
UNKEYED = ("chain intact (an unkeyed log: a plain hash chain, which whoever can write the file can "
           "rewrite and re-chain)")


def verify(path: str | Path, key: bytes | None = None, expect_head: tuple[int, str] | None = None) -> Verification:
    """Check the whole chain (with `key`, every record's MAC) and, given the head
    exported when the log was written (`expect_head`: count, last MAC), that no record
    up to it was removed or rewritten; the first broken record is named by its line."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return Verification(False, 0, None, f"cannot be read ({exc.strerror})")
    lines = data.split(b"\n")
    complete = data.endswith(b"\n")
    lines = lines[:-1] if complete or not data else lines
    prev, keyed, anchor = GENESIS, False, None
    for number, raw in enumerate(lines, start=1):
        if number == len(lines) and not complete:
            return Verification(False, number - 1, number, "incomplete record (no end of line)")
        broken = _check_record(raw, number, prev, key)
        if isinstance(broken, str):
            return Verification(False, number - 1, number, broken)
        prev, keyed = broken
        if expect_head is not None and number == expect_head[0]:
            anchor = prev
    return _checked_tail(len(lines), prev, keyed, key, expect_head, anchor)


def _check_record(raw: bytes, number: int, prev: str, key: bytes | None) -> tuple[str, bool] | str:
    """(this record's link, keyed) when it follows `prev`, else why it is broken."""
    try:
        entry = json.loads(raw)
        seq, time, record, claimed_prev = entry["seq"], entry["time"], entry["record"], entry["prev"]
        keyed = "mac" in entry
        stored = entry["mac"] if keyed else entry["hash"]
    except (ValueError, KeyError, TypeError):
        return "not a log record"
    if seq != number:
        return f"sequence number {seq} where {number} was expected (a record was removed, inserted or reordered)"
    if claimed_prev != prev:
        return "does not follow the previous record (a record was removed, inserted or changed)"
    if keyed and key is None:
        return "a keyed record: give the log's key (--key FILE, env PPRE_AUDIT_LOG_KEY_FILE) to check it"
    if not keyed and key is not None:
        return ("has no MAC (an unkeyed record: the log was written without a key, or rewritten by someone "
                "without it)")
    expected = record_mac(key, prev, seq, time, record) if keyed else record_hash(prev, seq, time, record)
    if not hmac.compare_digest(expected, str(stored)):
        return ("its MAC does not match its content and this key (it was changed, or another key made it)"
                if keyed else "its content does not match its hash (it was changed)")
    return str(stored), keyed


def _checked_tail(records: int, last: str, keyed: bool, key: bytes | None,
                  expect_head: tuple[int, str] | None, anchor: str | None) -> Verification:
    """An intact chain of `records`, against the exported head when one is given."""
    if expect_head is not None:
        count, mac = expect_head
        if records < count:
            return Verification(False, records, None, f"truncated: the log holds {records} records, its exported "
                                                      f"head {count} (records {records + 1}-{count} were removed)",
                                keyed, last)
        if count > 0 and not hmac.compare_digest(anchor or "", mac):
            return Verification(False, count - 1, count, "is not the record the exported head names (the log was "
                                                         "rewritten from here on)", keyed, last)
    if records == 0:
        return Verification(True, 0, None, "empty log", keyed, last)
    if not keyed:
        return Verification(True, records, None, UNKEYED, keyed, last)
    tail = "the exported head matches" if expect_head is not None else UNANCHORED
    return Verification(True, records, None, f"chain intact, every MAC checked; {tail}", keyed, last)
