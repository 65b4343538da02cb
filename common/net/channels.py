"""The one place where gRPC servers and channels are built, with their credentials.

Transport security (`common.net.tls`): with a `TlsIdentity`, a server listens with mutual TLS
(a client certificate from the CA is required and verified at the handshake) and puts
an `IdentityInterceptor` in front of every other interceptor, so a peer whose identity
is not on the called service's allow-list is refused before any handler runs; a
channel presents the party's certificate and checks the server's certificate for the
expected identity (`server_name`, via `grpc.ssl_target_name_override`), whatever
address it dials. Without one, plaintext (only `--insecure` gets there from the CLI).

In-process services on loopback (`ppre.local.local_services`, the tests' service
processes) `remember_dial(address, tls, server_name)` how they are reached, so that a
plain `make_channel(address)` / `run_audit(address, ...)` to such an address uses the
right credentials; `forget_dial` when they stop. Nothing else is looked up.

Both services cap messages at `wire.MAX_MESSAGE_BYTES` (tables travel in ~1 MiB
chunks, far below it) and register the standard gRPC health service.

Keepalive is configured the same way on both ends of every link (operator → Tester,
Tester ↔ Test-Client): each channel and each server pings its peer every
`keepalive_s` seconds, waits `KEEPALIVE_TIMEOUT_S` for the answer, and keeps pinging
while a stream carries no data; each server accepts pings down to `MIN_KEEPALIVE_S`
apart, whatever its own interval. gRPC's default server policy (pings at most every
5 minutes while no data flows, two strikes, then GOAWAY "too_many_pings") would end
any call whose stream stays silent for a few pings — which is also why every stream
carries heartbeats (`common.net.peer_stream`) while a party is busy.
"""
from __future__ import annotations

import os
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Mapping

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.errors import InputError
from common.net.tls import AllowList, IdentityInterceptor, TlsIdentity
from common.protocol.wire import MAX_MESSAGE_BYTES

#: shortest keepalive interval a party may configure, and the shortest ping interval
#: every server accepts (so a peer configured with any valid interval is never refused)
MIN_KEEPALIVE_S = 1.0
KEEPALIVE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class LinkSettings:
    """How a party keeps its streams alive and how long it waits for its peer.

    * `keepalive_s`: HTTP/2 ping interval (env PPRE_KEEPALIVE_S, default 30).
    * `heartbeat_s`: a busy party sends a heartbeat (its progress) on any stream it has
      left silent this long (env PPRE_HEARTBEAT_S, default 5).
    * `peer_timeout_s`: the longest a party waits for its peer's next message, or for
      its peer to take the next one it sends (`--peer-timeout`, env PPRE_PEER_TIMEOUT,
      default 600).
    """

    keepalive_s: float = 30.0
    heartbeat_s: float = 5.0
    peer_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.keepalive_s >= MIN_KEEPALIVE_S:
            raise InputError(f"must be at least {MIN_KEEPALIVE_S:g} seconds", parameter="keepalive")
        if not self.heartbeat_s > 0:
            raise InputError("must be positive", parameter="heartbeat")
        if not self.peer_timeout_s > 0:
            raise InputError("must be positive", parameter="peer timeout")

    @classmethod
    def from_env(cls, peer_timeout_s: float | None = None) -> "LinkSettings":
        def number(name: str, default: float) -> float:
            raw = os.environ.get(name)
            if raw is None or raw == "":
                return default
            try:
                return float(raw)
            except ValueError:
                raise InputError(f"must be a number of seconds, got '{raw}'", parameter=name) from None
        timeout = peer_timeout_s if peer_timeout_s is not None else number("PPRE_PEER_TIMEOUT", cls.peer_timeout_s)
        return cls(keepalive_s=number("PPRE_KEEPALIVE_S", cls.keepalive_s),
                   heartbeat_s=number("PPRE_HEARTBEAT_S", cls.heartbeat_s), peer_timeout_s=timeout)

    def channel_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.keepalive_time_ms", int(self.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(KEEPALIVE_TIMEOUT_S * 1000)),
            ("grpc.http2.max_pings_without_data", 0),  # keep pinging through silent phases
        ]

    def server_options(self) -> list[tuple[str, int]]:
        return self.channel_options() + [
            ("grpc.http2.min_recv_ping_interval_without_data_ms", int(MIN_KEEPALIVE_S * 1000)),
            ("grpc.http2.min_ping_interval_without_data_ms", int(MIN_KEEPALIVE_S * 1000)),
        ]


#: the operating-system name of the threads that run a server's handlers (`ps -L`, `top -H`,
#: /proc/PID/task/TID/comm): the pool starts its threads on demand, up to its `workers`, so
#: a reader of the thread list can tell them from any other
HANDLER_THREAD_NAME = "ppre-handler"
#: handler threads a service keeps beyond one per session it admits: the health service,
#: the operator's calls and refusals answered while every session is busy
SPARE_HANDLERS = 8
_PR_SET_NAME = 15


def handler_workers(max_sessions: int) -> int:
    """The handler threads of a service that admits `max_sessions` sessions at once."""
    return max_sessions + SPARE_HANDLERS


def _name_handler_thread() -> None:
    """Gives the calling pool thread its operating-system name (Linux's prctl; elsewhere, or
    where it fails, the thread keeps the name it has: a name is for reading, nothing depends on it)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, HANDLER_THREAD_NAME.encode(), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def make_server(port: int, host: str = "0.0.0.0", workers: int = 8, interceptors: tuple = (),
                settings: LinkSettings | None = None, *, tls: TlsIdentity | None = None,
                access: Mapping[str, AllowList] | None = None,
                on_refused: Callable[[str, str, str], None] | None = None,
                ) -> tuple[grpc.Server, int, health.HealthServicer]:
    """A server on HOST:PORT (0: any free port; the bound port is returned) with the health
    service. `tls`: mutual TLS, and `access` maps a method prefix ("/ppre.v1.Tester/") to
    the allow-list of identities that may call it (any other method but health is
    refused); `on_refused(method, identity, message)` hears of each refusal. Without
    `tls`, plaintext and no identity checks."""
    settings = settings or LinkSettings.from_env()
    chain = list(interceptors)
    if tls is not None:
        chain.insert(0, IdentityInterceptor(access or {}, on_refused=on_refused))  # outermost: runs first
    address = f"{host}:{port}"
    if port:
        check_port_free(host, port)
    # gRPC sets SO_REUSEPORT by default: a second service on a busy port would listen
    # beside the first and callers be answered at random by either. Off: the bind fails.
    options = settings.server_options() + [("grpc.so_reuseport", 0)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=HANDLER_THREAD_NAME,
                                                    initializer=_name_handler_thread), options=options, interceptors=chain)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        bound = server.add_secure_port(address, tls.server_credentials()) if tls is not None \
            else server.add_insecure_port(address)
    except RuntimeError:  # grpcio >= 1.49 raises where older versions returned 0
        bound = 0
    if bound == 0:
        raise PortInUseError(address)
    return server, bound, health_servicer


class PortInUseError(InputError):
    """A service cannot listen on its address: another process (often another PPRE
    service) listens there, or the host is not one of this machine's addresses."""

    code = "address_in_use"

    def __init__(self, address: str, *, certain: bool = False) -> None:
        why = ("another service already listens there" if certain else
               "the port is in use (another service listens there) or the host is not an address of this machine")
        super().__init__(f"cannot listen on {address}: {why}; pick another --port (or --host), or stop the "
                         "other service first")
        self.address = address


def check_port_free(host: str, port: int) -> None:
    """Raise `PortInUseError` when something already listens on HOST:PORT (a plain bind
    test, before gRPC logs its own error line). SO_REUSEADDR as gRPC has it: a port
    whose last connections linger in TIME_WAIT after a restart is free."""
    import errno
    import socket
    bare = host.strip("[]")
    try:
        infos = socket.getaddrinfo(bare or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # gRPC says what is wrong with the host
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUseError(f"{host}:{port}", certain=True) from None


def set_serving(health_servicer: health.HealthServicer, service: str) -> None:
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)


def set_not_serving(health_servicer: health.HealthServicer, service: str) -> None:
    """Shutting down: health checks (compose, load balancers) see NOT_SERVING at once."""
    health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)


@dataclass(frozen=True)
class Dial:
    """How to reach one address: the credentials to present and the identity the
    server's certificate must carry."""

    tls: TlsIdentity | None
    server_name: str | None = None


_DIALS: dict[str, Dial] = {}
_DIALS_LOCK = threading.Lock()


def remember_dial(address: str, tls: TlsIdentity | None, server_name: str | None = None) -> None:
    """Loopback services of this process: `make_channel(address)` will use these credentials."""
    with _DIALS_LOCK:
        _DIALS[address] = Dial(tls, server_name)


def forget_dial(address: str) -> None:
    with _DIALS_LOCK:
        _DIALS.pop(address, None)


def known_dial(address: str) -> Dial | None:
    with _DIALS_LOCK:
        return _DIALS.get(address)


def make_channel(address: str, settings: LinkSettings | None = None, *, tls: TlsIdentity | None = None,
                 server_name: str | None = None, insecure: bool = False) -> grpc.Channel:
    """A channel to `address`: mutual TLS with `tls` (checking that the server's certificate
    names `server_name`, else the address's host), or with what `remember_dial` recorded
    for this address; plaintext otherwise, or always with `insecure`."""
    if tls is None and not insecure:
        known = known_dial(address)
        if known is not None:
            tls, server_name = known.tls, server_name or known.server_name
    options = (settings or LinkSettings.from_env()).channel_options()
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.secure_channel(address, tls.channel_credentials(), options=options)


def check_health(address: str, timeout: float = 3.0, *, tls: TlsIdentity | None = None,
                 server_name: str | None = None) -> bool:
    """Is the service at `address` SERVING? Over TLS any certificate from the CA may ask."""
    return health_status(address, timeout, tls=tls, server_name=server_name).status == SERVING


#: `health_status`'s answers: the service's own (SERVING, NOT_SERVING: up but draining or
#: starting), or why none came: nothing answers at the address, or the TLS handshake failed
SERVING, NOT_SERVING, UNREACHABLE, TLS_FAILED = "SERVING", "NOT_SERVING", "UNREACHABLE", "TLS_FAILED"
#: words in gRPC's message of a failed connection that mean the TLS handshake failed
#: ("Socket closed": a TLS service hung up on a plaintext client)
_TLS_WORDS = ("Tls handshake", "TLS handshake", "SSL", "certificate", "Hostname Verification", "Socket closed")


@dataclass(frozen=True)
class HealthAnswer:
    status: str
    #: gRPC's own words when no answer came ("" otherwise)
    detail: str = ""


def health_status(address: str, timeout: float = 3.0, *, tls: TlsIdentity | None = None,
                  server_name: str | None = None) -> HealthAnswer:
    """The service's health at `address`, or why there is none (`UNREACHABLE`,
    `TLS_FAILED`)."""
    with make_channel(address, tls=tls, server_name=server_name) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError as exc:
            return _failed_health(exc)
    return HealthAnswer(SERVING if reply.status == health_pb2.HealthCheckResponse.SERVING else NOT_SERVING)


def _failed_health(exc: grpc.RpcError) -> HealthAnswer:
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    detail = (exc.details() if callable(getattr(exc, "details", None)) else "") or ""
    if code is grpc.StatusCode.UNAVAILABLE and any(word in detail for word in _TLS_WORDS):
        return HealthAnswer(TLS_FAILED, detail)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return HealthAnswer(UNREACHABLE, detail or (code.name.lower() if code else ""))
    return HealthAnswer(NOT_SERVING, detail)  # it answered, but not as a healthy service does
