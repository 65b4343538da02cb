"""Both services as real gRPC servers on loopback ports, in this process, for one audit.

Used by `ppre audit --local`, `ppre demo`, the benchmark and tests: the Tester and the
Test-Client still talk only through gRPC, exactly as two containers would.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import pandas as pd

from client_service.datasets import DatasetRegistry
from client_service.server import ClientConfig, ClientServicer
from client_service.server import serve as serve_client
from common import paillier
from common.channels import LinkSettings
from common import bootstrap as boot
from tester_service.server import TesterConfig, TesterServicer
from tester_service.server import serve as serve_tester


STOP_WAIT_S = 10.0


@dataclass
class LocalServices:
    tester_address: str
    client_address: str
    tester_config: TesterConfig
    client_config: ClientConfig
    client_servicer: ClientServicer
    tester_servicer: TesterServicer


@contextlib.contextmanager
def local_services(load_probabilities: Callable[[], pd.DataFrame], datasets: DatasetRegistry, *,
                   modulus_bits: int = paillier.MIN_MODULUS_BITS, allow_insecure: bool = False,
                   n_buckets: int = boot.DEFAULT_BUCKETS,
                   client_interceptors: tuple = (),
                   settings: LinkSettings | None = None,
                   max_sessions: tuple[int, int] = (4, 4)) -> Iterator[LocalServices]:
    """`max_sessions`: the (Tester, Test-Client) session limits."""
    settings = settings or LinkSettings.from_env()
    client_config = ClientConfig(datasets, modulus_bits=modulus_bits, allow_insecure=allow_insecure,
                                 settings=settings, max_sessions=max_sessions[1])
    client_server, client_port, client_servicer = serve_client(client_config, 0, host="127.0.0.1",
                                                               interceptors=client_interceptors)
    client_address = f"127.0.0.1:{client_port}"
    tester_config = TesterConfig(client_address, load_probabilities, n_buckets=n_buckets,
                                 min_modulus_bits=min(modulus_bits, paillier.MIN_MODULUS_BITS), settings=settings,
                                 max_sessions=max_sessions[0])
    tester_server, tester_port, tester_servicer = serve_tester(tester_config, 0, host="127.0.0.1")
    try:
        yield LocalServices(f"127.0.0.1:{tester_port}", client_address, tester_config, client_config,
                            client_servicer, tester_servicer)
    finally:
        # A bounded stop: cancel what is still running, and never wait forever on a
        # call that gRPC failed to finish (the process exits anyway).
        for server in (tester_server, client_server):
            server.stop(grace=0).wait(STOP_WAIT_S)
