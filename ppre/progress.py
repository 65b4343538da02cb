"""`ppre audit`'s live progress on stderr.

The Tester streams `Progress` events (phase, message, elapsed_s, done, total; the
Test-Client's phases relayed as "client:PHASE"). On a terminal they are drawn as one
live line per phase, in the operator's words (preparation, upload, PSI, encryption,
join, aggregation, bootstrap, decryption), with a bar, the rate and an ETA when the
phase has a total; each finished phase leaves one summary line. Elsewhere (a pipe, a
file, TERM=dumb) every event is one plain line, `[  12.34s] PHASE: message`, as
scripts and tests parse it. Either way the audit's correlation id (the one both
services' log lines carry) is printed once, as `audit id: ID`.

The drawing is pure: `ProgressState.update(event)` folds events into a state,
`render_line(state, width)` and `summary_line(phase)` turn it into text; the
`TerminalProgress` / `PlainProgress` writers only move the cursor.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys
from typing import Protocol, TextIO

#: the Tester's and the Test-Client's phase names, in the operator's words
PHASE_LABELS = {
    "inputs": "preparation",
    "handshake": "preparation",
    "client:load_dataset": "preparation",
    "client:keygen": "preparation",
    "psi_upload": "upload",
    "client:double_encrypt": "PSI",
    "client:shuffle": "PSI",
    "psi_shuffled": "PSI",
    "client:he_encrypt": "encryption",
    "join": "join",
    "aggregation": "aggregation",
    "bootstrap": "bootstrap",
    "client:decrypt": "decryption",
    "done": "done",
}
#: what a phase counts: rows of a table, else chunks of work
ROW_PHASES = frozenset({"psi_upload", "psi_shuffled", "join", "client:double_encrypt", "client:he_encrypt"})
LABEL_WIDTH = 11
BAR_WIDTH = 24


class Event(Protocol):  # proto.ppre_pb2.Progress, or anything with these fields
    phase: str
    message: str
    elapsed_s: float
    done: int
    total: int


def label(phase: str) -> str:
    if phase in PHASE_LABELS:
        return PHASE_LABELS[phase]
    return f"Test-Client {phase[7:]}" if phase.startswith("client:") else phase


def unit(phase: str) -> str:
    return "rows" if phase in ROW_PHASES else "items"


@dataclasses.dataclass
class PhaseState:
    """One displayed phase (consecutive events with the same label)."""

    label: str
    phase: str              # the raw phase of its latest event
    started_s: float        # the audit's elapsed time at its first event
    elapsed_s: float        # ... at its latest event
    done: int = 0
    total: int = 0
    message: str = ""
    #: where the rate is measured from: the first event of the current raw phase
    base_s: float = 0.0
    base_done: int = 0

    @property
    def seconds(self) -> float:
        return max(0.0, self.elapsed_s - self.started_s)

    @property
    def rate(self) -> float | None:
        """Rows (or items) per second in the current raw phase; None before there is one."""
        span = self.elapsed_s - self.base_s
        moved = self.done - self.base_done
        if span <= 0 or moved <= 0:
            return None
        return moved / span

    @property
    def fraction(self) -> float | None:
        if not self.total:
            return None
        return min(1.0, max(0.0, self.done / self.total))

    @property
    def eta_s(self) -> float | None:
        rate = self.rate
        if not self.total or rate is None or self.done >= self.total:
            return None
        return (self.total - self.done) / rate


@dataclasses.dataclass
class ProgressState:
    """Everything the operator has heard so far."""

    audit_id: str = ""
    current: PhaseState | None = None
    finished: list[PhaseState] = dataclasses.field(default_factory=list)

    def update(self, event: Event) -> PhaseState | None:
        """Fold one event in; returns the phase it ended (now in `finished`), if any.

        A counted phase reports as its rows go through, so it ends at its last event and
        the next phase starts there (its first event counts what was done since); a
        phase without counts is announced as it starts, so it lasts until the next
        phase's first event, and that phase's rate is measured from then on."""
        audit_id = getattr(event, "audit_id", "")
        if audit_id and not self.audit_id:
            self.audit_id = audit_id
        name = label(event.phase)
        now = event.elapsed_s
        ended = None
        current = self.current
        new_count = current is None or current.phase != event.phase or bool(event.done or event.total)
        if current is None or current.label != name:
            since, base_done = now, event.done
            if current is not None:
                if current.total or current.done:
                    since, base_done = min(current.elapsed_s, now), 0
                else:
                    current.elapsed_s = max(current.elapsed_s, now)
                self.finished.append(current)
                ended = current
            current = self.current = PhaseState(name, event.phase, since, now, base_s=since, base_done=base_done)
        elif current.phase == event.phase and not event.done and not event.total:
            pass  # a counted phase's closing note ("6000 rows matched"): its counts stay
        elif current.phase != event.phase or event.done < current.done:  # a new count starts
            if current.total or current.done:
                current.base_s, current.base_done = min(current.elapsed_s, now), 0
            else:
                current.base_s, current.base_done = now, event.done
        current.elapsed_s = max(current.elapsed_s, now)
        if new_count:
            current.done, current.total = event.done, event.total
        current.phase = event.phase
        if event.message:
            current.message = event.message
        return ended

    def close(self) -> PhaseState | None:
        current, self.current = self.current, None
        if current is not None:
            self.finished.append(current)
        return current


# ------------------------------------------------------------------ text
def duration(seconds: float) -> str:
    """0:07, 3:25, 1:02:03."""
    seconds = int(round(max(0.0, seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def count(n: float) -> str:
    return f"{n:,.0f}"


def bar(fraction: float, width: int = BAR_WIDTH, ascii_only: bool = False) -> str:
    full, empty = ("#", "-") if ascii_only else ("\u2588", "\u2591")
    filled = int(round(fraction * width))
    return full * filled + empty * (width - filled)


def _fit(text: str, width: int) -> str:
    if width <= 0 or len(text) <= width:
        return text
    return text[:max(0, width - 1)] + ("\u2026" if width > 1 else "")


def render_line(phase: PhaseState, width: int = 100, *, ascii_only: bool = False) -> str:
    """The live line of the running phase: label, bar, percentage, counts, rate, ETA
    and the phase's time when it has a total; its message otherwise."""
    head = f"{phase.label:<{LABEL_WIDTH}}"
    clock = f"({phase.seconds:.1f}s)"
    fraction = phase.fraction
    if fraction is None:
        detail = phase.message or (f"{count(phase.done)} {unit(phase.phase)} so far" if phase.done else "")
        return _fit(f"{head} {detail}  {clock}" if detail else f"{head} {clock}", width)
    parts = [f"[{bar(fraction, ascii_only=ascii_only)}]", f"{fraction * 100:3.0f}%",
             f"{count(phase.done)}/{count(phase.total)} {unit(phase.phase)}"]
    rate = phase.rate
    if rate is not None:
        parts.append(f"{count(rate)} {unit(phase.phase)}/s")
    eta = phase.eta_s
    if eta is not None:
        parts.append(f"ETA {duration(eta)}")
    parts.append(clock)
    return _fit(f"{head} " + "  ".join(parts), width)


def summary_line(phase: PhaseState, *, ascii_only: bool = False) -> str:
    """What a finished phase leaves behind: its time, and its count and rate when it had one."""
    mark = "ok" if ascii_only else "\u2713"
    text = f"{mark} {phase.label:<{LABEL_WIDTH}} {phase.seconds:6.1f}s"
    if phase.total and phase.done < phase.total:  # stopped short (cancelled, failed)
        text += f"  {count(phase.done)}/{count(phase.total)} {unit(phase.phase)}"
    elif phase.total or phase.done:
        text += f"  {count(phase.total or phase.done)} {unit(phase.phase)}"
    rate = phase.rate
    if rate is not None:
        text += f"  {count(rate)} {unit(phase.phase)}/s"
    return text


def plain_line(event: Event) -> str:
    """Today's non-terminal format (tests/processes.py parses it)."""
    return f"[{event.elapsed_s:7.2f}s] {event.phase}: {event.message}"


# ------------------------------------------------------------------ writers
class PlainProgress:
    """One line per event; the audit id once, when first heard (``show_id``). An event
    that says nothing new prints no second line: the Tester's heartbeat repeats its
    latest progress while a phase is silent (the Test-Client's key generation, a slow
    upload), also after other news was printed (a Test-Client phase relayed in between),
    so every (phase, message, counts) is printed once. ``line``: the event as text
    (`plain_line`; `ppre demo` indents it)."""

    def __init__(self, stream: TextIO, *, line=None, show_id: bool = True) -> None:
        self.stream = stream
        self.state = ProgressState()
        self.line = line or plain_line
        self.show_id = show_id
        self._printed: set[tuple] = set()

    def __call__(self, event: Event) -> None:
        had_id = bool(self.state.audit_id)
        self.state.update(event)
        if self.show_id and self.state.audit_id and not had_id:
            print(f"audit id: {self.state.audit_id}", file=self.stream, flush=True)
        news = (event.phase, event.message, event.done, event.total)
        if news in self._printed:
            return
        self._printed.add(news)
        print(self.line(event), file=self.stream, flush=True)

    def close(self) -> None:
        self.state.close()


class QuietProgress(PlainProgress):
    """`--json`: nothing but the audit id, once (stderr; stdout stays one JSON object)."""

    def __call__(self, event: Event) -> None:
        had_id = bool(self.state.audit_id)
        self.state.update(event)
        if self.state.audit_id and not had_id:
            print(f"audit id: {self.state.audit_id}", file=self.stream, flush=True)


class TerminalProgress:
    """The live view: the running phase redrawn in place (carriage return, erase line),
    a summary line for each phase as it ends."""

    CLEAR = "\r\x1b[2K"

    def __init__(self, stream: TextIO, width: int | None = None) -> None:
        self.stream = stream
        self.state = ProgressState()
        self._width = width
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        self.ascii_only = encoding not in ("utf8", "utf_8")
        self._live = False

    @property
    def width(self) -> int:
        if self._width is not None:
            return self._width
        try:
            return os.get_terminal_size(self.stream.fileno()).columns - 1
        except (OSError, AttributeError, ValueError):
            return shutil.get_terminal_size((100, 24)).columns - 1

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal: progress is not worth failing for
            pass

    def __call__(self, event: Event) -> None:
        had_id = bool(self.state.audit_id)
        ended = self.state.update(event)
        out = []
        if self.state.audit_id and not had_id:
            out.append(f"{self.CLEAR}audit id: {self.state.audit_id}\n")
        if ended is not None:
            out.append(f"{self.CLEAR}{summary_line(ended, ascii_only=self.ascii_only)}\n")
        if self.state.current is not None:
            out.append(self.CLEAR + render_line(self.state.current, self.width, ascii_only=self.ascii_only))
            self._live = True
        self._write("".join(out))

    def close(self) -> None:
        """End the live line: the last phase's summary (a finished audit's is "done")."""
        ended = self.state.close()
        if ended is not None and ended.label != "done":
            self._write(f"{self.CLEAR}{summary_line(ended, ascii_only=self.ascii_only)}\n")
        elif self._live:
            self._write(self.CLEAR)
        self._live = False


def is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty()) and os.environ.get("TERM", "") != "dumb"
    except (AttributeError, ValueError):
        return False


def for_stream(stream: TextIO | None = None, *, as_json: bool = False):
    """The progress writer `ppre audit` uses: quiet with --json, live on a terminal,
    plain lines elsewhere."""
    stream = stream if stream is not None else sys.stderr
    if as_json:
        return QuietProgress(stream)
    return TerminalProgress(stream) if is_terminal(stream) else PlainProgress(stream)
