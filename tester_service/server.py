"""The Tester's gRPC servicer: the operator's `RunAudit` and the peer stream it drives.

`RunAudit` reads the Tester's inputs for this one audit, opens a bidirectional stream
to the Test-Client and moves PeerMessages between it and a `TesterSession`, turning
the session's progress into AuditEvents. It streams progress, then exactly one result
or one error; the session (keys, tables) is closed however the audit ends, and the
service stays healthy for the next audit.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import grpc
import pandas as pd

from common import bootstrap as boot_defaults
from common import channels, paillier, wire
from common.errors import PPREError, ProtocolError
from common.report import DEFAULT_TAU
from proto import ppre_pb2 as pb
from proto import ppre_pb2_grpc as pb_grpc
from tester_service.inputs import read_probability_table
from tester_service.preparation import PreparationConfig, prepare, read_members, read_self_id
from tester_service.protocol import AuditSpec, PeerAborted, Phase, TesterSession

log = logging.getLogger("ppre.tester")

_DONE = object()
#: the Test-Client's one RPC (proto/ppre.proto, service ppre.v1.Client)
EXCHANGE_METHOD = "/ppre.v1.Client/Exchange"


@dataclass
class TesterConfig:
    client_address: str
    #: returns this audit's probability table (member_id + group columns), in memory only
    load_probabilities: Callable[[], pd.DataFrame]
    min_modulus_bits: int = paillier.MIN_MODULUS_BITS
    n_buckets: int = boot_defaults.DEFAULT_BUCKETS
    deadline_s: float = 3600.0
    sessions: list = field(default_factory=list)  # live sessions, for tests of teardown

    @classmethod
    def from_probability_file(cls, client_address: str, path: str | Path, **kw) -> "TesterConfig":
        """Issue 2's input: a prepared probability table, used as given."""
        return cls(client_address, lambda: read_probability_table(path), **kw)

    @classmethod
    def from_members(cls, client_address: str, members: str | Path, self_id: str | Path | None,
                     preparation: PreparationConfig, **kw) -> "TesterConfig":
        """SPEC section 2: BISG, privatised Self-ID and clipping, run inside each audit."""
        return cls(client_address, lambda: prepare_from_files(members, self_id, preparation), **kw)


def prepare_from_files(members: str | Path, self_id: str | Path | None,
                       preparation: PreparationConfig) -> pd.DataFrame:
    """Read the members (and Self-ID) files and prepare this audit's probabilities in
    memory; `prepare` validates both, once, naming the files in its errors."""
    member_frame = read_members(members, preparation.opt_out_column)
    survey = read_self_id(self_id) if self_id else None
    return prepare(member_frame, survey, preparation, labels=(str(members), str(self_id)))


def _error(code: str, message: str) -> pb.AuditEvent:
    return pb.AuditEvent(error=pb.AuditError(code=code, message=message))


class _Cancelled(Exception):
    """The operator's call ended (cancelled, deadline passed, disconnected) before the audit."""


class _AuditRun:
    """One audit on its own thread (the servicer only relays `events`).

    Running the session off the gRPC handler's thread lets progress reach the operator
    as each phase ends, not batched behind the next long step, and lets an operator who
    goes away stop the audit: `cancel()` (wired to the call's termination) cancels the
    peer stream, and the session's next progress report raises `_Cancelled`.
    """

    def __init__(self, config: TesterConfig, request: pb.AuditRequest) -> None:
        self.config = config
        self.request = request
        self.events: "queue.Queue" = queue.Queue()  # AuditEvents, then _DONE
        self._cancelled = threading.Event()
        self._lock = threading.Lock()
        self._responses = None  # the call to the Test-Client, once open
        self._t0 = time.perf_counter()

    def cancel(self) -> None:
        """Idempotent; also called when the operator's call ends normally."""
        self._cancelled.set()
        with self._lock:
            responses = self._responses
        if responses is not None:
            responses.cancel()

    def _check(self) -> None:
        if self._cancelled.is_set():
            raise _Cancelled()

    def _progress(self, phase: str, message: str) -> None:
        self._check()
        self.events.put(pb.AuditEvent(progress=pb.Progress(phase=phase, message=message,
                                                           elapsed_s=time.perf_counter() - self._t0)))

    def run(self) -> None:
        try:
            final = self._audit()
            if final is not None:
                self.events.put(final)
        finally:
            self.events.put(_DONE)

    def _audit(self) -> pb.AuditEvent | None:
        cfg, request = self.config, self.request
        session = None
        outgoing: "queue.Queue" = queue.Queue(maxsize=32)
        channel = None
        try:
            spec = AuditSpec(
                metric=request.metric, client_dataset=request.client_dataset,
                bootstrap=request.bootstrap or boot_defaults.DEFAULT_REPLICATES,
                confidence=request.confidence or boot_defaults.DEFAULT_CONFIDENCE,
                seed=request.seed if request.has_seed else None,
                result_recipient=request.result_recipient or "client",
                metric_option=request.metric_option, tau=request.tau or DEFAULT_TAU).validated()
            self._progress("inputs", "reading the Tester's inputs")
            probabilities = cfg.load_probabilities()
            session = TesterSession(spec, probabilities, min_modulus_bits=cfg.min_modulus_bits,
                                    n_buckets=cfg.n_buckets, progress=self._progress,
                                    checkpoint=self._check)
            del probabilities
            cfg.sessions.append(session)

            def requests():
                while True:
                    item = outgoing.get()
                    if item is _DONE:
                        return
                    yield item

            channel = channels.make_channel(cfg.client_address)
            # Replies are decoded by us (wire.parse_peer_message): a Test-Client that sends
            # garbage gets a protocol_error, not an opaque gRPC INTERNAL.
            exchange = channel.stream_stream(EXCHANGE_METHOD,
                                             request_serializer=pb.PeerMessage.SerializeToString,
                                             response_deserializer=None)
            for msg in session.start():
                outgoing.put(msg)
            with self._lock:
                self._check()
                self._responses = exchange(requests(), timeout=cfg.deadline_s)
            for data in self._responses:
                for msg in session.receive(wire.parse_peer_message(data)):
                    outgoing.put(msg)
                if session.phase is Phase.DONE:
                    break
            self._check()
            if session.result is None:
                return _error("protocol_error", f"the Test-Client ended the session in phase {session.phase.value}")
            return pb.AuditEvent(result=session.result.to_proto())
        except _Cancelled:
            log.warning("audit cancelled by the operator in phase %s",
                        session.phase.value if session is not None else "inputs")
            return None
        except PeerAborted as exc:
            return _error(exc.code, f"Test-Client: {exc}")
        except PPREError as exc:
            log.warning("audit failed: %s", type(exc).__name__)
            if session is not None:
                _put_nowait(outgoing, pb.PeerMessage(abort=pb.Abort(code=exc.code, message=str(exc))))
            return _error(exc.code, str(exc))
        except grpc.RpcError as exc:
            if self._cancelled.is_set():  # we cancelled the peer call because the operator left
                log.warning("audit cancelled by the operator")
                return None
            code = exc.code() if hasattr(exc, "code") else None
            return _error("unavailable" if code == grpc.StatusCode.UNAVAILABLE else "peer_error",
                          f"Test-Client at {cfg.client_address}: {code.name if code else 'error'}")
        except Exception:
            log.exception("internal error during an audit")
            return _error("internal", "internal error at the Tester")
        finally:
            _close_queue(outgoing)
            if session is not None:
                session.close()
                if session in cfg.sessions:
                    cfg.sessions.remove(session)
            with self._lock:
                responses, self._responses = self._responses, None
            if responses is not None:
                responses.cancel()
            if channel is not None:
                channel.close()


class TesterServicer(pb_grpc.TesterServicer):
    def __init__(self, config: TesterConfig) -> None:
        self.config = config

    def RunAudit(self, request: pb.AuditRequest, context):
        run = _AuditRun(self.config, request)
        context.add_callback(run.cancel)  # runs when the call ends, however it ends
        threading.Thread(target=run.run, name="ppre-audit", daemon=True).start()
        try:
            while (event := run.events.get()) is not _DONE:
                yield event
        finally:
            run.cancel()  # the operator stopped reading: stop the audit too


def _close_queue(q: queue.Queue) -> None:
    """End the request stream even when the queue is full (never leave its reader blocked)."""
    while True:
        try:
            q.put_nowait(_DONE)
            return
        except queue.Full:
            try:
                q.get_nowait()
            except queue.Empty:
                pass


def _put_nowait(q: queue.Queue, item) -> None:
    try:
        q.put_nowait(item)
    except queue.Full:
        pass


def serve(config: TesterConfig, port: int, host: str = "0.0.0.0") -> tuple[grpc.Server, int, TesterServicer]:
    server, bound, health_servicer = channels.make_server(port, host)
    servicer = TesterServicer(config)
    pb_grpc.add_TesterServicer_to_server(servicer, server)
    server.start()
    channels.set_serving(health_servicer, "ppre.v1.Tester")
    return server, bound, servicer


def run_audit(address: str, request: pb.AuditRequest, *, timeout: float | None = None,
              on_progress: Callable[[pb.Progress], None] | None = None) -> pb.AuditEvent:
    """Operator side: call RunAudit and return the final event (result or error)."""
    with channels.make_channel(address) as channel:
        stub = pb_grpc.TesterStub(channel)
        final = None
        for event in stub.RunAudit(request, timeout=timeout):
            kind = event.WhichOneof("event")
            if kind == "progress":
                if on_progress:
                    on_progress(event.progress)
            elif final is None:
                final = event
            else:
                raise ProtocolError("the Tester sent more than one final event")
        if final is None:
            raise ProtocolError("the Tester ended the audit without a result")
        return final

