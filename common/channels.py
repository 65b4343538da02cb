"""The one place where gRPC servers and channels are built (ROADMAP 3: mTLS goes here).

Both services cap messages at `wire.MAX_MESSAGE_BYTES` (tables travel in ~1 MiB
chunks, far below it) and register the standard gRPC health service.
"""
from __future__ import annotations

from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from common.wire import MAX_MESSAGE_BYTES

_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
]


def make_server(port: int, host: str = "0.0.0.0", workers: int = 8,
                interceptors: tuple = ()) -> tuple[grpc.Server, int, health.HealthServicer]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=_OPTIONS,
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


def make_channel(address: str) -> grpc.Channel:
    return grpc.insecure_channel(address, options=_OPTIONS)


def check_health(address: str, timeout: float = 3.0) -> bool:
    with make_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING
