"""What both parties' session state machines share: phase checks, timings, progress.

A `PhaseClock` records wall time per named phase (reported with the result; it holds
no data). `expect_phase` checks that a step runs in a phase that allows it; which peer
message each phase accepts is `common.protocol.validation`'s table, and a message at the wrong
moment is a `PhaseError` (a ProtocolError: "right content, wrong time", where malformed
content is a plain ProtocolError). `chunk_ticks` is the checkpoint of a long step cut
into chunks: it reports each chunk done.
"""
from __future__ import annotations

import enum
import time
from typing import Callable

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


def expect_phase(current: enum.Enum, *allowed: enum.Enum) -> None:
    if current not in allowed:
        raise PhaseError(f"message not allowed in phase {current.value}")


def chunk_ticks(total: int, tick: Callable[[int, int], None]) -> Callable[[], None]:
    """A checkpoint for `Executor.run_chunks` over `total` chunks: calls `tick(done, total)`
    after each chunk (a session's progress report and its own checkpoint)."""
    done = 0

    def checkpoint() -> None:
        nonlocal done
        done += 1
        tick(done, total)
    return checkpoint
