"""The Test-Client's gRPC servicer: moves PeerMessages to and from a `ClientSession`.

It enforces what the session cannot: the session limit (`--max-sessions`), the peer
timeout and heartbeats (`common.net.peer_stream`: a stalled Tester or a cut link ends the
session, and the Tester hears from a busy Test-Client at least every `heartbeat_s`), a
maximum session duration, shutdown (running sessions end with a "shutting down"
Abort), one clean Abort message for any error (never one in answer to the Tester's own
Abort), and `session.close()` however the stream ends. A call the Tester broke ends,
after that Abort, with a gRPC status: INVALID_ARGUMENT for malformed content
(`ProtocolError`), FAILED_PRECONDITION for a message at the wrong moment (`PhaseError`;
both from `common.protocol.validation`); every other ending keeps status OK.

Each call runs on three threads: gRPC's handler thread sends what the session's
`Outbox` holds (and heartbeats), an `Inbox` thread reads the Tester's stream, and a
worker thread runs the session — so the Test-Client keeps talking while it computes.
Logs name the session's phase, error class and dataset name, never data.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

import grpc

from client_service.datasets import DatasetRegistry
from client_service.protocol import ClientSession, Phase
from client_service.results import ResultStore
from common import logs
from common.net import channels
from common.protocol import validation
from common.execution import parallel
from common.crypto import paillier
from common.net import tls as tls_
from common.net.admission import SessionTable
from common.errors import InputError, PeerAborted, PPREError, ProtocolError, ShuttingDownError
from common.protocol.session import PhaseError
from common.execution.memory import release_freed_memory
from common.net.peer_stream import Inbox, Outbox, ProgressState
from proto import ppre_pb2 as pb

log = logging.getLogger("ppre.client")

#: how long a finished session waits for its last messages (an Abort) to leave
ABORT_FLUSH_S = 1.0
#: longest error text sent back (Abort message, status details): never a whole peer field
MAX_ERROR_CHARS = 1000


def status_for(exc: BaseException) -> grpc.StatusCode | None:
    """The status a call the Tester broke ends with (None: OK, the Abort says it all)."""
    if isinstance(exc, PeerAborted) or not isinstance(exc, ProtocolError):
        return None
    return grpc.StatusCode.FAILED_PRECONDITION if isinstance(exc, PhaseError) else grpc.StatusCode.INVALID_ARGUMENT


@dataclass
class ClientConfig:
    datasets: DatasetRegistry
    modulus_bits: int = paillier.MIN_MODULUS_BITS
    allow_insecure: bool = False
    #: longest session; stalls are caught much sooner by the peer timeout
    max_session_s: float = 6 * 3600.0
    #: keepalive, heartbeat interval and peer timeout (`--peer-timeout`)
    settings: channels.LinkSettings = field(default_factory=channels.LinkSettings.from_env)
    #: most sessions at once (`--max-sessions`); beyond it a Tester gets a resource_exhausted Abort
    max_sessions: int = 4
    #: most bytes one Tester may send in one session (common.protocol.validation)
    max_received_bytes: int = validation.DEFAULT_MAX_RECEIVED_BYTES
    #: mutual TLS (common.net.tls): this service's certificate, key and CA. None: plaintext,
    #: no identities (the CLI gets here only with --insecure)
    tls: tls_.TlsIdentity | None = None
    #: Tester identities allowed to open an Exchange (`--allow-tester`; TLS only)
    allowed_testers: tuple[str, ...] = (tls_.TESTER_IDENTITY,)
    #: where the sessions' per-row work runs (`--executor`; common.execution.parallel); None: inline
    executor: parallel.Executor | None = None
    #: finish audits whose aggregates carry no release noise (`--accept-noiseless`); by
    #: default they are refused, so a Tester cannot switch its controls off silently
    accept_noiseless: bool = False
    #: where finished results are kept (result recipient `client`, design §3.7): by audit
    #: id in memory and, with `--results-dir`, in files (`client_service.results`)
    results: ResultStore = field(default_factory=ResultStore)

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise InputError("must be at least 1", parameter="max sessions")
        self.allowed_testers = tls_.parse_names(self.allowed_testers)
        self.tester_allow_list  # an empty list is refused now, not at the first session

    @property
    def tester_allow_list(self) -> tls_.AllowList:
        return tls_.AllowList.of("Tester", self.allowed_testers, "--allow-tester")


class _CallEnded(Exception):
    """The call is over at the gRPC layer (the Tester cancelled or vanished, or the
    session's time ran out): nothing can be sent any more."""


class _Exchange:
    """One Tester's session: the worker thread's side."""

    def __init__(self, config: ClientConfig, context) -> None:
        self.config = config
        self.context = context
        self.state = ProgressState()
        self.outbox = Outbox(config.settings, self.state, "Tester")
        self.stop_error: BaseException | None = None
        self.handler_done = threading.Event()
        #: (code, details) the call ends with when the Tester broke the protocol
        self.status: tuple[grpc.StatusCode, str] | None = None
        self.inbox: Inbox | None = None
        #: the audit's correlation id, from the Tester's Hello (common.logs); one log line per phase
        self.audit_id: str | None = None
        self.phases = logs.PhaseLog(log)
        self.session = ClientSession(config.datasets.load, modulus_bits=config.modulus_bits,
                                     allow_insecure=config.allow_insecure, checkpoint=self.checkpoint,
                                     progress=self.progress, max_received_bytes=config.max_received_bytes,
                                     executor=config.executor, accept_noiseless=config.accept_noiseless,
                                     deliver=config.results.keep)
        self.phases.watch(self.session.phase_seconds)  # one log line per lap of its PhaseClock

    def progress(self, phase: str, done: int = 0, total: int = 0) -> None:
        """The session's progress: into our heartbeats, and a log line as each phase ends."""
        self.phases.update(phase, done, total)
        self.state.update(phase, done, total)

    def _bind(self, msg: pb.PeerMessage) -> None:
        """On the Tester's Hello: this thread's log lines carry the audit's id from now on
        (only an id `common.protocol.validation` will accept: the Hello's check refuses the others)."""
        if self.audit_id is None and msg.WhichOneof("body") == "hello" and logs.valid_audit_id(msg.hello.audit_id):
            self.audit_id = self.phases.audit_id = msg.hello.audit_id
            logs.bind_audit_id(self.audit_id)

    def stop(self, error: BaseException) -> None:
        self.stop_error = error

    def checkpoint(self) -> None:
        if self.stop_error is not None:
            raise self.stop_error
        if not self.context.is_active():  # the Tester cancelled, or the deadline passed
            raise _CallEnded()

    def run(self, request_iterator) -> None:
        session, outbox = self.session, self.outbox
        inbox = self.inbox = Inbox(request_iterator, self.config.settings, "Tester")
        outcome = "ended_by_tester"
        try:
            while True:
                self.state.update("")  # idle: heartbeats keep the link alive, carry no news
                msg = inbox.get(self.checkpoint)
                if msg is None:
                    log.warning("session ended by the Tester in phase %s", session.phase.value)
                    return
                self._bind(msg)
                log.debug("received %s in phase %s", msg.WhichOneof("body"), session.phase.value)  # kinds only
                for out in session.receive(msg):
                    outbox.put(out, self.checkpoint)
                if msg.WhichOneof("body") == "hello":  # accepted (common.protocol.validation): its fields are sane
                    log.info("audit session opened (metric %s, dataset %r)", msg.hello.metric, session.dataset,
                             extra=logs.audit_extra(event="session_opened", metric=msg.hello.metric,
                                                    dataset=session.dataset, buckets=msg.hello.buckets))
                if session.phase is Phase.DONE:
                    outcome = "result"
                    log.info("audit session on dataset %r finished", session.dataset)
                    if session.result is not None:  # result recipient client: ours alone (design §3.7)
                        where = self.config.results.path(self.audit_id)
                        log.info("result kept: %s", where if where is not None else "in memory only")
                    return
        except (_CallEnded, grpc.RpcError):
            # The call is already over: nothing can be sent, and yielding into a dead call
            # can wedge the server's shutdown, so just clean up.
            outcome = "call_ended"
            log.warning("call ended by gRPC in phase %s", session.phase.value)
        except PeerAborted as exc:  # the Tester's own Abort is not answered
            outcome = f"aborted_by_tester:{exc.code}"
            log.warning("session aborted by the Tester in phase %s (%s)", session.phase.value, exc.code)
        except PPREError as exc:
            outcome = exc.code
            log.warning("session aborted in phase %s: %s", session.phase.value, type(exc).__name__)
            message = str(exc)[:MAX_ERROR_CHARS]
            outbox.put_nowait(pb.PeerMessage(abort=pb.Abort(code=exc.code, message=message)))
            code = status_for(exc)
            if code is not None:
                self.status = (code, message)
        except Exception:  # never crash the server; never echo internals to the peer
            outcome = "internal"
            log.exception("internal error in phase %s", session.phase.value)
            outbox.put_nowait(pb.PeerMessage(abort=pb.Abort(code="internal",
                                                            message="internal error at the Test-Client")))
        finally:
            self.phases.finish()
            seconds = dict(session.phase_seconds)
            session.close()
            inbox.close()
            outbox.close()
            log.info("audit session finished: %s", outcome,
                     extra=logs.audit_extra(event="session_finished", outcome=outcome,
                                            phase_seconds=logs.seconds(seconds)))


class ClientServicer:
    def __init__(self, config: ClientConfig, health_servicer=None) -> None:
        self.config = config
        self._health = health_servicer
        self._exchanges: SessionTable[_Exchange] = SessionTable(config.max_sessions, "Test-Client")

    @property
    def active_sessions(self) -> int:
        return self._exchanges.active

    def Exchange(self, request_iterator, context):
        cfg = self.config
        exchange = _Exchange(cfg, context)
        refusal = self._exchanges.admit(exchange)
        if refusal is not None:
            code, message = refusal
            log.warning("session refused: %s", message)
            exchange.session.close()
            yield pb.PeerMessage(abort=pb.Abort(code=code, message=message))
            return
        log.info("session started; active sessions: %d", self._exchanges.active)
        timer = threading.Timer(cfg.max_session_s, context.cancel)
        timer.daemon = True
        timer.start()
        worker = threading.Thread(target=self._work, args=(exchange, request_iterator), name="ppre-session",
                                  daemon=True)
        worker.start()
        try:
            yield from exchange.outbox.messages()
            if exchange.status is not None:
                # the Abort is on its way: once the Tester has read it (and ended its
                # stream), or after ABORT_FLUSH_S, end the call with the matching status
                if exchange.inbox is not None:
                    exchange.inbox.finished.wait(ABORT_FLUSH_S)
                context.set_code(exchange.status[0])
                context.set_details(exchange.status[1])
        finally:
            timer.cancel()
            exchange.handler_done.set()
            exchange.stop(_CallEnded())  # the call is over: the worker stops at its next checkpoint

    def _work(self, exchange: _Exchange, request_iterator) -> None:
        with logs.audit_context(None):  # bound to the audit's id once its Hello arrives
            self._work_in_context(exchange, request_iterator)

    def _work_in_context(self, exchange: _Exchange, request_iterator) -> None:
        try:
            exchange.run(request_iterator)
        finally:
            active = self._exchanges.discard(exchange)
            release_freed_memory()
            log.info("session closed; active sessions: %d", active)
            # A Tester that stopped reading leaves gRPC's handler thread blocked in a send:
            # once a last Abort has had its chance to leave, end the call.
            finished = exchange.session.phase is Phase.DONE
            flush_s = self.config.settings.peer_timeout_s if finished else ABORT_FLUSH_S
            if not exchange.handler_done.wait(flush_s):
                exchange.context.cancel()

    def shutdown(self, wait_s: float) -> None:
        """SIGTERM: report NOT_SERVING, refuse new sessions, end running ones with a
        "shutting down" Abort to the Tester, and wait up to `wait_s` for their teardown."""
        exchanges = self._exchanges.drain()
        if self._health is not None:
            channels.set_not_serving(self._health, "ppre.v1.Client")
        for exchange in exchanges:
            exchange.stop(ShuttingDownError("the Test-Client is shutting down"))
        self._exchanges.wait_idle(wait_s)


def serve(config: ClientConfig, port: int, host: str = "127.0.0.1",
          interceptors: tuple = ()) -> tuple[grpc.Server, int, ClientServicer]:
    # With TLS, an identity check runs before `interceptors` and before Exchange: a Tester
    # that is not on the allow-list is refused (PERMISSION_DENIED) before any message.
    server, bound, health_servicer = channels.make_server(port, host, workers=channels.handler_workers(config.max_sessions),
                                                          interceptors=interceptors, settings=config.settings,
                                                          tls=config.tls,
                                                          access={"/ppre.v1.Client/": config.tester_allow_list})
    servicer = ClientServicer(config, health_servicer)
    # Requests arrive as raw bytes and are decoded by the session's Inbox (wire.parse_peer_message),
    # so a peer's garbage gets a clean protocol_error Abort rather than a failed call.
    exchange = grpc.stream_stream_rpc_method_handler(
        servicer.Exchange, request_deserializer=None,
        response_serializer=pb.PeerMessage.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("ppre.v1.Client",
                                                                          {"Exchange": exchange}),))
    server.start()
    channels.set_serving(health_servicer, "ppre.v1.Client")
    return server, bound, servicer
