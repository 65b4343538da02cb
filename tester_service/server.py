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
from tester_service.preparation import PreparationConfig, load_members, load_self_id, prepare
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
    """Read the members (and Self-ID) files and prepare this audit's probabilities in memory."""
    member_frame = load_members(members, preparation.opt_out_column)
    survey = load_self_id(self_id, member_frame["member_id"]) if self_id else None
    return prepare(member_frame, survey, preparation)


def _error(code: str, message: str) -> pb.AuditEvent:
    return pb.AuditEvent(error=pb.AuditError(code=code, message=message))


class TesterServicer(pb_grpc.TesterServicer):
    def __init__(self, config: TesterConfig) -> None:
        self.config = config

    def RunAudit(self, request: pb.AuditRequest, context):
        cfg = self.config
        events: "queue.Queue[pb.AuditEvent]" = queue.Queue()
        t0 = time.perf_counter()

        def progress(phase: str, message: str) -> None:
            events.put(pb.AuditEvent(progress=pb.Progress(phase=phase, message=message,
                                                          elapsed_s=time.perf_counter() - t0)))

        def drain():
            while not events.empty():
                yield events.get_nowait()

        session = None
        outgoing: "queue.Queue" = queue.Queue(maxsize=32)
        responses = None
        channel = None
        try:
            spec = AuditSpec(
                metric=request.metric, client_dataset=request.client_dataset,
                bootstrap=request.bootstrap or boot_defaults.DEFAULT_REPLICATES,
                confidence=request.confidence or boot_defaults.DEFAULT_CONFIDENCE,
                seed=request.seed if request.has_seed else None,
                result_recipient=request.result_recipient or "client",
                metric_option=request.metric_option, tau=request.tau or DEFAULT_TAU).validated()
            progress("inputs", "reading the Tester's inputs")
            yield from drain()
            probabilities = cfg.load_probabilities()
            session = TesterSession(spec, probabilities, min_modulus_bits=cfg.min_modulus_bits,
                                    n_buckets=cfg.n_buckets, progress=progress)
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
            responses = exchange(requests(), timeout=cfg.deadline_s)
            yield from drain()
            for data in responses:
                for msg in session.receive(wire.parse_peer_message(data)):
                    outgoing.put(msg)
                    yield from drain()
                yield from drain()
                if session.phase is Phase.DONE:
                    break
            yield from drain()
            if session.result is None:
                yield _error("protocol_error", f"the Test-Client ended the session in phase {session.phase.value}")
                return
            yield pb.AuditEvent(result=session.result.to_proto())
        except PeerAborted as exc:
            yield from drain()
            yield _error(exc.code, f"Test-Client: {exc}")
        except PPREError as exc:
            yield from drain()
            log.warning("audit failed: %s", type(exc).__name__)
            if session is not None:
                _put_nowait(outgoing, pb.PeerMessage(abort=pb.Abort(code=exc.code, message=str(exc))))
            yield _error(exc.code, str(exc))
        except grpc.RpcError as exc:
            yield from drain()
            code = exc.code() if hasattr(exc, "code") else None
            yield _error("unavailable" if code == grpc.StatusCode.UNAVAILABLE else "peer_error",
                         f"Test-Client at {cfg.client_address}: {code.name if code else 'error'}")
        except Exception:
            log.exception("internal error during an audit")
            yield _error("internal", "internal error at the Tester")
        finally:
            _close_queue(outgoing)
            if session is not None:
                session.close()
                if session in cfg.sessions:
                    cfg.sessions.remove(session)
            if responses is not None:
                responses.cancel()
            if channel is not None:
                channel.close()


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

