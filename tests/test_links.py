"""The links between operator, Tester and Test-Client under long phases and faults.

Real gRPC servers in this process (`ppre.local.local_services`), with fakes only for a
*misbehaving* peer (a stalled Test-Client, a Tester that goes quiet) — never for our
own parts. Process-level faults (kills, SIGSTOP, a cut link) are in test_faults.py.
"""
from __future__ import annotations

import contextlib
import json
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import numpy as np
import pytest

from client_service.datasets import DatasetRegistry
from client_service.protocol import ClientSession
from client_service.server import ClientConfig
from client_service.server import serve as serve_client
from common.net import channels
from common.metrics.base import Component
from common.stats.results import AuditReport
from common.metrics.ero import METRIC as ERO
from common.net.channels import LinkSettings
from common.errors import InputError, PeerAborted, ProtocolError
from ppre.cli import main as ppre_main
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.inputs import read_probability_table
from tester_service import server as tester_server
from tester_service.protocol import AuditSpec, TesterSession
from tester_service.server import run_audit
from tester_service.server import serve as serve_tester
from tests.helpers import NO_RELEASE_CONTROLS, TEST_BITS, exact_session, free_loopback_port, wait_until, write_inputs


@pytest.fixture()
def inputs(tmp_path):
    return write_inputs(tmp_path, 120, 80, seed=5)


def _request(**kw):
    return pb.AuditRequest(metric="ero", client_dataset=kw.pop("dataset", "ero"), bootstrap=kw.pop("bootstrap", 20),
                           has_seed=True, seed=1, **kw)


class SlowRegistry(DatasetRegistry):
    """The Test-Client's real dataset registry, taking `delay` seconds to load: a phase in
    which the Test-Client computes and the Tester only waits."""

    def __init__(self, delay: float, **kw) -> None:
        super().__init__(**kw)
        self.delay = delay

    def load(self, name, metric):
        time.sleep(self.delay)
        return super().load(name, metric)


def _slow(load, delay: float):
    def slow_load():
        time.sleep(delay)
        return load()
    return slow_load


# --------------------------------------------------------------------------- long phases

def test_phases_silent_for_many_keepalive_periods_finish(inputs):
    """Keepalive pings every second and no heartbeats: the operator's stream stays silent
    while the Tester reads its inputs (6 s), and the peer stream while the Test-Client
    loads its dataset (6 s). gRPC's default server ping policy answers such pings with
    GOAWAY "too_many_pings" (the audit dies with UNAVAILABLE); both sides must accept
    the pings they send."""
    _, _, tp, cp = inputs
    settings = LinkSettings(keepalive_s=1.0, heartbeat_s=3600.0, peer_timeout_s=120.0)
    load = _slow(lambda: read_probability_table(tp), 6.0)
    with local_services(load, SlowRegistry(6.0, named={"ero": cp}), modulus_bits=TEST_BITS, allow_insecure=True,
                        settings=settings, release=NO_RELEASE_CONTROLS) as svc:
        event = run_audit(svc.tester_address, _request(), timeout=120, settings=settings)
    assert event.WhichOneof("event") == "result", event


def test_busy_parties_send_progress_at_least_every_heartbeat(inputs):
    """While the Tester and the Test-Client compute, the operator still hears: progress
    events at least every heartbeat (here 0.5 s), some of them the Test-Client's own
    heartbeats relayed ("client:..."), with rows done out of the total where known."""
    _, _, tp, cp = inputs
    settings = LinkSettings(keepalive_s=30.0, heartbeat_s=0.5, peer_timeout_s=60.0)
    load = _slow(lambda: read_probability_table(tp), 4.0)
    events: list[tuple[float, pb.Progress]] = []
    with local_services(load, SlowRegistry(4.0, named={"ero": cp}), modulus_bits=TEST_BITS, allow_insecure=True,
                        settings=settings, release=NO_RELEASE_CONTROLS) as svc:
        event = run_audit(svc.tester_address, _request(bootstrap=200), timeout=120, settings=settings,
                          on_progress=lambda p: events.append((time.monotonic(), p)))
    assert event.WhichOneof("event") == "result", event
    times = [t for t, _ in events]
    gaps = np.diff(times)
    # silent for 4 s twice without heartbeats; slack for scheduling on a loaded 2-core machine
    assert gaps.max() < 2.5, gaps.max()
    phases = [p.phase for _, p in events]
    assert "client:load_dataset" in phases, phases  # the Test-Client's heartbeat during its dataset load
    assert "inputs" in phases and "psi_upload" in phases and "bootstrap" in phases
    counted = [p for _, p in events if p.phase == "psi_upload" and p.total]
    assert counted and counted[-1].done == counted[-1].total == 120


# --------------------------------------------------------------------------- peer deadlines

def _fake_client(behaviour) -> tuple[grpc.Server, int]:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    handler = grpc.stream_stream_rpc_method_handler(behaviour)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("ppre.v1.Client",
                                                                         {"Exchange": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port


@contextlib.contextmanager
def _tester_before_a_stalled_client(tp, peer_timeout_s: float):
    """A Tester whose Test-Client accepts the call, keeps TCP open and never answers:
    yields (config, port, servicer)."""
    release = threading.Event()

    def stalled(request_iterator, context):
        next(request_iterator)
        release.wait(60)
        return iter(())

    fake, fake_port = _fake_client(stalled)
    config = tester_server.TesterConfig(f"127.0.0.1:{fake_port}", lambda: read_probability_table(tp),
                                        min_modulus_bits=TEST_BITS, settings=LinkSettings(peer_timeout_s=peer_timeout_s),
                                        release=NO_RELEASE_CONTROLS)
    server, port, servicer = serve_tester(config, 0, host="127.0.0.1")
    try:
        yield config, port, servicer
    finally:
        release.set()
        server.stop(0).wait(10)
        fake.stop(0).wait(10)


def test_a_stalled_test_client_ends_the_audit_with_deadline_exceeded(inputs):
    """A stalled Test-Client: the operator gets deadline_exceeded within the Tester's peer
    timeout, and the Tester drops the session."""
    with _tester_before_a_stalled_client(inputs[2], 2.0) as (config, port, servicer):
        t0 = time.monotonic()
        event = run_audit(f"127.0.0.1:{port}", _request(), timeout=60)
        took = time.monotonic() - t0
        assert event.error.code == "deadline_exceeded", event
        assert "Test-Client" in event.error.message and "2 s" in event.error.message
        assert 2.0 <= took < 8.0, took
        assert wait_until(lambda: config.sessions == [] and servicer.active_sessions == 0)
        assert channels.check_health(f"127.0.0.1:{port}")


def test_an_audit_past_the_operators_deadline_names_the_flag_that_raises_it(inputs):
    """The operator's own deadline (`ppre audit --timeout`) passes while the peers still
    talk: the error says which deadline it was and the flag that raises it, not only
    gRPC's "Deadline Exceeded"."""
    with _tester_before_a_stalled_client(inputs[2], 30.0) as (_, port, _servicer):
        event = run_audit(f"127.0.0.1:{port}", _request(), timeout=1.5)
        assert event.error.code == "deadline_exceeded", event
        assert "1.5 s" in event.error.message and "--timeout" in event.error.message


def _exchange(channel, requests):
    """Act as the Tester: the Test-Client's Exchange call over `channel`."""
    return channel.stream_stream("/ppre.v1.Client/Exchange", request_serializer=pb.PeerMessage.SerializeToString,
                                 response_deserializer=pb.PeerMessage.FromString)(requests, timeout=30)


def test_a_tester_that_goes_quiet_is_dropped_by_the_test_client(inputs):
    """The Tester sends its Hello, then nothing (no rows, no heartbeat): the Test-Client
    answers, waits its peer timeout, tells the Tester why (deadline_exceeded Abort) and
    drops the session."""
    tester, client, _, cp = inputs
    config = ClientConfig(DatasetRegistry(named={"ero": cp}), modulus_bits=TEST_BITS, allow_insecure=True,
                          settings=LinkSettings(peer_timeout_s=2.0))
    server, port, servicer = serve_client(config, 0, host="127.0.0.1")
    session = exact_session(AuditSpec(metric="ero", client_dataset="ero", bootstrap=5), tester,
                            min_modulus_bits=TEST_BITS)
    quiet = threading.Event()

    def requests():
        yield from session.start()
        quiet.wait(30)

    try:
        with channels.make_channel(f"127.0.0.1:{port}") as channel:
            call = _exchange(channel, requests())
            t0 = time.monotonic()
            replies = [m.WhichOneof("body") for m in call if m.WhichOneof("body") != "heartbeat"]
            assert replies[0] == "hello_ack"
            assert replies[-1] == "abort"
            assert 2.0 <= time.monotonic() - t0 < 8.0
        assert wait_until(lambda: servicer.active_sessions == 0)
    finally:
        quiet.set()
        session.close()
        server.stop(0).wait(10)


def test_the_test_client_does_not_answer_an_abort_with_an_abort(inputs):
    """The Tester aborts: the Test-Client ends the session quietly (an Abort in answer to
    an Abort would be read by a Tester as the Test-Client's own failure)."""
    tester, _, _, cp = inputs
    config = ClientConfig(DatasetRegistry(named={"ero": cp}), modulus_bits=TEST_BITS, allow_insecure=True)
    server, port, servicer = serve_client(config, 0, host="127.0.0.1")
    session = exact_session(AuditSpec(metric="ero", client_dataset="ero", bootstrap=5), tester,
                            min_modulus_bits=TEST_BITS)
    got_ack = threading.Event()

    def requests():
        yield from session.start()
        got_ack.wait(20)
        yield pb.PeerMessage(abort=pb.Abort(code="bad_input", message="the Tester gives up"))

    try:
        with channels.make_channel(f"127.0.0.1:{port}") as channel:
            call = _exchange(channel, requests())
            replies = []
            for m in call:
                replies.append(m.WhichOneof("body"))
                if replies[-1] == "hello_ack":
                    got_ack.set()
        assert "hello_ack" in replies and "abort" not in replies, replies
        assert wait_until(lambda: servicer.active_sessions == 0)
    finally:
        session.close()
        server.stop(0).wait(10)


# --------------------------------------------------------------------------- session limits

def test_sessions_beyond_the_limit_are_refused_while_running_ones_finish(inputs):
    _, _, tp, cp = inputs
    load = _slow(lambda: read_probability_table(tp), 2.0)
    with local_services(load, DatasetRegistry(named={"ero": cp}), modulus_bits=TEST_BITS,
                        allow_insecure=True, max_sessions=(1, 4), release=NO_RELEASE_CONTROLS) as svc:
        with futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(run_audit, svc.tester_address, _request(), timeout=120)
            time.sleep(0.5)  # the first audit is reading its inputs
            refused = run_audit(svc.tester_address, _request(), timeout=60)
            assert refused.error.code == "resource_exhausted", refused
            assert "--max-sessions 1" in refused.error.message
            assert first.result(timeout=120).WhichOneof("event") == "result"


def test_the_test_client_refuses_sessions_beyond_its_limit(inputs):
    _, _, tp, cp = inputs
    registry = SlowRegistry(2.0, named={"ero": cp})
    with local_services(lambda: read_probability_table(tp), registry, modulus_bits=TEST_BITS,
                        allow_insecure=True, max_sessions=(4, 1), release=NO_RELEASE_CONTROLS) as svc:
        with futures.ThreadPoolExecutor(1) as pool:
            first = pool.submit(run_audit, svc.tester_address, _request(), timeout=120)
            assert wait_until(lambda: svc.client_servicer.active_sessions == 1)
            refused = run_audit(svc.tester_address, _request(), timeout=60)
            assert refused.error.code == "resource_exhausted", refused
            assert refused.error.message.startswith("Test-Client:") and "limit" in refused.error.message
            assert first.result(timeout=120).WhichOneof("event") == "result"
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0 and svc.tester_config.sessions == [])


# --------------------------------------------------------------------------- shutdown

@pytest.mark.parametrize("who", ["tester", "client"])
def test_shutdown_ends_running_audits_with_a_clear_error(inputs, who):
    """Shutdown (what SIGTERM triggers): health NOT_SERVING, the running audit ends with
    shutting_down for the operator (relayed through the Tester when the Test-Client
    stops), new audits are refused, nothing is left of the session."""
    _, _, tp, cp = inputs
    with local_services(lambda: read_probability_table(tp), SlowRegistry(3.0, named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=NO_RELEASE_CONTROLS) as svc:
        tester_servicer = svc.tester_servicer
        with futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(run_audit, svc.tester_address, _request(), timeout=60)
            assert wait_until(lambda: svc.client_servicer.active_sessions == 1)
            servicer = tester_servicer if who == "tester" else svc.client_servicer
            servicer.shutdown(5.0)
            event = running.result(timeout=30)
        assert event.error.code == "shutting_down", event
        assert ("Test-Client" if who == "client" else "Tester") in event.error.message
        address = svc.tester_address if who == "tester" else svc.client_address
        assert not channels.check_health(address)
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0 and svc.tester_config.sessions == [])
        again = run_audit(svc.tester_address, _request(), timeout=60)
        assert again.error.code in ("unavailable", "shutting_down"), again
        assert "shutting down" in again.error.message


# --------------------------------------------------------------------------- operator requests

@pytest.mark.parametrize("field, value, parameter", [("bootstrap", 0, "bootstrap"), ("confidence", 0.0, "confidence"),
                                                     ("tau", 0.0, "tau"), ("tau", -1.0, "tau")])
def test_zero_parameters_in_run_audit_are_refused_not_defaulted(inputs, field, value, parameter):
    _, _, tp, cp = inputs
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=NO_RELEASE_CONTROLS) as svc:
        request = _request()
        setattr(request, field, value)
        event = run_audit(svc.tester_address, request, timeout=60)
        assert event.error.code == "bad_input" and f"'{parameter}'" in event.error.message, event
        # absent fields still take the defaults
        default = pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=10)
        ok = run_audit(svc.tester_address, default, timeout=60)
        assert ok.WhichOneof("event") == "result"
        report = AuditReport.from_proto(ok.result)
        assert report.tau == pytest.approx(0.05) and report.confidence == pytest.approx(0.95)


def test_operator_gets_a_clean_error_for_an_unreachable_tester(capsys):
    from tests.processes import tls_argv  # the operator's certificate (mutual TLS)
    dead = f"127.0.0.1:{free_loopback_port()}"
    code = ppre_main(["audit", "--tester", dead, "--client-dataset", "x", "--metric", "ero", "--json",
                      "--timeout", "20", *tls_argv(True)])
    out = capsys.readouterr()
    assert code == 2
    error = json.loads(out.out)["error"]
    assert error["code"] == "unavailable" and dead in error["message"]
    assert "Traceback" not in out.err
    code = ppre_main(["audit", "--tester", dead, "--client-dataset", "x", "--metric", "ero", "--timeout", "20",
                      *tls_argv(True)])
    out = capsys.readouterr()
    assert code == 2 and out.err.count("\n") == 1 and "unavailable" in out.err and "Traceback" not in out.err


# --------------------------------------------------------------------------- sans-I/O checks

def test_slot_plan_and_value_bounds_come_from_the_metric_on_both_sides(inputs, monkeypatch):
    tester, client, _, _ = inputs
    session = exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=5), tester,
                            min_modulus_bits=TEST_BITS)
    client_session = ClientSession(lambda name, metric: client, modulus_bits=TEST_BITS, allow_insecure=True)
    [hello] = session.start()
    [ack] = client_session.receive(hello)
    ack.hello_ack.slot_bits -= 8  # a Test-Client packing narrower slots than ERO's values need
    with pytest.raises(ProtocolError, match="slot plan"):
        list(session.receive(ack))
    session.close()
    client_session.close()
    # and a Test-Client whose own values exceed the metric's bound refuses to encrypt them
    monkeypatch.setattr(ERO, "components", lambda option, params, info: (Component("f", 0, 0),
                                                                          Component("d", 0, 1)))
    other = exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=5), tester,
                          min_modulus_bits=TEST_BITS)
    strict = ClientSession(lambda name, metric: client, modulus_bits=TEST_BITS, allow_insecure=True)
    [hello] = other.start()
    with pytest.raises(InputError, match="exceed the metric's bound"):
        strict.receive(hello)
    other.close()
    strict.close()


def test_peer_faults_in_the_hello_are_protocol_errors(inputs):
    tester, client, _, _ = inputs
    session = exact_session(AuditSpec(metric="ero", client_dataset="d", bootstrap=5), tester,
                            min_modulus_bits=TEST_BITS)
    [hello] = session.start()
    session.close()
    for field, value in (("metric_option", "nonsense"), ("metric", "nonsense")):
        bad = pb.PeerMessage()
        bad.CopyFrom(hello)
        setattr(bad.hello, field, value)
        c = ClientSession(lambda name, metric: client, modulus_bits=TEST_BITS, allow_insecure=True)
        with pytest.raises(ProtocolError) as info:
            c.receive(bad)
        assert not isinstance(info.value, InputError)
        c.close()
    c = ClientSession(lambda name, metric: client, modulus_bits=TEST_BITS, allow_insecure=True)
    with pytest.raises(PeerAborted):
        c.receive(pb.PeerMessage(abort=pb.Abort(code="bad_input", message="x")))


def test_a_servers_handler_threads_carry_their_name_and_stay_within_its_workers():
    """The handler pool starts its threads on demand (a call that finds none idle), so a
    count of threads alone cannot tell a leak from a busy moment: each handler thread
    carries `channels.HANDLER_THREAD_NAME` as its operating-system name, and however many
    calls come at once there are never more than the server's workers."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    def named_handlers() -> set[str]:
        """This process's threads that carry the handler name (by thread id: handler threads
        of servers stopped by earlier tests in the same process may still be ending)."""
        named = set()
        for task in Path("/proc/self/task").iterdir():
            try:
                if (task / "comm").read_text().strip() == channels.HANDLER_THREAD_NAME:
                    named.add(task.name)
            except OSError:  # the thread ended while we looked
                pass
        return named

    before = named_handlers()
    server, port, _ = channels.make_server(0, "127.0.0.1", workers=3)
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            with futures.ThreadPoolExecutor(12) as pool:
                answers = list(pool.map(lambda _: stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10),
                                        range(60)))
        assert {a.status for a in answers} == {health_pb2.HealthCheckResponse.SERVING}
        started = len(named_handlers() - before)
        assert 1 <= started <= 3, started
    finally:
        server.stop(None)
