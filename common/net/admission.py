"""Which sessions a service runs: its session limit and its shutdown (both servicers).

`SessionTable.admit(item)` adds a session or says why not (the service is shutting
down, or already runs `max_sessions`); `discard(item)` removes one and returns how
many are left; `drain()` refuses every new session from then on and returns the
running ones, so that the servicer can stop them; `wait_idle(s)` waits for them to be
torn down. No data, only the servicers' own per-session objects.
"""
from __future__ import annotations

import threading
import time
from typing import Generic, TypeVar

T = TypeVar("T")


class SessionTable(Generic[T]):
    def __init__(self, max_sessions: int, service: str) -> None:
        self.max_sessions = max_sessions
        self._service = service
        self._lock = threading.Lock()
        self._items: set[T] = set()
        self._draining = False

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._items)

    def admit(self, item: T) -> tuple[str, str] | None:
        """None when the session is admitted, else the refusal's (code, message)."""
        with self._lock:
            if self._draining:
                return "shutting_down", f"the {self._service} is shutting down"
            if len(self._items) >= self.max_sessions:
                return "resource_exhausted", (f"the {self._service} is running as many audits as its limit "
                                              f"allows (--max-sessions {self.max_sessions}); try again when "
                                              f"one has finished")
            self._items.add(item)
            return None

    def discard(self, item: T) -> int:
        with self._lock:
            self._items.discard(item)
            return len(self._items)

    def drain(self) -> list[T]:
        with self._lock:
            self._draining = True
            return list(self._items)

    def wait_idle(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while self.active and time.monotonic() < deadline:
            time.sleep(0.05)
