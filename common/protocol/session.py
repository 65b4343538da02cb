"""What both parties' session state machines share: timings, progress, the base class.

A `PhaseClock` records wall time per named phase (reported with the result; it holds
no data). Which message each phase accepts, and where it leads, is the party's table of
transitions (`common.protocol.transitions`); a message at the wrong moment is a
`PhaseError` (a ProtocolError: "right content, wrong time", where malformed content is a
plain ProtocolError). `chunk_ticks` is the checkpoint of a long step cut into chunks: it
reports each chunk done. `PartySession` is what the Tester's and the Test-Client's
sessions share: their clock, progress ticks, the gate every received message passes
(`common.protocol.validation`), and `close`.
"""
from __future__ import annotations

import enum
import time
from typing import Callable, Iterable

from common.errors import ProtocolError


class PhaseClock:
    def __init__(self) -> None:
        self.start = self._mark = time.perf_counter()
        self.seconds: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._mark
        self._mark = now

    def total(self) -> float:
        return time.perf_counter() - self.start


class PhaseError(ProtocolError):
    """A message the protocol has, at a moment it does not allow it: in the wrong phase,
    out of order, or after the session failed (the Test-Client's servicer ends such a
    call with FAILED_PRECONDITION; malformed content is INVALID_ARGUMENT)."""


def chunk_ticks(total: int, tick: Callable[[int, int], None]) -> Callable[[], None]:
    """A checkpoint for `Executor.run_chunks` over `total` chunks: calls `tick(done, total)`
    after each chunk (a session's progress report and its own checkpoint)."""
    done = 0

    def checkpoint() -> None:
        nonlocal done
        done += 1
        tick(done, total)
    return checkpoint


class PartySession:
    """The shared part of both parties' sans-I/O sessions (design §3): each has a phase
    (`phase`) that only its table of transitions (`transitions`,
    `common.protocol.transitions`) moves, a `PhaseClock` (`_clock`, its laps are
    `phase_seconds`), an optional checkpoint run between chunks of its long steps
    (`_checkpoint`), and the gate of `common.protocol.validation` that every message from
    its peer passes (`_inbound`), which hands it on through the table. A subclass says
    how a progress tick reaches its owner (`_report_rows`) and what its `close` drops
    (`_drop_secrets`)."""

    transitions: "common.protocol.transitions.Transitions"  # (both import this module)
    phase: enum.Enum
    _clock: PhaseClock
    _checkpoint: Callable[[], None] | None
    _inbound: "common.protocol.validation.Gate"

    def _lap(self, name: str) -> None:
        self._clock.lap(name)

    def _tick(self, phase: str, done: int, total: int, message: str = "") -> None:
        """Progress within a long step (`done` of `total`), then the checkpoint."""
        self._report_rows(phase, done, total, message)
        if self._checkpoint is not None:
            self._checkpoint()

    def _report_rows(self, phase: str, done: int, total: int, message: str) -> None:
        raise NotImplementedError

    def receive(self, msg) -> Iterable:
        """Consume one message from the peer; returns the messages to send back. The gate
        (`common.protocol.validation`) checks it (phase, order, content) before its handler
        runs; a session that failed refuses every later message."""
        return self._inbound.receive(self, msg)

    @property
    def failed(self) -> bool:
        return self._inbound.failed

    def close(self) -> None:
        """Drop every key and all member-level data, however the session ended."""
        self._drop_secrets()
        self.transitions.close(self)

    def _drop_secrets(self) -> None:
        raise NotImplementedError
