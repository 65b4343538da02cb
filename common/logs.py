"""The services' log lines: text or JSON, each carrying its audit's correlation id.

`configure(fmt, service)` sets the format of every handler on the root logger (the
one `ppre -v` installs on stderr): `text` (the default: `TIME LOGGER LEVEL message`,
then `[audit ID key=value ...]` when the line has them) or `json` (one object per line:
`time, level, service, logger, audit_id, event, message` and, when the line has them,
`fields` and `exception`). Both keep a traceback's frames but withhold the message of
an exception that is not one of ours (`common.errors.PPREError`): a library's error (a
pandas KeyError, say) could carry a member id; ours name files, rows and parameters only.

The audit id: the Tester draws one per audit (`new_audit_id`), sends it to the
Test-Client in its Hello (checked there: `valid_audit_id`, else a protocol error) and
returns it to the operator in every Progress event. A thread bound to an audit
(`audit_context`) stamps it on every line it logs; a line logged elsewhere for that
audit passes it explicitly (`extra=audit_extra(id, event, **fields)`).

Fields are counts, sizes, durations, names: never member-level data and never key
material (tests/test_progress_logs.py greps DEBUG-level JSON logs for both).
"""
from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import math
import re
import secrets
import threading
import traceback
from typing import Any, Iterator

LOG_FORMATS = ("text", "json")
#: what `--log-format` defaults to, and the variable that changes the default
LOG_FORMAT_ENV = "PPRE_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
#: an audit id: short and URL-safe (it goes into log lines, file names, URLs)
AUDIT_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
AUDIT_ID_BYTES = 12  # 16 characters of base64url, 96 random bits

_audit_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("ppre_audit_id", default=None)


def new_audit_id() -> str:
    return secrets.token_urlsafe(AUDIT_ID_BYTES)


def valid_audit_id(value: str) -> bool:
    return bool(AUDIT_ID_RE.fullmatch(value or ""))


def current_audit_id() -> str | None:
    return _audit_id.get()


@contextlib.contextmanager
def audit_context(audit_id: str | None) -> Iterator[None]:
    """Within it, every line this thread logs carries `audit_id` (threads it starts do
    not inherit it: each thread of an audit binds it itself)."""
    token = _audit_id.set(audit_id or None)
    try:
        yield
    finally:
        _audit_id.reset(token)


def bind_audit_id(audit_id: str | None) -> None:
    """Bind `audit_id` to the calling thread for the rest of its life (a thread that
    serves one audit only, and learns its id midway: the Test-Client's session worker)."""
    _audit_id.set(audit_id or None)


def seconds(value: float | dict[str, float]) -> float | dict[str, float]:
    """Durations for a log line, to the millisecond (a PhaseClock's dict too)."""
    if isinstance(value, dict):
        return {k: round(float(v), 3) for k, v in value.items()}
    return round(float(value), 3)


def audit_extra(audit_id: str | None = None, event: str | None = None, **fields: Any) -> dict:
    """`extra=` for a log call: the audit id (default: the thread's), an event name, fields."""
    extra: dict[str, Any] = {}
    if audit_id:
        extra["audit_id"] = audit_id
    if event:
        extra["event"] = event
    fields = {k: v for k, v in fields.items() if v is not None}
    if fields:
        extra["fields"] = fields
    return extra


# ------------------------------------------------------------------ formatters
def service_of(record: logging.LogRecord, default: str) -> str:
    """The service a line comes from: its logger's (ppre.tester / tester_service.*,
    ppre.client / client_service.*), else the process's (`ppre audit --local` runs both)."""
    name = record.name
    for prefix, service in (("ppre.tester", "tester"), ("tester_service", "tester"),
                            ("ppre.client", "client"), ("client_service", "client")):
        if name == prefix or name.startswith(prefix + "."):
            return service
    return default


def withheld_exception(ei) -> str:
    """A traceback's frames, with the message of an exception that is not ours withheld."""
    from common.errors import PPREError

    exc_type, exc, tb = ei
    frames = "".join(traceback.format_tb(tb))
    said = f": {exc}" if isinstance(exc, PPREError) else " (message withheld: it may hold data)"
    return f"Traceback (most recent call last):\n{frames}{exc_type.__name__}{said}"


def _audit_id_of(record: logging.LogRecord) -> str | None:
    value = getattr(record, "audit_id", None)
    return value if value else None


def _plain(value: Any) -> Any:
    """A field as JSON can hold it (non-finite floats as text, anything else via str)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


class AuditFilter(logging.Filter):
    """Stamps the emitting thread's audit id on a record that has none (runs in the
    thread that logs, where `audit_context` bound it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "audit_id", None):
            record.audit_id = _audit_id.get()
        return True


class TextFormatter(logging.Formatter):
    """`TIME LOGGER LEVEL message [audit ID key=value ...]`."""

    def __init__(self, fmt: str = TEXT_FORMAT, datefmt: str | None = None) -> None:
        super().__init__(fmt, datefmt)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        tail = []
        audit_id = _audit_id_of(record) or _audit_id.get()
        if audit_id:
            tail.append(f"audit {audit_id}")
        for key, value in (getattr(record, "fields", None) or {}).items():
            value = _plain(value)
            text_value = json.dumps(value, separators=(",", ":")) if isinstance(value, (dict, list)) else value
            tail.append(f"{key}={text_value}")
        if not tail:
            return text
        head, sep, rest = text.partition("\n")  # before a traceback
        return f"{head} [{' '.join(tail)}]{sep}{rest}"

    def formatException(self, ei) -> str:
        return withheld_exception(ei)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601, ms), level, service, logger,
    audit_id (null outside an audit), event (the line's event name, else its message
    template: stable across lines of one kind), message, and `fields`, `exception`
    when the line has them."""

    def __init__(self, service: str = "") -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.datetime.fromtimestamp(record.created, tz=datetime.timezone.utc)
        obj: dict[str, Any] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "service": service_of(record, self.service),
            "logger": record.name,
            "audit_id": _audit_id_of(record) or _audit_id.get(),
            "event": getattr(record, "event", None) or str(record.msg),
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            obj["fields"] = _plain(dict(fields))
        if record.exc_info:
            obj["exception"] = withheld_exception(record.exc_info)
        elif record.exc_text:
            obj["exception"] = record.exc_text
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def formatter(fmt: str, service: str = "") -> logging.Formatter:
    from common.errors import InputError

    fmt = (fmt or "text").strip().lower()
    if fmt not in LOG_FORMATS:
        raise InputError(f"must be one of {', '.join(LOG_FORMATS)}, got '{fmt}'", parameter="--log-format")
    return JsonFormatter(service) if fmt == "json" else TextFormatter()


def configure(fmt: str, service: str = "", logger: logging.Logger | None = None) -> None:
    """Give every handler of `logger` (default: the root logger, as `ppre` set it up)
    the format `fmt` ("text" or "json") and the audit-id filter."""
    form = formatter(fmt, service)
    target = logger if logger is not None else logging.getLogger()
    if not target.handlers:
        target.addHandler(logging.StreamHandler())
    for handler in target.handlers:
        handler.setFormatter(form)
        if not any(isinstance(f, AuditFilter) for f in handler.filters):
            handler.addFilter(AuditFilter())


# ------------------------------------------------------------------ one line per phase
class PhaseLog:
    """One INFO line per phase of a session, from its `PhaseClock` (`watch(session.
    phase_seconds)`, the clock's live dict): each lap the clock records is logged with
    its seconds and, when the session reported counts while it ran, the last of them
    (`done` of `total`: rows, or items for the chunked steps). Laps are picked up at
    the session's next progress report (`update`) and at its end (`finish`); reports
    and laps come from the session's own thread."""

    def __init__(self, logger: logging.Logger, audit_id: str | None = None) -> None:
        self._log = logger
        self.audit_id = audit_id
        self._lock = threading.Lock()
        self._seconds: dict[str, float] | None = None
        self._seen: dict[str, float] = {}
        self._counts: tuple[str, int, int] | None = None
        #: phases logged so far: [(phase, seconds, done, total)]
        self.phases: list[tuple[str, float, int, int]] = []

    def watch(self, seconds: dict[str, float]) -> None:
        with self._lock:
            self._seconds, self._seen = seconds, dict(seconds)

    def update(self, phase: str, done: int = 0, total: int = 0) -> None:
        with self._lock:
            self._flush()
            if phase and (done or total):
                self._counts = (phase, int(done), int(total))

    def finish(self) -> None:
        with self._lock:
            self._flush()
            self._seconds = None

    def _flush(self) -> None:
        if self._seconds is None:
            return
        for name, value in list(self._seconds.items()):
            seconds = value - self._seen.get(name, 0.0)
            if seconds <= 0:
                continue
            self._seen[name] = value
            fields: dict[str, Any] = {"phase": name, "seconds": round(seconds, 3)}  # ms: a duration, not data
            counted = ""
            if self._counts is not None:
                progress, done, total = self._counts
                fields.update(progress=progress, done=done, total=total)
                counted = f" ({progress}: {done} of {total})" if total else f" ({progress}: {done})"
                self._counts = None
            self.phases.append((name, seconds, int(fields.get("done", 0)), int(fields.get("total", 0))))
            self._log.info("phase %s took %.3f s%s", name, seconds, counted,
                           extra=audit_extra(self.audit_id, "phase", **fields))
