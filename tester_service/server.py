"""The Tester's gRPC servicer: the operator's `RunAudit` and the peer stream it drives.

`RunAudit` reads the Tester's inputs for this one audit, opens a bidirectional stream
to the Test-Client and moves PeerMessages between it and a `TesterSession`, turning
the session's progress into AuditEvents. It streams progress, then exactly one result
or one error; the session (keys, tables) is closed however the audit ends, and the
service stays healthy for the next audit.
"""
from __future__ import annotations

import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import grpc
import pandas as pd

from common.stats import bootstrap as boot_defaults
from common.net import channels
from common.execution import parallel
from common.crypto import paillier
from common import logs
from common.net import tls as tls_
from common.protocol import validation
from common.net.admission import SessionTable
from common.errors import InputError, PeerAborted, PeerTimeoutError, PPREError, ShuttingDownError
from common.execution.memory import release_freed_memory
from common.net.peer_stream import Inbox, Outbox, ProgressState
from common.stats.results import DEFAULT_TAU
from proto import ppre_pb2 as pb
from proto import ppre_pb2_grpc as pb_grpc
from tester_service.audit_log import AuditLog, AuditLogError, result_digest
from tester_service.history import HistoryError, RunHistory, RunNotFound, utc_now
from tester_service.release import IntersectionRefused, PrivacyAccountant, ReleasePolicy
from tester_service.inputs import read_probability_table
from tester_service.demographics.preparation import PreparationConfig, prepare, read_members, read_self_id
from tester_service.protocol import AuditSpec, Phase, TesterSession

log = logging.getLogger("ppre.tester")
#: phases whose counts the Tester's heartbeats carry: its own table (whose size PSI discloses)
#: and the Test-Client's rows as they arrive
PEER_COUNTED_PHASES = frozenset({"psi_upload", "psi_shuffled", "join"})

_DONE = object()
#: the Test-Client's one RPC (proto/ppre.proto, service ppre.v1.Client)
EXCHANGE_METHOD = "/ppre.v1.Client/Exchange"
#: every RPC of the Tester's service is for allow-listed operators only
TESTER_METHODS = "/ppre.v1.Tester/"


#: the longest an audit may run, and the operator's default wait for one (`ppre audit --timeout`):
#: a 1,000,000-member POT or MQOS-AUC audit takes 1-2 h on two cores; stalls are caught much
#: sooner by the peer timeout (`channels.LinkSettings.peer_timeout_s`)
AUDIT_DEADLINE_S = 6 * 3600.0


#: the audit log's reason for an audit that ended after its intersection was answered
#: and before its ρ was charged, counted as a refused audit (`_AuditRun._count_refusal`)
UNPAID_ANSWER = "ended after its intersection was answered, before its rho was charged"


@dataclass
class TesterConfig:
    client_address: str
    #: returns this audit's probability table (member_id + group columns), in memory only
    load_probabilities: Callable[[], pd.DataFrame]
    min_modulus_bits: int = paillier.MIN_MODULUS_BITS
    n_buckets: int = boot_defaults.DEFAULT_BUCKETS
    #: keepalive, heartbeat interval and peer timeout (`--peer-timeout`)
    settings: channels.LinkSettings = field(default_factory=channels.LinkSettings.from_env)
    #: most audits at once (`--max-sessions`); beyond it RunAudit answers RESOURCE_EXHAUSTED
    max_sessions: int = 4
    #: longest audit; stalls are caught much sooner by the peer timeout
    deadline_s: float = AUDIT_DEADLINE_S
    sessions: list = field(default_factory=list)  # live sessions, for tests of teardown
    #: the hash-chained record of every audit request and its outcome (`--audit-log`)
    audit_log: AuditLog | None = None
    #: release controls (design §8): thresholds, noise, budget (`tester_service.release`)
    release: ReleasePolicy = field(default_factory=ReleasePolicy)
    #: ρ spent per Test-Client identity; None: an in-memory one over `release.budget`
    accountant: PrivacyAccountant | None = None
    #: the most a Test-Client may send in one session (common.protocol.validation)
    max_received_bytes: int = validation.DEFAULT_MAX_RECEIVED_BYTES
    #: mutual TLS on both links (common.net.tls): this service's certificate, key and CA.
    #: None: plaintext, no identities (the CLI gets here only with --insecure)
    tls: tls_.TlsIdentity | None = None
    #: operator identities allowed to call RunAudit (`--allow-operator`; TLS only)
    allowed_operators: tuple[str, ...] = (tls_.OPERATOR_IDENTITY,)
    #: the identity the Test-Client's certificate must carry (`--client-identity`; TLS only)
    client_name: str = tls_.CLIENT_IDENTITY
    #: where the sessions' per-row work runs (`--executor`; common.execution.parallel); None: inline
    executor: parallel.Executor | None = None
    #: the run history of finished audits, aggregates only (`--history`; tester_service.history):
    #: a path (opened, and its schema checked, now) or a RunHistory; None: no history
    history: RunHistory | str | Path | None = None

    def __post_init__(self) -> None:
        self.history = RunHistory.of(self.history)
        if self.max_sessions < 1:
            raise InputError("must be at least 1", parameter="max sessions")
        if self.accountant is None:
            self.accountant = PrivacyAccountant(self.release.budget)
        self.allowed_operators = tls_.parse_names(self.allowed_operators)
        self.operator_allow_list  # an empty list is refused now, not at the first audit
        if self.tls is not None and not self.client_name:
            raise InputError("must name the Test-Client's certificate identity", parameter="--client-identity")

    @property
    def operator_allow_list(self) -> tls_.AllowList:
        return tls_.AllowList.of("operator", self.allowed_operators, "--allow-operator")

    @property
    def client_identity(self) -> str:
        """Who the Test-Client is, for per-client accounting: the identity its certificate
        was checked for when TLS is on (the handshake fails otherwise), else its address."""
        return self.client_name if self.tls is not None else self.client_address

    @property
    def insecure(self) -> bool:
        return self.tls is None

    @classmethod
    def from_probability_file(cls, client_address: str, path: str | Path, mapping=None, columns=None,
                              **kw) -> "TesterConfig":
        """A prepared probability table, used as given (or coarsened by a group mapping);
        `columns`: the column mapping (`common.tables.parse_column_mapping`)."""
        return cls(client_address, lambda: read_probability_table(path, mapping, columns), **kw)

    @classmethod
    def from_members(cls, client_address: str, members: str | Path, self_id: str | Path | None,
                     preparation: PreparationConfig, columns=None, **kw) -> "TesterConfig":
        """Design §2: BISG, privatised Self-ID and clipping, run inside each audit. The
        Self-ID draws come from this process's randomized-response epoch, started here and
        kept in memory for the service's life (design §2.3)."""
        preparation.response_epoch()  # the epoch starts with the service, not at its first audit
        return cls(client_address, lambda: prepare_from_files(members, self_id, preparation, columns), **kw)


def prepare_from_files(members: str | Path, self_id: str | Path | None,
                       preparation: PreparationConfig, columns=None) -> pd.DataFrame:
    """Read the members (and Self-ID) files and prepare this audit's probabilities in
    memory; `prepare` validates both, once, naming the files in its errors. `columns`:
    the column mapping both files are read with (`common.tables.parse_column_mapping`)."""
    member_frame = read_members(members, preparation.opt_out_column, columns)
    survey = read_self_id(self_id, columns) if self_id else None
    return prepare(member_frame, survey, preparation, labels=(str(members), str(self_id)))


def _error(code: str, message: str) -> pb.AuditEvent:
    return pb.AuditEvent(error=pb.AuditError(code=code, message=message))


def _grpc_error(exc: grpc.RpcError, who: str) -> pb.AuditEvent:
    """A failed gRPC call as the operator's error: the status code in lower case
    ("unavailable", "deadline_exceeded", "resource_exhausted", ...) and its details; a
    peer that refused our messages (INVALID_ARGUMENT, FAILED_PRECONDITION: its validation,
    common.protocol.validation) is a "protocol_error", as when its Abort arrives first."""
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else None
    name = code.name.lower() if code is not None else "unavailable"
    if name in ("invalid_argument", "failed_precondition"):
        name = "protocol_error"
    if name == "unavailable":
        return _error(name, f"{who}: cannot be reached or went away ({details or 'no details'})")
    return _error(name, f"{who}: {details or name}")


#: intermediate progress (rows done) reaches the operator at most this often
PROGRESS_EVERY_S = 1.0


class _Cancelled(Exception):
    """The operator's call ended (cancelled, deadline passed, disconnected) before the audit."""


class _AuditRun:
    """One audit on its own thread (the servicer only relays `events`).

    Running the session off the gRPC handler's thread lets progress reach the operator
    as it happens, and lets an operator who goes away stop the audit: `cancel()` (wired
    to the call's termination) makes the session's next checkpoint raise `_Cancelled`;
    `stop(error)` (shutdown) makes it raise `error`, which is reported to the operator
    and, as an Abort, to the Test-Client. Peer messages move through `common.net.peer_stream`
    (heartbeats both ways, peer deadlines, bounded queues).
    """

    def __init__(self, config: TesterConfig, request: pb.AuditRequest, who: str = "") -> None:
        self.config = config
        self.request = request
        self.who = who  # the operator: its certificate identity (mTLS), else its address
        self.n_matched = 0
        #: the audit log's reason when the release controls refused the intersection ("": none)
        self.refusal = ""
        self.events: "queue.Queue" = queue.Queue()  # AuditEvents, then _DONE
        self._cancelled = threading.Event()
        self._stop_error: PPREError | None = None
        self._lock = threading.Lock()
        self._responses = None  # the call to the Test-Client, once open
        self._t0 = time.perf_counter()
        self.started_at = utc_now()  # for the run history
        self.state = ProgressState()  # ours, sent to the Test-Client in heartbeats
        #: this audit's correlation id: on every log line of both services, sent to the
        #: Test-Client in the Hello and to the operator in every Progress (common.logs)
        self.audit_id = logs.new_audit_id()
        self.phases = logs.PhaseLog(log, self.audit_id)  # one log line per phase of ours
        self.phase_seconds: dict[str, float] = {}  # the session's PhaseClock, once it ends
        self._latest = pb.Progress(phase="inputs", audit_id=self.audit_id)  # ours or the Test-Client's
        self._last_emit = 0.0
        self._emitted_phase = ""
        self._peer_last: tuple = ()

    def cancel(self) -> None:
        """Idempotent; also called when the operator's call ends normally."""
        self._cancelled.set()

    def stop(self, error: PPREError) -> None:
        """End the audit with `error` at its next checkpoint (within a fraction of a second
        while it waits for the peer, after the current chunk while it computes)."""
        self._stop_error = error

    def _check(self) -> None:
        if self._stop_error is not None:
            raise self._stop_error
        if self._cancelled.is_set():
            raise _Cancelled()
        responses = self._responses
        if responses is not None and responses.done() and responses.code() is not grpc.StatusCode.OK:
            # the Test-Client died or the call broke while we compute: stop now, not at the
            # next read (the Inbox would report it only after the current step)
            raise responses

    def _emit(self, phase: str, message: str, done: int = 0, total: int = 0) -> None:
        now = time.perf_counter()
        with self._lock:
            self._latest = pb.Progress(phase=phase, message=message, elapsed_s=now - self._t0, done=done,
                                       total=total, audit_id=self.audit_id)
            # a phase's first report and its end always go out; counts in between at most
            # every PROGRESS_EVERY_S
            within = done and not (total and done >= total) and phase == self._emitted_phase
            if within and now - self._last_emit < PROGRESS_EVERY_S:
                return
            self._last_emit = now
            self._emitted_phase = phase
            self.events.put(pb.AuditEvent(progress=self._latest))

    def _progress(self, phase: str, message: str, done: int = 0, total: int = 0) -> None:
        self._check()
        log.debug("audit progress: %s %d of %d", phase, done, total)  # counts only, never data
        self.phases.update(phase, done, total)
        # the heartbeats carry counts only where the Test-Client knows them already (design
        # §9.2): after the join, a count of chunks or groups of joined rows moves with who joined
        self.state.update(phase, *((done, total) if phase in PEER_COUNTED_PHASES else (0, 0)))
        self._emit(phase, message or (f"{done} of {total}" if total else f"{done} so far"), done, total)

    def _peer_progress(self, beat: pb.Heartbeat) -> None:
        """A Test-Client heartbeat: news (a phase, or more done) reaches the operator;
        an idle Test-Client's heartbeats (no phase) only keep the link alive."""
        news = (beat.phase, beat.done, beat.total)
        if not beat.phase or news == self._peer_last:
            return
        self._peer_last = news
        counted = f": {beat.done} of {beat.total}" if beat.total else (f": {beat.done} so far" if beat.done else "")
        self._emit(f"client:{beat.phase}", f"Test-Client busy{counted}", beat.done, beat.total)

    def heartbeat(self) -> pb.AuditEvent:
        """What the operator gets when nothing else happened for a while: the latest progress."""
        with self._lock:
            latest = pb.Progress()
            latest.CopyFrom(self._latest)
        latest.elapsed_s = time.perf_counter() - self._t0
        return pb.AuditEvent(progress=latest)

    def run(self) -> None:
        try:
            final = self._audit()
            try:
                self.log(final, refusal=self.refusal)
            except AuditLogError as exc:  # an audit that cannot be recorded is not released
                log.error("audit not recorded: %s", exc)
                final = _error(exc.code, str(exc))
            if final is not None and final.WhichOneof("event") == "result":
                self.record(final)
            if final is not None:
                self.events.put(final)
            self.log_outcome(final)
        finally:
            self.events.put(_DONE)

    def log_outcome(self, final: pb.AuditEvent | None) -> None:
        """One line per audit at its end: outcome, matched rows, seconds, the session's
        phase timings (`PhaseClock`); counts and durations only."""
        kind = final.WhichOneof("event") if final is not None else None
        outcome = "cancelled" if final is None else "result" if kind == "result" else final.error.code
        seconds = time.perf_counter() - self._t0
        log.info("audit finished: %s after %.3f s, %d rows matched", outcome, seconds, self.n_matched,
                 extra=logs.audit_extra(self.audit_id, "audit_finished", outcome=outcome,
                                        seconds=logs.seconds(seconds), n_matched=self.n_matched,
                                        metric=self.request.metric,
                                        bootstrap=self.request.bootstrap if self.request.HasField("bootstrap")
                                        else None, phase_seconds=logs.seconds(self.phase_seconds)))

    def record(self, final: pb.AuditEvent) -> None:
        """Keep a released result in the run history, once, and tell the operator its run
        id. A history that cannot be written does not withhold the result (the audit log
        has recorded it; the privacy budget is spent): it is logged, and the result
        carries no run id."""
        history = RunHistory.of(self.config.history)
        if history is None:
            return
        try:
            final.result.run_id = history.record(
                started_at=self.started_at, operator=self.who, client=self.config.client_identity,
                metric=self.request.metric, metric_option=json.loads(final.result.report_json)["metric_option"],
                dataset=self.request.client_dataset, parameters=request_parameters(self.request),
                n_matched=self.n_matched, report_json=final.result.report_json)
        except (HistoryError, OSError, ValueError, KeyError) as exc:
            log.error("audit result not kept in the run history: %s", exc)

    def log(self, final: pb.AuditEvent | None, refusal: str = "") -> None:
        """Append this request and its outcome to the audit log (no member-level data)."""
        audit_log = self.config.audit_log
        if audit_log is None:
            return
        audit_log.append(audit_record(self.request, self.who, final, self.n_matched, refusal,
                                      client=self.config.client_identity))

    def _count_refusal(self, reason: str) -> None:
        """A refused intersection counts against the Test-Client's identity and the
        population (kept in the ledger; `PrivacyAccountant.refuse`) and is recorded as a
        refusal in the audit log (docs/privacy-ledger.md, "Refused audits"); so does an
        audit refused after its intersection was answered but before its ρ was charged
        (the budget spent by a concurrent audit, an error of the Test-Client's making):
        its Abort tells the Test-Client the noisy decision, which must be paid for
        (design §8.2)."""
        try:
            count = f"{self.config.accountant.refuse(self.config.client_identity)}"
        except OSError as err:  # the refusal still goes out; the operator reads why it was not counted
            log.error("refused audit not counted: the privacy ledger cannot be written (%s)", err.strerror)
            count = "not counted: the privacy ledger cannot be written"
        self.refusal = f"{reason} (refused audits of this Test-Client: {count})"

    def _spec(self) -> AuditSpec:
        """The operator's request; absent fields get the defaults, present ones are checked
        (bootstrap 0 or tau 0 is refused, never replaced by a default)."""
        request = self.request
        return AuditSpec(
            metric=request.metric, client_dataset=request.client_dataset,
            bootstrap=request.bootstrap if request.HasField("bootstrap") else boot_defaults.DEFAULT_REPLICATES,
            confidence=request.confidence if request.HasField("confidence") else boot_defaults.DEFAULT_CONFIDENCE,
            seed=request.seed if request.has_seed else None,
            result_recipient=request.result_recipient or "client",
            metric_option=request.metric_option, params=dict(request.metric_params),
            tau=request.tau if request.HasField("tau") else DEFAULT_TAU,
            correction=request.correction or "none").validated()

    def _audit(self) -> pb.AuditEvent | None:
        cfg = self.config
        settings = cfg.settings
        session = None
        #: the rho charged to this audit (`PrivacyAccountant.charge`), once its release is paid for
        charged: list[float] = []
        #: how the audit ended, where an error ended it (for the audit log)
        ending: list[str] = []
        outbox = Outbox(settings, self.state, "Test-Client")
        inbox = None
        channel = None
        try:
            self._progress("inputs", "reading the Tester's inputs")  # first: the operator learns the audit id
            spec = self._spec()
            started = time.perf_counter()
            probabilities = cfg.load_probabilities()
            preparation = probabilities.attrs.get("preparation")
            seconds = time.perf_counter() - started
            log.info("phase inputs took %.3f s (%d members)", seconds, len(probabilities),
                     extra=logs.audit_extra(self.audit_id, "phase", phase="inputs", seconds=logs.seconds(seconds),
                                            rows=len(probabilities), groups=len(probabilities.columns) - 1,
                                            preparation=preparation.counts() if preparation is not None else None))
            identity = cfg.client_identity
            cfg.accountant.check_refusals(identity, cfg.release.max_refusals)  # before any work, as the budget
            if cfg.release.noisy:  # refuse before any work an audit that could not be released
                cfg.accountant.check(identity, cfg.release.rho)

            def charge(rho: float) -> float:
                left = cfg.accountant.charge(identity, rho)
                charged.append(rho)
                return left
            session = TesterSession(spec, probabilities, min_modulus_bits=cfg.min_modulus_bits,
                                    n_buckets=cfg.n_buckets, progress=self._progress,
                                    checkpoint=self._check,
                                    preparation=preparation.counts() if preparation is not None else None,
                                    release=cfg.release, max_received_bytes=cfg.max_received_bytes,
                                    charge=charge,
                                    executor=cfg.executor, audit_id=self.audit_id,
                                    group_mapping=probabilities.attrs.get("group_mapping", ""))
            del probabilities
            self.phases.watch(session.phase_seconds)  # one log line per lap of its PhaseClock
            cfg.sessions.append(session)

            channel = channels.make_channel(cfg.client_address, settings, tls=cfg.tls,
                                            server_name=cfg.client_name if cfg.tls is not None else None,
                                            insecure=cfg.tls is None)
            # Replies are decoded by us (wire.parse_peer_message, in the Inbox): a Test-Client
            # that sends garbage gets a protocol_error, not an opaque gRPC INTERNAL.
            exchange = channel.stream_stream(EXCHANGE_METHOD,
                                             request_serializer=pb.PeerMessage.SerializeToString,
                                             response_deserializer=None)
            for msg in session.start():
                outbox.put(msg, self._check)
            with self._lock:
                self._check()
                self._responses = exchange(outbox.messages(), timeout=cfg.deadline_s)
            inbox = Inbox(self._responses, settings, "Test-Client", on_heartbeat=self._peer_progress)
            while session.phase is not Phase.DONE:
                msg = inbox.get(self._check)
                if msg is None:
                    break
                for out in session.receive(msg):
                    outbox.put(out, self._check)
            self._check()
            if session.result is None:
                return _error("protocol_error", f"the Test-Client ended the session in phase {session.phase.value}")
            self.n_matched = session.n_matched
            return pb.AuditEvent(result=session.result.to_proto())
        except _Cancelled:
            log.warning("audit cancelled by the operator in phase %s",
                        session.phase.value if session is not None else "inputs")
            if session is not None:  # the Test-Client drops its session at once, not at its peer timeout
                outbox.put_nowait(pb.PeerMessage(abort=pb.Abort(code="cancelled",
                                                                message="the operator cancelled the audit")))
            return None
        except PeerAborted as exc:
            log.warning("audit aborted by the Test-Client (%s)", exc.code)
            ending.append(f"{exc.code}: Test-Client: {exc}")
            return _error(exc.code, f"Test-Client: {exc}")
        except PPREError as exc:
            log.warning("audit failed: %s", type(exc).__name__)
            ending.append(f"{exc.code}: {exc}")
            if isinstance(exc, IntersectionRefused):
                self._count_refusal(f"{exc.code}: {exc}")
            if session is not None:
                outbox.put_nowait(pb.PeerMessage(abort=pb.Abort(code=exc.code, message=str(exc))))
            who = f"Test-Client at {cfg.client_address}: " if isinstance(exc, PeerTimeoutError) else ""
            return _error(exc.code, f"{who}{exc}")
        except grpc.RpcError as exc:
            if self._cancelled.is_set():  # we cancelled the peer call because the operator left
                log.warning("audit cancelled by the operator")
                return None
            log.warning("audit failed: the call to the Test-Client ended (%s)", exc.code())
            return _grpc_error(exc, f"Test-Client at {cfg.client_address}")
        except Exception:
            log.exception("internal error during an audit")
            return _error("internal", "internal error at the Tester")
        finally:
            if cfg.release.noisy and session is not None and session.intersection_decided and not charged \
                    and not self.refusal:  # answered, never paid for: whatever ended it told the Test-Client
                self._count_refusal(f"{UNPAID_ANSWER}: {ending[-1] if ending else 'the session ended'}")
            self.phases.finish()
            outbox.close()  # ends the request stream (an Abort put above still goes first)
            if session is not None:
                self.phase_seconds = dict(session.phase_seconds)
                session.close()
                if session in cfg.sessions:
                    cfg.sessions.remove(session)
            with self._lock:
                responses, self._responses = self._responses, None
            if responses is not None:
                # give a queued Abort a moment to leave before the call is torn down
                if not responses.done():
                    _wait_done(responses, ABORT_FLUSH_S)
                responses.cancel()
            if inbox is not None:
                inbox.close()
            if channel is not None:
                channel.close()


def audit_record(request: pb.AuditRequest, who: str, final: pb.AuditEvent | None, n_matched: int,
                 refusal: str = "", client: str = "") -> dict:
    """One audit log record: who, for which Test-Client, what was asked, and the outcome;
    never member-level data (the result only as a digest of what the Tester sent the
    operator: under result recipient `client` its receipt, design §3.7; and the privacy
    budget it spent)."""
    record = {
        "who": who, "client": client, "metric": request.metric, "metric_option": request.metric_option,
        "client_dataset": request.client_dataset, "parameters": request_parameters(request),
        "value_bounds": declared_bounds(request),
    }
    if refusal:
        record["outcome"] = {"status": "refused", "reason": refusal}
    elif final is None:
        record["outcome"] = {"status": "cancelled"}
    elif final.WhichOneof("event") == "result":
        record["outcome"] = {"status": "result", "n_matched": n_matched,
                             "result_sha256": result_digest(final.result.report_json)}
        release = json.loads(final.result.report_json).get("release", {})
        if release:
            record["outcome"]["release"] = {k: release[k] for k in ("rho", "budget_left", "suppressed", "controls")
                                            if k in release}
    else:
        record["outcome"] = {"status": "error", "code": final.error.code, "message": final.error.message}
    return record


def declared_bounds(request: pb.AuditRequest) -> dict | None:
    """The value bounds the audit's noise is sized from (`Metric.value_bounds`: defaults
    included), or None for a request whose metric or parameters are refused."""
    from common.metrics import get_metric
    try:
        metric = get_metric(request.metric)
        option = metric.check_option(request.metric_option)
        metric = metric.for_option(option)
        return metric.value_bounds(option, metric.parse_params(dict(request.metric_params)))
    except InputError:
        return None


def request_parameters(request: pb.AuditRequest) -> dict:
    """The request's parameters as the audit log and the run history keep them (absent: None)."""
    return {"bootstrap": request.bootstrap if request.HasField("bootstrap") else None,
            "confidence": request.confidence if request.HasField("confidence") else None,
            "tau": request.tau if request.HasField("tau") else None,
            "seed": request.seed if request.has_seed else None,
            "result_recipient": request.result_recipient or "client",
            "correction": request.correction or "none",
            "metric_params": dict(request.metric_params)}


#: how long a failing audit waits for the Test-Client to take its Abort
ABORT_FLUSH_S = 1.0


def _wait_done(call, seconds: float) -> None:
    done = threading.Event()
    call.add_done_callback(lambda _: done.set())
    done.wait(seconds)


class TesterServicer(pb_grpc.TesterServicer):
    """`RunAudit`: admits an audit (session limit, shutdown), runs it on its own thread
    and relays its events, with a progress event whenever the audit has been quiet for
    `heartbeat_s` (the operator's stream is never silent)."""

    #: a refused audit's gRPC status: new audits during shutdown are "unavailable"
    _REFUSAL_STATUS = {"shutting_down": grpc.StatusCode.UNAVAILABLE,
                       "resource_exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED}

    def __init__(self, config: TesterConfig, health_servicer=None) -> None:
        self.config = config
        self._health = health_servicer
        self._runs: SessionTable[_AuditRun] = SessionTable(config.max_sessions, "Tester")

    @property
    def active_sessions(self) -> int:
        return self._runs.active

    def operator(self, context) -> str:
        """The caller, for the audit log: its verified certificate identity (the
        allow-listed name it was admitted under), or its address without TLS."""
        if self.config.tls is not None:
            return tls_.caller_identity(context, self.config.operator_allow_list) or context.peer() or ""
        return context.peer() or ""

    def RunAudit(self, request: pb.AuditRequest, context):
        run = _AuditRun(self.config, request, who=self.operator(context))
        refusal = self._runs.admit(run)
        if refusal is not None:
            code, message = refusal
            log.warning("audit refused: %s", message, extra=logs.audit_extra(run.audit_id, "audit_refused"))
            try:
                run.log(None, refusal=f"{code}: {message}")
            except AuditLogError as exc:
                log.error("refusal not recorded: %s", exc)
            context.abort(self._REFUSAL_STATUS[code], message)
        log.info("audit started (metric %s, dataset %r); active sessions: %d", request.metric,
                 request.client_dataset, self._runs.active,
                 extra=logs.audit_extra(run.audit_id, "audit_started", metric=request.metric,
                                        dataset=request.client_dataset, operator=run.who))
        context.add_callback(run.cancel)  # runs when the call ends, however it ends
        threading.Thread(target=self._run, args=(run,), name="ppre-audit", daemon=True).start()
        try:
            while True:
                try:
                    event = run.events.get(timeout=self.config.settings.heartbeat_s)
                except queue.Empty:
                    yield run.heartbeat()
                    continue
                if event is _DONE:
                    return
                yield event
        finally:
            run.cancel()  # the operator stopped reading: stop the audit too

    def _history(self, context) -> RunHistory:
        history = RunHistory.of(self.config.history)
        if history is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          "this Tester keeps no run history (start it with --history FILE)")
        return history

    def ListRuns(self, request: pb.ListRunsRequest, context) -> pb.ListRunsReply:
        """The run history, newest first (the identity check is the interceptor's, as for
        RunAudit: only allow-listed operators get here)."""
        history = self._history(context)
        try:
            runs = history.list(metric=request.metric or None, dataset=request.dataset or None,
                                since=request.since or None, until=request.until or None,
                                limit=request.limit or None)
        except InputError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except HistoryError as exc:
            log.error("run history: %s", exc)
            context.abort(grpc.StatusCode.INTERNAL, f"the Tester's run history cannot be read: {exc}")
        return pb.ListRunsReply(runs=[run.to_proto().summary for run in runs])

    def GetRun(self, request: pb.GetRunRequest, context) -> pb.RunRecord:
        history = self._history(context)
        try:
            return history.get(request.run_id).to_proto()
        except RunNotFound as exc:
            context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
        except HistoryError as exc:
            log.error("run history: %s", exc)
            context.abort(grpc.StatusCode.INTERNAL, f"the Tester's run history cannot be read: {exc}")

    def _run(self, run: _AuditRun) -> None:
        with logs.audit_context(run.audit_id):  # every line of this thread names the audit
            try:
                run.run()
            finally:
                active = self._runs.discard(run)
                release_freed_memory()
                log.info("audit ended; active sessions: %d", active)

    def shutdown(self, wait_s: float) -> None:
        """SIGTERM: report NOT_SERVING, refuse new audits, end running ones with a
        "shutting down" error to the operator and the Test-Client, and wait up to
        `wait_s` for them to be torn down."""
        runs = self._runs.drain()
        if self._health is not None:
            channels.set_not_serving(self._health, "ppre.v1.Tester")
        for run in runs:
            run.stop(ShuttingDownError("the Tester is shutting down"))
        self._runs.wait_idle(wait_s)


def refusal_record(method: str, identity: str, message: str) -> dict:
    """The audit log's record of a caller refused by identity (nothing of its request is read)."""
    return {"who": identity, "method": method,
            "outcome": {"status": "refused", "reason": f"permission_denied: {message}"}}


def serve(config: TesterConfig, port: int, host: str = "127.0.0.1") -> tuple[grpc.Server, int, TesterServicer]:
    def refused(method: str, identity: str, message: str) -> None:
        if config.audit_log is not None:
            config.audit_log.append(refusal_record(method, identity, message))

    server, bound, health_servicer = channels.make_server(
        port, host, workers=channels.handler_workers(config.max_sessions), settings=config.settings, tls=config.tls,
        access={TESTER_METHODS: config.operator_allow_list}, on_refused=refused)
    servicer = TesterServicer(config, health_servicer)
    pb_grpc.add_TesterServicer_to_server(servicer, server)
    server.start()
    channels.set_serving(health_servicer, "ppre.v1.Tester")
    return server, bound, servicer


#: loopback Testers whose Test-Client runs in this process too (`ppre.local`): address ->
#: finisher(result event) -> the event this process's operator gets
_LOCAL_FINISHERS: dict[str, Callable[[pb.AuditEvent], pb.AuditEvent]] = {}


def remember_local_results(address: str, finisher: Callable[[pb.AuditEvent], pb.AuditEvent]) -> None:
    """`run_audit(address, ...)` in this process passes its result event through
    `finisher` (local mode, where one user holds both sides: the
    Test-Client's kept result merged with the Tester's receipt, design §3.7)."""
    _LOCAL_FINISHERS[address] = finisher


def forget_local_results(address: str) -> None:
    _LOCAL_FINISHERS.pop(address, None)


def run_audit(address: str, request: pb.AuditRequest, *, timeout: float | None = None,
              on_progress: Callable[[pb.Progress], None] | None = None,
              settings: channels.LinkSettings | None = None, tls: tls_.TlsIdentity | None = None,
              server_name: str | None = None) -> pb.AuditEvent:
    """Operator side: call RunAudit and return the final event (result or error).

    `tls`: the operator's certificate, key and CA; `server_name`: the identity the
    Tester's certificate must carry (default tester.ppre.local). Without `tls`, what
    `channels.remember_dial` recorded for the address, else plaintext.
    Every way the call can fail comes back as an error event, never an exception: a
    gRPC status as its lower-case code ("unavailable", "deadline_exceeded",
    "resource_exhausted", "permission_denied", ...), a broken event stream as "protocol_error".
    KeyboardInterrupt (Ctrl-C) cancels the call, then propagates. For a Tester whose
    Test-Client runs in this process (`remember_local_results`), the result is what
    its finisher makes of it."""
    final = _run_audit(address, request, timeout=timeout, on_progress=on_progress, settings=settings, tls=tls,
                       server_name=server_name)
    finisher = _LOCAL_FINISHERS.get(address)
    if finisher is None or final.WhichOneof("event") != "result":
        return final
    return finisher(final)


def _run_audit(address: str, request: pb.AuditRequest, *, timeout: float | None, on_progress, settings, tls,
               server_name) -> pb.AuditEvent:
    if tls is not None and server_name is None:
        server_name = tls_.TESTER_IDENTITY
    with channels.make_channel(address, settings, tls=tls, server_name=server_name) as channel:
        stub = pb_grpc.TesterStub(channel)
        final = None
        call = stub.RunAudit(request, timeout=timeout)
        try:
            for event in call:
                kind = event.WhichOneof("event")
                if kind == "progress":
                    if on_progress:
                        on_progress(event.progress)
                elif final is None:
                    final = event
                else:
                    return _error("protocol_error", "the Tester sent more than one final event")
        except grpc.RpcError as exc:
            if timeout is not None and callable(getattr(exc, "code", None)) \
                    and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return _error("deadline_exceeded", f"Tester at {address}: the audit did not finish within its "
                                                   f"deadline of {timeout:g} s (--timeout SECONDS raises it; "
                                                   f"docs/performance.md gives the times of large audits)")
            return _grpc_error(exc, f"Tester at {address}")
        except BaseException:  # Ctrl-C (KeyboardInterrupt) or the caller's own error: the
            call.cancel()      # Tester sees the call cancelled and ends the audit on both sides
            raise
        if final is None:
            return _error("protocol_error", "the Tester ended the audit without a result")
        return final

