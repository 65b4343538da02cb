"""The one place where gRPC servers and channels are built (ROADMAP 4: mTLS goes here).

Both services cap messages at `wire.MAX_MESSAGE_BYTES` (tables travel in ~1 MiB
chunks, far below it) and register the standard gRPC health service.

Keepalive is configured the same way on both ends of every link (operator → Tester,
Tester ↔ Test-Client): each channel and each server pings its peer every
`keepalive_s` seconds, waits `KEEPALIVE_TIMEOUT_S` for the answer, and keeps pinging
while a stream carries no data; each server accepts pings down to `MIN_KEEPALIVE_S`
apart, whatever its own interval. gRPC's default server policy (pings at most every
5 minutes while no data flows, two strikes, then GOAWAY "too_many_pings") would end
any call whose stream stays silent for a few pings — which is also why every stream
carries heartbeats (`common.peer_stream`) while a party is busy.
"""
from __future__ import annotations

import os
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.errors import InputError
from common.wire import MAX_MESSAGE_BYTES

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


def make_server(port: int, host: str = "0.0.0.0", workers: int = 8, interceptors: tuple = (),
                settings: LinkSettings | None = None) -> tuple[grpc.Server, int, health.HealthServicer]:
    settings = settings or LinkSettings.from_env()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=settings.server_options(),
                         interceptors=list(interceptors))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    return server, bound, health_servicer


def set_serving(health_servicer: health.HealthServicer, service: str) -> None:
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)


def set_not_serving(health_servicer: health.HealthServicer, service: str) -> None:
    """Shutting down: health checks (compose, load balancers) see NOT_SERVING at once."""
    health_servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    health_servicer.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)


def make_channel(address: str, settings: LinkSettings | None = None) -> grpc.Channel:
    return grpc.insecure_channel(address, options=(settings or LinkSettings.from_env()).channel_options())


def check_health(address: str, timeout: float = 3.0) -> bool:
    with make_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING
