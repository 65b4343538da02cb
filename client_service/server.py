"""The Test-Client's gRPC servicer: moves PeerMessages to and from a `ClientSession`.

It enforces what the session cannot: a maximum session duration (the stream is
cancelled when it runs out, so a stalled Tester cannot hold it), one clean Abort
message for any error, and `session.close()` however the stream ends. Logs name the
session's phase and error class, never data.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import grpc

from client_service.datasets import DatasetRegistry
from client_service.protocol import ClientSession, Phase
from common import channels, paillier, wire
from common.errors import PPREError
from proto import ppre_pb2 as pb
from proto import ppre_pb2_grpc as pb_grpc

log = logging.getLogger("ppre.client")


@dataclass
class ClientConfig:
    datasets: DatasetRegistry
    modulus_bits: int = paillier.MIN_MODULUS_BITS
    allow_insecure: bool = False
    max_session_s: float = 3600.0


class ClientServicer(pb_grpc.ClientServicer):
    def __init__(self, config: ClientConfig) -> None:
        self.config = config
        self.active_sessions = 0
        self._lock = threading.Lock()

    def Exchange(self, request_iterator, context):
        cfg = self.config

        def checkpoint() -> None:
            if not context.is_active():  # the Tester cancelled, or the deadline passed
                raise _CallEnded()

        session = ClientSession(cfg.datasets.load, modulus_bits=cfg.modulus_bits,
                                allow_insecure=cfg.allow_insecure, checkpoint=checkpoint)
        timer = threading.Timer(cfg.max_session_s, context.cancel)
        timer.daemon = True
        timer.start()
        with self._lock:
            self.active_sessions += 1
        try:
            for data in _requests(request_iterator):
                yield from session.receive(wire.parse_peer_message(data))
                if session.phase is Phase.DONE:
                    log.info("audit session on dataset %r finished", session.dataset)
                    return
            if session.phase is not Phase.DONE:
                log.warning("session ended by the Tester in phase %s", session.phase.value)
        except _CallEnded:
            # The call is already over (the Tester cancelled, or gRPC could not parse a
            # message and failed the call): nothing can be sent, and yielding into a dead
            # call can wedge the server's shutdown, so just clean up.
            log.warning("call ended by gRPC in phase %s", session.phase.value)
        except PPREError as exc:
            log.warning("session aborted in phase %s: %s", session.phase.value, type(exc).__name__)
            yield pb.PeerMessage(abort=pb.Abort(code=exc.code, message=str(exc)))
        except Exception:  # never crash the server; never echo internals to the peer
            log.exception("internal error in phase %s", session.phase.value)
            yield pb.PeerMessage(abort=pb.Abort(code="internal", message="internal error at the Test-Client"))
        finally:
            timer.cancel()
            session.close()
            with self._lock:
                self.active_sessions -= 1


class _CallEnded(Exception):
    """The request stream failed at the gRPC layer; the call cannot carry a reply."""


def _requests(request_iterator):
    try:
        yield from request_iterator
    except grpc.RpcError as exc:
        raise _CallEnded() from exc


def serve(config: ClientConfig, port: int, host: str = "0.0.0.0",
          interceptors: tuple = ()) -> tuple[grpc.Server, int, ClientServicer]:
    server, bound, health_servicer = channels.make_server(port, host, interceptors=interceptors)
    servicer = ClientServicer(config)
    # Requests arrive as raw bytes and are decoded by the servicer (wire.parse_peer_message),
    # so a peer's garbage gets a clean protocol_error Abort rather than a failed call.
    exchange = grpc.stream_stream_rpc_method_handler(
        servicer.Exchange, request_deserializer=None,
        response_serializer=pb.PeerMessage.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("ppre.v1.Client",
                                                                          {"Exchange": exchange}),))
    server.start()
    channels.set_serving(health_servicer, "ppre.v1.Client")
    return server, bound, servicer

