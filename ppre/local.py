"""Both services as real gRPC servers on loopback ports, in this process, for one audit.

Used by `ppre audit --local`, `ppre demo`, the benchmark and tests: the Tester and the
Test-Client still talk only through gRPC, exactly as two containers would — over mutual
TLS by default: a development CA is made in memory for the run (`common.net.tls.DevCA`;
nothing is written to disk), with the Tester's, the Test-Client's and the operator's
certificates, and the two addresses are remembered (`channels.remember_dial`) so that
`run_audit(services.tester_address, ...)` in this process presents the operator's
certificate. `tls=False` runs plaintext (no identities; the addresses are remembered as
plaintext), for tests that need it.

Under result recipient `client` the Test-Client keeps the result and the Tester ends
with a receipt (design §3.7); here one user holds both sides, so `run_audit` on these
services returns the Test-Client's kept result with the Tester's facts
(`delivered_result`): what a local user sees does not depend on where it was finished,
and the run history keeps what it saw (`RunHistory.deliver`).
"""
from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, Iterator

import pandas as pd

from client_service.datasets import DatasetRegistry
from client_service.results import ResultStore
from client_service.server import ClientConfig, ClientServicer
from client_service.server import serve as serve_client
from common.crypto import paillier
from common.net import channels
from common.net.channels import LinkSettings
from common.execution.parallel import Executor
from common.net.tls import TESTER_IDENTITY, DevCA, TlsIdentity
from common.stats import bootstrap as boot
from tester_service.history import RunHistory
from tester_service.release import PrivacyAccountant, ReleasePolicy
from proto import ppre_pb2 as pb
from tester_service.server import TesterConfig, TesterServicer, forget_local_results, remember_local_results
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
    #: the run's in-memory development CA (None without TLS): `pki.identity(role, name=...)`
    #: issues more certificates, e.g. an operator who is not on the allow-list
    pki: DevCA | None = None
    #: the operator's certificate (None without TLS)
    operator_tls: TlsIdentity | None = None

    @property
    def insecure(self) -> bool:
        return self.pki is None


@contextlib.contextmanager
def local_services(load_probabilities: Callable[[], pd.DataFrame], datasets: DatasetRegistry, *,
                   modulus_bits: int | None = None, allow_insecure: bool = False,
                   n_buckets: int = boot.DEFAULT_BUCKETS,
                   client_interceptors: tuple = (),
                   settings: LinkSettings | None = None,
                   max_sessions: tuple[int, int] = (4, 4),
                   release: ReleasePolicy | None = None,
                   accountant: PrivacyAccountant | None = None,
                   tls: bool = True, executor: Executor | None = None,
                   history: RunHistory | str | Path | None = None,
                   accept_noiseless: bool = True,
                   results: ResultStore | None = None) -> Iterator[LocalServices]:
    """`max_sessions`: the (Tester, Test-Client) session limits. `release`: the Tester's
    release controls (default: the secure defaults); `accountant`: where the Tester keeps
    the privacy budget it spends (default: in memory, for these services' lifetime).
    `tls`: mutual TLS with an in-memory development CA (default), or plaintext
    (`allow_insecure` is about the Paillier modulus size, not the transport).
    `executor`: where both services' per-row work runs (one pool for the two; default
    inline, `common.execution.parallel`); the caller owns it and shuts it down. `history`: the
    Tester's run history (a path or a RunHistory; default none: nothing is kept).
    `modulus_bits`: the Paillier key size (default 2048, or `PPRE_TEST_KEY_BITS` where a
    test process sets it, `paillier.test_key_bits`: then said on standard error).
    `accept_noiseless`: the Test-Client finishes aggregates without release noise
    (`ClientConfig.accept_noiseless`): on here, where one user holds both sides and chose
    the Tester's controls too (`ppre client serve` refuses them by default). `results`:
    where the Test-Client keeps finished results (default: in memory; `run_audit` on
    these services takes them from there, module docstring).
    This process is protected first (`common.execution.memory.protect_process`: no core dump, not
    dumpable), as each service's is."""
    from common.execution import memory
    memory.protect_process()  # both parties' tables and keys in this one process: no core dump (design §7)
    if modulus_bits is None:
        modulus_bits, test_keys = paillier.process_key_size()
        allow_insecure = allow_insecure or test_keys
        if test_keys:
            print(f"ppre: {paillier.test_keys_label()}", file=sys.stderr, flush=True)
    settings = settings or LinkSettings.from_env()
    pki = DevCA.generate("PPRE local run CA") if tls else None
    tester_tls, client_tls, operator_tls = (pki.identity(role) if pki is not None else None
                                            for role in ("tester", "client", "operator"))
    client_config = ClientConfig(datasets, modulus_bits=modulus_bits, allow_insecure=allow_insecure,
                                 settings=settings, max_sessions=max_sessions[1], tls=client_tls,
                                 executor=executor, accept_noiseless=accept_noiseless,
                                 results=results if results is not None else ResultStore())
    client_server, client_port, client_servicer = serve_client(client_config, 0, host="127.0.0.1",
                                                               interceptors=client_interceptors)
    client_address = f"127.0.0.1:{client_port}"
    tester_config = TesterConfig(client_address, load_probabilities, n_buckets=n_buckets,
                                 min_modulus_bits=min(modulus_bits, paillier.MIN_MODULUS_BITS), settings=settings,
                                 max_sessions=max_sessions[0], release=release or ReleasePolicy(),
                                 accountant=accountant, tls=tester_tls, executor=executor, history=history)
    tester_server, tester_port, tester_servicer = serve_tester(tester_config, 0, host="127.0.0.1")
    tester_address = f"127.0.0.1:{tester_port}"
    # this process dials the Tester as the operator, and the Test-Client as the Tester does;
    # without TLS both addresses are remembered as plaintext, so that a dial another
    # server of this process once remembered for a reused port is never taken for these
    channels.remember_dial(tester_address, operator_tls, TESTER_IDENTITY if pki is not None else None)
    channels.remember_dial(client_address, tester_tls, tester_config.client_name if pki is not None else None)
    remember_local_results(tester_address, partial(delivered_result, client_config.results,
                                                   tester=tester_config))
    try:
        yield LocalServices(tester_address, client_address, tester_config, client_config,
                            client_servicer, tester_servicer, pki=pki, operator_tls=operator_tls)
    finally:
        forget_local_results(tester_address)
        channels.forget_dial(tester_address)
        channels.forget_dial(client_address)
        # A bounded stop: cancel what is still running, and never wait forever on a
        # call that gRPC failed to finish (the process exits anyway).
        for server in (tester_server, client_server):
            server.stop(grace=0).wait(STOP_WAIT_S)


def delivered_result(results: ResultStore, event: pb.AuditEvent, *,
                     tester: TesterConfig | None = None) -> pb.AuditEvent:
    """A result event from these services' Tester as the local user sees it: a receipt
    (result recipient `client`) replaced by the Test-Client's kept result, taken from its
    store by the audit's id, with the Tester's facts (`common.stats.results.delivered`);
    anything else unchanged. The run id stays the Tester's, and the `tester`'s run
    history, where it keeps one, gets the result in place of the receipt
    (`RunHistory.deliver`): the operator is both parties here, and `ppre runs show` and
    `ppre report` give back what the terminal showed (aggregates only, as every kept
    result; design §9.3). Not where the Tester keeps an audit log: the log holds the
    digest of what the Tester sent (its receipt), which the history's record matches."""
    from common.stats.results import AuditReport, delivered
    from tester_service.history import HistoryError
    kept = AuditReport.from_proto(event.result)
    if not kept.is_receipt:
        return event
    result = results.pop(kept.audit_id)
    if result is None:
        return pb.AuditEvent(error=pb.AuditError(
            code="internal", message=f"the Test-Client holds no result for audit {kept.audit_id}"))
    merged = delivered(kept, result).to_json()
    history = tester.history if tester is not None and tester.audit_log is None else None
    if history is not None and event.result.run_id:
        try:
            history.deliver(event.result.run_id, merged)
        except HistoryError as exc:  # the result is shown all the same; the history keeps the receipt
            print(f"ppre: the run history keeps only the receipt of run {event.result.run_id}: {exc}",
                  file=sys.stderr, flush=True)
    return pb.AuditEvent(result=pb.AuditResult(report_json=merged, run_id=event.result.run_id))
