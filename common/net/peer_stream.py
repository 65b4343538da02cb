"""Moving PeerMessages between a gRPC stream and a session: heartbeats and peer deadlines.

Both parties' servicers use the same three pieces, so that on every link (design
§3, Tester ↔ Test-Client):

* no stream stays silent: `Outbox.messages()` is the iterator gRPC sends from; when
  the session has put nothing in it for `heartbeat_s`, it sends a `Heartbeat` carrying
  the party's current `ProgressState` (phase, rows done, rows in all — never data);
* a stalled peer (alive, TCP open, sending nothing) or a cut link ends the audit: an
  `Inbox` reads the peer's stream on its own thread, and `get()` raises
  `PeerTimeoutError` when nothing — not even a heartbeat — arrives for
  `peer_timeout_s`; `Outbox.put()` raises it when the peer has taken nothing for that
  long (gRPC's flow control stops sending, the small queue fills up);
* the tables are never buffered whole: both queues are small and bounded, so a fast
  sender waits for a slow receiver (backpressure in both directions).

Both `get()` and `put()` poll a `checkpoint()` every fraction of a second, which is how
an audit whose operator left, or a service that is shutting down, stops waiting.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator

from common.net.channels import LinkSettings
from common.errors import PeerTimeoutError
from common.protocol.validation import check_heartbeat
from common.protocol.wire import parse_peer_message
from proto import ppre_pb2 as pb

#: messages (≈1 MiB table chunks at most) buffered per direction
QUEUE_MESSAGES = 8
#: how often a blocked get/put wakes up to run its checkpoint
POLL_S = 0.25

Checkpoint = Callable[[], None]
_END = object()


class _Failed:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


class ProgressState:
    """A party's latest progress, shared by its session thread and its heartbeats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.phase, self.done, self.total = "", 0, 0

    def update(self, phase: str, done: int = 0, total: int = 0) -> None:
        with self._lock:
            self.phase, self.done, self.total = phase, done, total

    def heartbeat(self) -> pb.PeerMessage:
        with self._lock:
            return pb.PeerMessage(heartbeat=pb.Heartbeat(phase=self.phase, done=self.done, total=self.total))


class Outbox:
    """What a party sends: `put()` from the session's thread, `messages()` to gRPC."""

    def __init__(self, settings: LinkSettings, progress: ProgressState, peer: str) -> None:
        self._settings = settings
        self._progress = progress
        self._peer = peer
        self._queue: "queue.Queue" = queue.Queue(maxsize=QUEUE_MESSAGES)
        #: set by close(): `messages()` ends once the queue is empty
        self._closed = threading.Event()

    def put(self, message: pb.PeerMessage, checkpoint: Checkpoint | None = None) -> None:
        deadline = time.monotonic() + self._settings.peer_timeout_s
        while True:
            if checkpoint is not None:
                checkpoint()
            try:
                self._queue.put(message, timeout=POLL_S)
                return
            except queue.Full:
                if time.monotonic() >= deadline:
                    raise PeerTimeoutError(f"the {self._peer} took no message for "
                                           f"{self._settings.peer_timeout_s:g} s (peer timeout)") from None

    def put_nowait(self, message: pb.PeerMessage) -> None:
        """Best effort (an Abort on the way out): dropped if the peer is not reading."""
        try:
            self._queue.put_nowait(message)
        except queue.Full:
            pass

    def close(self) -> None:
        """End the stream after every message already put: `messages()` sends what is
        queued, then stops. Never blocks (a full queue is drained by gRPC's reader, or
        dropped with the call) and never drops a queued message: a session's last
        messages (the Test-Client's rows of a metric without HE, then its session ends)
        are still in the queue when its owner closes it."""
        self._closed.set()
        try:
            self._queue.put_nowait(_END)  # wakes a reader waiting on an empty queue
        except queue.Full:
            pass  # the reader is not waiting: it stops when the queue is empty

    def messages(self) -> Iterator[pb.PeerMessage]:
        while True:
            try:
                if self._closed.is_set():
                    item = self._queue.get_nowait()
                else:
                    item = self._queue.get(timeout=self._settings.heartbeat_s)
            except queue.Empty:
                if self._closed.is_set():
                    return
                yield self._progress.heartbeat()
                continue
            if item is _END:
                return
            yield item


class Inbox:
    """What a party receives: the peer's raw stream, read on a thread of its own."""

    def __init__(self, stream: Iterator[bytes], settings: LinkSettings, peer: str,
                 on_heartbeat: Callable[[pb.Heartbeat], None] | None = None) -> None:
        self._settings = settings
        self._peer = peer
        self._on_heartbeat = on_heartbeat
        self._queue: "queue.Queue" = queue.Queue(maxsize=QUEUE_MESSAGES)
        self._closed = threading.Event()
        #: set when the reader thread is done (the peer ended its stream, the call failed,
        #: or a message came after close()): a servicer that answered with an Abort waits
        #: for it before ending the call with an error status, so the peer reads the
        #: Abort first
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(stream,), name=f"ppre-inbox-{peer}",
                                        daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _read(self, stream: Iterator[bytes]) -> None:
        try:
            for data in stream:
                if not self._put(data):
                    return
            self._put(_END)
        except BaseException as exc:  # grpc.RpcError when the call fails; re-raised by get()
            self._put(_Failed(exc))
        finally:
            self.finished.set()

    def get(self, checkpoint: Checkpoint | None = None) -> pb.PeerMessage | None:
        """The peer's next message (heartbeats are consumed here), or None when the peer
        ended its stream. Raises ProtocolError for bytes that are no PeerMessage (or a
        malformed heartbeat: `common.protocol.validation.check_heartbeat`),
        PeerTimeoutError after `peer_timeout_s` of silence, and the call's own error."""
        timeout = self._settings.peer_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            if checkpoint is not None:
                checkpoint()
            try:
                item = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise PeerTimeoutError(f"the {self._peer} sent nothing for {timeout:g} s (peer timeout)") \
                        from None
                continue
            if item is _END:
                return None
            if isinstance(item, _Failed):
                raise item.exc
            message = parse_peer_message(item)
            if message.WhichOneof("body") == "heartbeat":
                check_heartbeat(message.heartbeat)
                if self._on_heartbeat is not None:
                    self._on_heartbeat(message.heartbeat)
                deadline = time.monotonic() + timeout
                continue
            return message

    def close(self) -> None:
        """Stop the reader (the owner cancels the call, which ends a blocked read)."""
        self._closed.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                return
