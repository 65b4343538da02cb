"""The Tester's run history: finished audits and their results, aggregates only.

An embedded SQLite database (stdlib `sqlite3`), separate from the tamper-evident audit
log (`tester_service.audit_log`): the log records every request and its outcome for
accountability and holds no result, only its digest; the history keeps the results of
the audits that *finished*, so that an operator can list and re-read them
(`ppre runs list`, `ppre runs show`, the Tester's `ListRuns` / `GetRun` RPCs).

One row per finished audit: a run id (random, 12 characters of lower-case base32 —
URL-safe, never starting with "-"), start and end time (UTC, ISO 8601, fixed width so
that text order is time order), the operator who asked (its certificate identity, or
its address without TLS), the Test-Client's identity, metric, option, dataset name, the
request's parameters (bootstrap, confidence, tau, seed, result recipient, correction,
metric parameters: as `audit_record` writes them), joined rows, the verdict's severity
and message, and the result exactly as the operator received it
(`AuditReport.to_json()`: estimates, intervals, differences, verdict, preparation and
release counts — never a member id, a probability or a test value) with its SHA-256,
the digest the audit log holds for the same audit.

A local run (`ppre audit --local`, `ppre demo`, the Python API: `ppre.local`, design
§3.7) holds both parties in one process: under result recipient `client` the Tester
records its receipt, and then the result the operator was shown — the Test-Client's
kept result with the Tester's facts — replaces it (`deliver`), so that `ppre runs
show` and `ppre report` give back the estimates the terminal showed, and `ppre runs
list` their severity. What replaces the receipt is a result like any other kept here
(aggregates only). A service's history is never changed after its record, nor is that
of local services whose Tester keeps an audit log: the record holds what the log's
digest names (the receipt).

Writes: a run is recorded once, in one transaction (its `runs` row and its `results`
row commit together or not at all); a refused, failed or cancelled audit is never
recorded (the servicer records only a released result). Every call opens its own
connection (the server is multi-threaded); writes within a process are serialised by
a lock, across processes by SQLite's own locking with a busy timeout, in WAL mode.

Schema: `PRAGMA user_version` holds `SCHEMA_VERSION` (and `PRAGMA application_id`
marks the file as PPRE's); a file with another version, or some other SQLite database,
is refused with a clear error rather than read or changed.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import secrets
import sqlite3
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from common.errors import InputError, PPREError

#: this code's schema; `PRAGMA user_version` of every history file it writes
SCHEMA_VERSION = 1
#: `PRAGMA application_id` of a PPRE run history ("PPRH")
APPLICATION_ID = 0x50505248
#: how long a call waits for another writer (another process) before it gives up
BUSY_TIMEOUT_S = 30.0
#: `list` without a limit, and the most one call returns
DEFAULT_LIMIT = 50
MAX_LIMIT = 10_000
RUN_ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567"
RUN_ID_LENGTH = 12

_SCHEMA = (
    """CREATE TABLE runs (
        run_id TEXT PRIMARY KEY,
        started_at TEXT NOT NULL,
        finished_at TEXT NOT NULL,
        operator TEXT NOT NULL,
        client TEXT NOT NULL,
        metric TEXT NOT NULL,
        metric_option TEXT NOT NULL,
        dataset TEXT NOT NULL,
        parameters TEXT NOT NULL,
        n_matched INTEGER NOT NULL,
        severity TEXT NOT NULL,
        verdict_message TEXT NOT NULL
    )""",
    """CREATE TABLE results (
        run_id TEXT PRIMARY KEY REFERENCES runs(run_id),
        report_json TEXT NOT NULL,
        result_sha256 TEXT NOT NULL
    )""",
    "CREATE INDEX runs_started ON runs(started_at)",
    "CREATE INDEX runs_metric ON runs(metric, started_at)",
    "CREATE INDEX runs_dataset ON runs(dataset, started_at)",
)
_SUMMARY_COLUMNS = ("run_id", "started_at", "finished_at", "operator", "client", "metric", "metric_option",
                    "dataset", "parameters", "n_matched", "severity", "verdict_message")


class HistoryError(PPREError):
    """The history file cannot be used (unreadable, another program's, another schema version)."""

    code = "history"


class RunNotFound(HistoryError, LookupError):
    code = "not_found"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id '{run_id}' in the run history")
        self.run_id = run_id


def new_run_id() -> str:
    return "".join(secrets.choice(RUN_ID_ALPHABET) for _ in range(RUN_ID_LENGTH))


def utc_now() -> str:
    return format_time(_dt.datetime.now(_dt.timezone.utc))


def format_time(moment: _dt.datetime) -> str:
    """UTC, fixed width ("2026-03-01T12:00:00.000000Z"): text order is time order."""
    return moment.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str, *, parameter: str, end: bool = False) -> str:
    """A filter bound: a date (YYYY-MM-DD) or an ISO date and time (a time without a zone
    is UTC). `end`: an upper bound, exclusive — a date bound means the whole day
    (until 2026-03-01 keeps runs started on March 1st), a time bound includes the time
    itself. Returns the stored text form to compare with."""
    raw = (text or "").strip()
    if not raw:
        raise InputError("is empty: give a date (YYYY-MM-DD) or an ISO date and time", parameter=parameter)
    try:
        if len(raw) == 10:
            moment = _dt.datetime.combine(_dt.date.fromisoformat(raw), _dt.time(), _dt.timezone.utc)
            step = _dt.timedelta(days=1)
        else:
            moment = _dt.datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=_dt.timezone.utc)
            step = _dt.timedelta(microseconds=1)
    except ValueError:
        raise InputError(f"'{raw}' is not a date (YYYY-MM-DD) or an ISO date and time",
                         parameter=parameter) from None
    return format_time(moment + step if end else moment)


@dataclass(frozen=True)
class RunRecord:
    """One finished audit. `report_json` is empty in `list` results (read it with `get`)."""

    run_id: str
    started_at: str
    finished_at: str
    operator: str
    client: str
    metric: str
    metric_option: str
    dataset: str
    parameters: dict[str, Any]
    n_matched: int
    severity: str
    verdict_message: str
    report_json: str = ""
    result_sha256: str = ""

    def summary(self) -> dict[str, Any]:
        """Everything but the result (what `ppre runs list --json` prints per run)."""
        d = asdict(self)
        del d["report_json"], d["result_sha256"]
        return d

    @classmethod
    def _from_row(cls, row: sqlite3.Row, report_json: str = "", result_sha256: str = "") -> "RunRecord":
        values = {name: row[name] for name in _SUMMARY_COLUMNS}
        values["parameters"] = json.loads(values["parameters"])
        return cls(**values, report_json=report_json, result_sha256=result_sha256)

    # ------------------------------------------------------------- on the wire
    def to_proto(self):
        from proto import ppre_pb2 as pb
        summary = pb.RunSummary(run_id=self.run_id, started_at=self.started_at, finished_at=self.finished_at,
                                operator=self.operator, client=self.client, metric=self.metric,
                                metric_option=self.metric_option, dataset=self.dataset,
                                parameters_json=json.dumps(self.parameters, sort_keys=True),
                                n_matched=self.n_matched, severity=self.severity,
                                verdict_message=self.verdict_message)
        return pb.RunRecord(summary=summary, report_json=self.report_json, result_sha256=self.result_sha256)

    @classmethod
    def from_proto(cls, message) -> "RunRecord":
        """A `RunRecord` or a `RunSummary` message."""
        summary = message.summary if hasattr(message, "summary") else message
        try:
            parameters = json.loads(summary.parameters_json or "{}")
        except ValueError:
            parameters = {}
        return cls(run_id=summary.run_id, started_at=summary.started_at, finished_at=summary.finished_at,
                   operator=summary.operator, client=summary.client, metric=summary.metric,
                   metric_option=summary.metric_option, dataset=summary.dataset, parameters=parameters,
                   n_matched=summary.n_matched, severity=summary.severity,
                   verdict_message=summary.verdict_message,
                   report_json=getattr(message, "report_json", ""),
                   result_sha256=getattr(message, "result_sha256", ""))


class RunHistory:
    """The run history in one SQLite file (created, with its directory, unless `create`
    is False: then a missing file is a HistoryError)."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path).expanduser()
        self._write_lock = threading.Lock()
        if not create:  # a reader: the file must be there, and be a history of this version
            if not self.path.is_file():
                raise HistoryError(f"no run history at {self.path}")
            with self._connect():
                return
        if not self.path.exists():
            self._create_file()
        with self._connect(check=False) as con:
            self._prepare(con)

    @classmethod
    def of(cls, history: "RunHistory | str | Path | None") -> "RunHistory | None":
        if history is None or isinstance(history, RunHistory):
            return history
        return cls(history)

    def __repr__(self) -> str:
        return f"RunHistory({str(self.path)!r})"

    # ------------------------------------------------------------- the file
    def _create_file(self) -> None:
        """An empty file readable by its owner only (results are the operators' business);
        SQLite gives its -wal and -shm files the same permissions."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600))
        except OSError as exc:
            raise HistoryError(f"the run history {self.path} cannot be created ({exc.strerror})") from None

    @contextlib.contextmanager
    def _connect(self, *, check: bool = True) -> Iterator[sqlite3.Connection]:
        """A connection of its own (autocommit; transactions are explicit), closed after use."""
        try:
            con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"the run history {self.path} cannot be opened ({exc})") from None
        try:
            con.row_factory = sqlite3.Row
            if check:
                self._check_version(con)
            yield con
        except sqlite3.IntegrityError:
            raise  # a constraint (a run id taken): the caller's to handle
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"the run history {self.path} cannot be used ({exc})") from None
        finally:
            con.close()

    def _check_version(self, con: sqlite3.Connection) -> None:
        version = con.execute("PRAGMA user_version").fetchone()[0]
        app = con.execute("PRAGMA application_id").fetchone()[0]
        if app != APPLICATION_ID:
            raise HistoryError(f"{self.path} is not a PPRE run history (another program's SQLite database)")
        if version != SCHEMA_VERSION:
            newer = "a newer" if version > SCHEMA_VERSION else "an older"
            raise HistoryError(f"the run history {self.path} has schema version {version}, written by {newer} "
                               f"PPRE; this one reads version {SCHEMA_VERSION} only (keep the file, and use the "
                               f"PPRE that wrote it, or start a new history elsewhere)")

    def _prepare(self, con: sqlite3.Connection) -> None:
        """A new (empty) file gets the schema; any other file must be a history of this version."""
        with self._write_lock:
            con.execute("BEGIN IMMEDIATE")
            try:
                empty = con.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0
                app = con.execute("PRAGMA application_id").fetchone()[0]
                if empty and app == 0 and con.execute("PRAGMA user_version").fetchone()[0] == 0:
                    for statement in _SCHEMA:
                        con.execute(statement)
                    con.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
        self._check_version(con)
        if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            con.execute("PRAGMA journal_mode=WAL")  # persistent: set once per file

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed when the block ends, rolled back on any error."""
        with self._write_lock, self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    # ------------------------------------------------------------- writing
    def record(self, *, started_at: str, operator: str, client: str, metric: str, metric_option: str,
               dataset: str, parameters: dict[str, Any], n_matched: int, report_json: str,
               finished_at: str | None = None) -> str:
        """Record one finished audit, atomically; returns its new run id. `report_json` is
        the result as the operator received it (`AuditReport.to_json()`); its verdict's
        severity and message are read from it."""
        try:
            verdict = json.loads(report_json).get("verdict") or {}
        except (ValueError, AttributeError):
            raise HistoryError("the result to record is not a JSON object") from None
        row = {"started_at": started_at, "finished_at": finished_at or utc_now(), "operator": operator or "",
               "client": client or "", "metric": metric, "metric_option": metric_option or "", "dataset": dataset,
               "parameters": json.dumps(parameters, sort_keys=True), "n_matched": int(n_matched),
               "severity": str(verdict.get("severity", "")), "verdict_message": str(verdict.get("message", ""))}
        digest = hashlib.sha256(report_json.encode("utf-8")).hexdigest()
        for _ in range(5):  # a clash of random ids is astronomically rare; never overwrite one
            run_id = new_run_id()
            try:
                with self._transaction() as con:
                    self._insert_run(con, run_id, row)
                    self._insert_result(con, run_id, report_json, digest)
                return run_id
            except sqlite3.IntegrityError:
                continue
        raise HistoryError("could not find a free run id")

    def deliver(self, run_id: str, report_json: str) -> None:
        """A local run's receipt replaced by the result its operator was shown (module
        docstring): the result, its digest, and the run's severity and verdict message,
        in one transaction. RunNotFound names an id that is not here."""
        try:
            verdict = json.loads(report_json).get("verdict") or {}
        except (ValueError, AttributeError):
            raise HistoryError("the result to record is not a JSON object") from None
        digest = hashlib.sha256(report_json.encode("utf-8")).hexdigest()
        with self._transaction() as con:
            changed = con.execute("UPDATE runs SET severity = ?, verdict_message = ? WHERE run_id = ?",
                                  (str(verdict.get("severity", "")), str(verdict.get("message", "")),
                                   run_id)).rowcount
            if not changed:
                raise RunNotFound(run_id)
            con.execute("UPDATE results SET report_json = ?, result_sha256 = ? WHERE run_id = ?",
                        (report_json, digest, run_id))

    @staticmethod
    def _insert_run(con: sqlite3.Connection, run_id: str, row: dict[str, Any]) -> None:
        names = ("run_id", *row)
        con.execute(f"INSERT INTO runs ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                    (run_id, *row.values()))

    @staticmethod
    def _insert_result(con: sqlite3.Connection, run_id: str, report_json: str, digest: str) -> None:
        con.execute("INSERT INTO results (run_id, report_json, result_sha256) VALUES (?, ?, ?)",
                    (run_id, report_json, digest))

    # ------------------------------------------------------------- reading
    def list(self, *, metric: str | None = None, dataset: str | None = None, since: str | None = None,
             until: str | None = None, limit: int | None = None) -> list[RunRecord]:
        """Finished runs, newest (by start) first, without their results. `since`, `until`:
        a date (YYYY-MM-DD, until: the whole day) or an ISO date and time, UTC unless
        the text says otherwise; `limit` at most MAX_LIMIT (default DEFAULT_LIMIT)."""
        limit = DEFAULT_LIMIT if limit is None or limit == 0 else limit
        if not 1 <= limit <= MAX_LIMIT:
            raise InputError(f"must be between 1 and {MAX_LIMIT}", parameter="limit")
        where, values = [], []
        if metric:
            where.append("metric = ?")
            values.append(metric)
        if dataset:
            where.append("dataset = ?")
            values.append(dataset)
        if since:
            where.append("started_at >= ?")
            values.append(parse_time(since, parameter="since"))
        if until:
            where.append("started_at < ?")
            values.append(parse_time(until, parameter="until", end=True))
        sql = (f"SELECT {', '.join(_SUMMARY_COLUMNS)} FROM runs"
               f"{' WHERE ' + ' AND '.join(where) if where else ''}"
               " ORDER BY started_at DESC, rowid DESC LIMIT ?")
        with self._connect() as con:
            rows = con.execute(sql, (*values, limit)).fetchall()
        return [RunRecord._from_row(row) for row in rows]

    def get(self, run_id: str) -> RunRecord:
        """One run with its result; RunNotFound naming the id if there is none."""
        with self._connect() as con:
            row = con.execute(f"SELECT {', '.join('r.' + c for c in _SUMMARY_COLUMNS)}, s.report_json, "
                              "s.result_sha256 FROM runs r JOIN results s ON s.run_id = r.run_id "
                              "WHERE r.run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(run_id)
        return RunRecord._from_row(row, row["report_json"], row["result_sha256"])

    def count(self) -> int:
        with self._connect() as con:
            return con.execute("SELECT count(*) FROM runs").fetchone()[0]


def local_history_path() -> Path:
    """Where `ppre audit --local` keeps its run history: the user's data directory
    ($XDG_DATA_HOME/ppre, else ~/.local/share/ppre), beside the privacy ledger."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ppre" / "history.sqlite"
