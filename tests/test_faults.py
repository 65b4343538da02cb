"""Faults, concurrency and a soak, through the real service processes.

Every test starts `ppre -v tester serve` and `ppre -v client serve` as separate OS
processes (as tests/test_compose.py does), each in its own process group with an empty
working directory that is also its TMPDIR and HOME, and drives them with the operator's
`ppre audit` process (or, where many audits run, `tester_service.server.run_audit` from
this process: the services are still separate processes). Then it injects one fault:

* the Test-Client SIGKILLed as a phase starts (the Tester's PSI upload, the Test-Client's
  encryption, the Tester's aggregation and bootstrap, the Test-Client's decryption);
* the Tester SIGKILLed mid-audit;
* the Test-Client stalled (SIGSTOP of its process group) under a short peer timeout,
  and under `ppre tester serve --peer-timeout 15` (the acceptance bar);
* the link between the two cut: always through a loopback TCP proxy that stops
  forwarding (sockets stay open); and, as root where `ip netns` works, with the
  Test-Client in its own network namespace and its veth link set down;
* SIGTERM of either service mid-audit.

and checks that the operator gets one clear error (exit status 2, the error's code, no
traceback) within its bound, that the surviving service drops the session (its log's
`active sessions: N` returns to 0, and nothing is written to its directories), and that,
once the dead service is restarted (or the link is back), the next audit succeeds.

Concurrency: 8 audits at once under `--max-sessions 8` give the lone audit's results;
beyond the limit an audit gets `resource_exhausted` while the running one succeeds.
Soak: 200 consecutive small audits against long-running services, with resident
memory, threads and open descriptors of both services measured (marked slow, long).

Waits are bounded everywhere; fixture finalizers SIGCONT, SIGTERM and SIGKILL what is
left, close the proxy and delete the namespace, also when a test fails.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from client_service.server import ClientConfig
from common.net import channels
from proto import ppre_pb2 as pb
from tests.helpers import free_loopback_port, make_inputs, netns_usable
from tester_service import server as tester_server
from tests.processes import (ACTIVE_SESSIONS_RE, Dataset, FreezableProxy, OperatorAudit, Outcome, ServiceProcess,
                             VethNamespace, group_pids, health_status, make_client, make_tester,
                             sweep_stale_namespaces, wait_for, write_dataset)

pytestmark = [pytest.mark.slow, pytest.mark.cost(370)]

#: the fault tests' audit: long enough that every phase lasts a few seconds here
N_BIG = 12_000
BIG_BOOTSTRAP = 300
#: the audit after a fault: the same Tester table, a small Test-Client dataset
N_SMALL_CLIENT, N_SMALL_OVERLAP = 400, 300
#: concurrency and soak: tiny audits
N_TINY, N_TINY_OVERLAP, TINY_BOOTSTRAP = 200, 150, 20

PEER_TIMEOUT_S = 5
#: heartbeats well inside the short peer timeout
FAST_LINK = {"PPRE_HEARTBEAT_S": "1", "PPRE_KEEPALIVE_S": "2"}
#: bounds from the acceptance bar: after a kill, after a stall starts (peer timeout 15 s)
ERROR_AFTER_KILL_S = 30.0
BAR_PEER_TIMEOUT_S = 15
ERROR_AFTER_BAR_STALL_S = 45.0
#: a short peer timeout's error comes within the timeout plus a heartbeat and some scheduling slack
ERROR_AFTER_SHORT_STALL_S = PEER_TIMEOUT_S + 10.0
#: how long a surviving service may take to drop a session once the operator has its error
DROP_S = 15.0


def _announce(request, message: str) -> None:
    """Print where `pytest -q` shows it (which variant ran, measured numbers)."""
    print(message)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\n[test_faults] {message}")


# --------------------------------------------------------------------------- data and services

@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Dataset:
    """12,000 Tester members; the Test-Client has `ero` (12,000 rows, half matched) and
    `small` (400 rows, 300 matched) for the audit after a fault."""
    base = tmp_path_factory.mktemp("fault-data")
    dataset = write_dataset(base, N_BIG, N_BIG, N_BIG // 2, seed=3)
    _, small = make_inputs(N_BIG, N_SMALL_CLIENT, N_SMALL_OVERLAP, seed=3)
    small.to_csv(dataset.client_dir / "small.csv", index=False)
    return dataset


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Dataset:
    return write_dataset(tmp_path_factory.mktemp("tiny-data"), N_TINY, N_TINY, N_TINY_OVERLAP, seed=5)


class Deployment:
    """The services a test started; `close()` (the finalizer) ends them all."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.services: list[ServiceProcess] = []
        self.proxies: list[FreezableProxy] = []
        self.operators: list[OperatorAudit] = []

    def pair(self, dataset: Dataset, *, client_address: str | None = None, tester_kw: dict | None = None,
             client_kw: dict | None = None, proxy: bool = False,
             test_keys: bool = False) -> tuple[ServiceProcess, ServiceProcess]:
        """Start the Test-Client, then the Tester pointing at it (or at a proxy in front of it).
        `client_address`: where the Tester and the health checks reach the Test-Client, when
        that is not where it listens (a namespace). The services make production keys unless
        `test_keys`: a fault must find each phase of these audits under way, which the
        suite's test keys shorten below what the triggers can catch."""
        client = make_client(self.base, dataset, **(client_kw or {}))
        client.health_address = client_address
        client.test_keys = test_keys
        self.services.append(client)
        client.start()
        client.wait_healthy()
        target = client_address or client.address
        if proxy:
            host, _, port = target.rpartition(":")
            self.proxies.append(FreezableProxy((host, int(port))))
            target = self.proxies[-1].address
        tester = make_tester(self.base, dataset, target, **(tester_kw or {}))
        tester.test_keys = test_keys
        self.services.append(tester)
        tester.start()
        tester.wait_healthy()
        return tester, client

    def operator(self, tester: ServiceProcess, dataset: str, **kw) -> OperatorAudit:
        op = OperatorAudit(tester.address, dataset, **kw)
        self.operators.append(op)
        return op

    def logs(self) -> str:
        return "\n".join(f"--- {s.name} log:\n{s.log_tail()}" for s in self.services)

    def close(self) -> None:
        for op in self.operators:
            op.kill()
        for service in self.services:
            service.close()
        for proxy in self.proxies:
            proxy.close()


@pytest.fixture()
def deploy(tmp_path):
    deployment = Deployment(tmp_path)
    try:
        yield deployment
    finally:
        deployment.close()


# --------------------------------------------------------------------------- checks

def assert_clear_error(outcome: Outcome, codes: set[str], *, deployment: Deployment) -> tuple[str, str]:
    """Exit status 2, one error with one of `codes`, no traceback, no result."""
    context = f"{outcome.describe()}\n{deployment.logs()}"
    assert not outcome.timed_out, f"the operator got nothing: {context}"
    assert outcome.rc == 2, context
    assert "Traceback" not in outcome.stderr and "Traceback" not in outcome.stdout, context
    error = outcome.error
    assert error is not None, f"no error object or error line: {context}"
    code, message = error
    assert code in codes, f"error code {code!r}, expected one of {sorted(codes)}: {context}"
    assert message and len(message) < 500, context
    return code, message


def assert_json_error(outcome: Outcome, codes: set[str], *, deployment: Deployment) -> dict:
    """As `assert_clear_error`, and stdout is exactly one JSON object {"error": {code, message}}."""
    assert_clear_error(outcome, codes, deployment=deployment)
    obj = outcome.json
    assert isinstance(obj, dict) and set(obj) == {"error"} and set(obj["error"]) == {"code", "message"}, \
        outcome.describe()
    return obj


def assert_dropped(service: ServiceProcess, *, timeout: float = DROP_S) -> float:
    """The service logged `active sessions: 0` (every session it opened is closed); returns the wait."""
    t0 = time.monotonic()
    assert service.session_log_lines() > 0, \
        f"{service.name} never logged `active sessions: N` (expected at INFO with -v):\n{service.log_tail()}"
    assert service.wait_sessions(0, timeout), \
        f"{service.name} still holds a session {timeout:.0f}s later:\n{service.log_tail()}"
    return time.monotonic() - t0


def assert_no_files(*services: ServiceProcess) -> None:
    for service in services:
        written = service.written_files()
        assert written == [], f"{service.name} wrote {written}"


def next_audit_succeeds(deployment: Deployment, tester: ServiceProcess, *, n_matched: int = N_SMALL_OVERLAP,
                        dataset: str = "small") -> dict:
    """The operator's next audit (a small one) gives a result."""
    outcome = deployment.operator(tester, dataset, as_json=True, bootstrap=20, timeout=120).wait()
    context = f"{outcome.describe()}\n{deployment.logs()}"
    assert outcome.rc == 0, context
    result = outcome.json
    assert result is not None and result.get("n_matched") == n_matched, context
    return result


class Trigger:
    """Calls `action` once, on the first progress event whose phase is `phase`."""

    def __init__(self, phase: str, action) -> None:
        self.phase = phase
        self.action = action
        self.fired_at: float | None = None
        self.event = None
        self._lock = threading.Lock()

    def __call__(self, progress) -> None:
        with self._lock:
            if self.fired_at is not None or progress.phase != self.phase:
                return
            self.action()
            self.fired_at = time.monotonic()
            self.event = progress


def progress_counts(message: str) -> tuple[int, int] | None:
    """`done of total` from a progress message ("7 of 16", "Test-Client busy: 2 of 6")."""
    match = re.search(r"(\d+) of (\d+)", message)
    return (int(match.group(1)), int(match.group(2))) if match else None


def assert_mid_phase(trigger: Trigger, outcome: Outcome, next_phase: str | None = None) -> None:
    """The fault hit while its phase was running: the triggering event counted fewer
    than all items, or (for a phase without counts) `next_phase` never followed it."""
    assert trigger.fired_at is not None, f"phase {trigger.phase!r} never reported:\n{outcome.describe()}"
    counts = progress_counts(trigger.event.message)
    if next_phase is not None:
        later = [p.phase for p in outcome.progress if p.at > trigger.fired_at]
        assert next_phase not in later, (trigger.event, later)
    else:
        assert counts is not None and counts[0] < counts[1], \
            f"the fault came after {trigger.phase!r} had finished: {trigger.event}"


def fast_pair(deploy: Deployment, dataset: Dataset, *, peer_timeout: float = PEER_TIMEOUT_S, **kw):
    """Both services with a short peer timeout and one-second heartbeats."""
    return deploy.pair(dataset, tester_kw={"peer_timeout": peer_timeout, "env": dict(FAST_LINK)},
                       client_kw={"peer_timeout": peer_timeout, "env": dict(FAST_LINK)}, **kw)


# --------------------------------------------------------------------------- liveness without faults

def test_heartbeats_keep_a_long_audit_alive_under_a_short_peer_timeout(deploy, big, request):
    """No fault: both services run with `--peer-timeout 3` and heartbeats every second,
    while single steps (the Test-Client's encryption, the Tester's bootstrap) take
    longer than 3 s. Expected: the audit succeeds, the operator hears progress at least
    every heartbeat (plus slack), and the phases appear in protocol order."""
    tester, client = fast_pair(deploy, big, peer_timeout=3)
    outcome = deploy.operator(tester, big.name, as_json=False, bootstrap=BIG_BOOTSTRAP, timeout=180).wait()
    assert outcome.rc == 0, f"{outcome.describe()}\n{deploy.logs()}"
    gaps = [b.at - a.at for a, b in zip(outcome.progress, outcome.progress[1:])]
    phases = list(dict.fromkeys(outcome.phases()))
    durations = {}
    for p in outcome.progress:
        first, _ = durations.get(p.phase, (p.elapsed_s, p.elapsed_s))
        durations[p.phase] = (first, p.elapsed_s)
    _announce(request, f"heartbeats: {len(outcome.progress)} progress events, longest gap {max(gaps):.2f}s, "
                       f"audit {outcome.ended - outcome.started:.1f}s; phases (first..last event, s): "
                       + ", ".join(f"{k} {a:.1f}..{b:.1f}" for k, (a, b) in durations.items()))
    assert max(gaps) <= 1.0 + 2.0, (max(gaps), outcome.stderr)
    expected = ["inputs", "handshake", "psi_upload", "join", "aggregation", "bootstrap", "done"]
    positions = [phases.index(p) if p in phases else -1 for p in expected]
    assert -1 not in positions and positions == sorted(positions), (expected, phases)
    # The Test-Client's own phases reach the operator only through its heartbeats, sent
    # when its outbox has been idle for a heartbeat: its encryption shows as the Tester's
    # join (each chunk is sent, and joined, as soon as it is encrypted), and its decryption
    # only where it outlasts a heartbeat (on the IFMA backend it may not). Where it shows,
    # it comes after the Tester's bootstrap and before the end.
    if "client:decrypt" in phases:
        assert phases.index("bootstrap") < phases.index("client:decrypt") < phases.index("done"), phases
    assert_dropped(tester)
    assert_dropped(client)
    assert_no_files(tester, client)


# --------------------------------------------------------------------------- a service killed

#: phase on whose first progress event the Test-Client is killed -> bootstrap replicates
KILL_CASES = {
    "psi_upload": BIG_BOOTSTRAP,         # the Tester sending its encrypted rows
    "join": BIG_BOOTSTRAP,               # the Test-Client encrypting its rows as the Tester joins them
    "aggregation": BIG_BOOTSTRAP,        # the Tester aggregating under HE
    # long enough (≈30 s here) that a Tester which notices the dead peer only when its
    # bootstrap ends misses the bound
    "bootstrap": 3000,
    # the Test-Client decrypting the masked aggregates: long enough that its first relayed
    # progress (heartbeats every second) comes before its last chunk (at 600 replicates the
    # whole phase fit in one heartbeat on a quiet machine: "16 of 16" was its first report)
    "client:decrypt": 2000,
}


@pytest.mark.parametrize("phase", list(KILL_CASES))
def test_test_client_killed_mid_phase(deploy, big, request, phase):
    """Fault: the Test-Client's service process is SIGKILLed (alone, as the OOM killer
    would) when `phase` reports its first progress. Expected: the operator's `ppre
    audit` exits 2 with error `unavailable` naming the Test-Client within 30 s, the
    Tester drops the session, the dead service's worker processes exit by themselves,
    and after the Test-Client restarts on the same port the next audit succeeds."""
    tester, client = fast_pair(deploy, big)
    workers: list[int] = []

    def kill() -> None:
        workers.extend(p for p in group_pids(client.pid) if p != client.pid)
        os.kill(client.pid, signal.SIGKILL)

    trigger = Trigger(phase, kill)
    outcome = deploy.operator(tester, big.name, as_json=False, bootstrap=KILL_CASES[phase], timeout=240,
                              on_progress=trigger).wait()
    assert_mid_phase(trigger, outcome, next_phase="psi_shuffled" if phase == "psi_upload" else None)
    code, message = assert_clear_error(outcome, {"unavailable"}, deployment=deploy)
    took = outcome.ended - trigger.fired_at
    assert "Test-Client" in message, message
    assert took <= ERROR_AFTER_KILL_S, f"the operator waited {took:.1f}s after the kill:\n{outcome.describe()}"
    dropped = assert_dropped(tester)
    assert health_status(tester.address) == "SERVING"
    client.proc.wait(timeout=10)
    dead_pid = client.pid
    client.start()
    client.wait_healthy()
    next_audit_succeeds(deploy, tester)
    assert_dropped(tester)
    assert_dropped(client)
    assert_no_files(tester, client)
    orphans = wait_for(lambda: not group_pids(dead_pid), 5) is None and group_pids(dead_pid)
    _announce(request, f"Test-Client killed at {phase} ({trigger.event.message!r}): operator got ({code}) "
                       f"{message!r} {took:.2f}s after the kill; Tester dropped the session {dropped:.2f}s "
                       f"later; next audit OK; the killed service's {len(workers)} pool processes "
                       + (f"still running: {orphans}" if orphans else "exited"))
    # A killed service must not leave its worker pool running (memory, CPU) beside its successor.
    assert not orphans, f"worker processes {orphans} outlived the killed Test-Client (pid {dead_pid})"


def test_tester_killed_mid_audit(deploy, big, request):
    """Fault: the Tester (its whole process group, as a container is killed) is SIGKILLed
    while the Test-Client encrypts. Expected: the operator's `ppre audit --json` prints
    one JSON object `{"error": {"code": "unavailable", ...}}` naming the Tester and
    exits 2 within 30 s (no traceback); an audit against the dead Tester gets the same
    clear error; the Test-Client drops the session; after the Tester restarts on the
    same port the next audit succeeds."""
    tester, client = fast_pair(deploy, big)
    operator = deploy.operator(tester, big.name, as_json=True, bootstrap=BIG_BOOTSTRAP, timeout=120)
    assert wait_for(lambda: client.active_sessions() == 1, 60), deploy.logs()
    time.sleep(3.0)  # the Test-Client is now encrypting (measured: from ≈2.5 s to ≈10 s of this audit)
    assert operator.proc.poll() is None, "the audit ended before the fault"
    killed_at = time.monotonic()
    tester.kill()
    outcome = operator.wait()
    error = assert_json_error(outcome, {"unavailable"}, deployment=deploy)["error"]
    took = outcome.ended - killed_at
    assert "Tester" in error["message"], error
    assert took <= ERROR_AFTER_KILL_S, f"{took:.1f}s"
    dropped = assert_dropped(client)
    assert health_status(client.address) == "SERVING"
    dead = deploy.operator(tester, "small", as_json=True, timeout=60).wait()
    dead_error = assert_json_error(dead, {"unavailable"}, deployment=deploy)["error"]
    tester.start()
    tester.wait_healthy()
    next_audit_succeeds(deploy, tester)
    assert_dropped(tester)
    assert_dropped(client)
    assert_no_files(tester, client)
    _announce(request, f"Tester killed mid-audit: operator got {json.dumps({'error': error})} {took:.2f}s after "
                       f"the kill; Test-Client dropped the session {dropped:.2f}s later; audit against the dead "
                       f"Tester: {json.dumps({'error': dead_error})} in {dead.ended - dead.started:.1f}s; "
                       f"next audit OK")


# --------------------------------------------------------------------------- a stalled Test-Client

def test_test_client_stalled_hits_the_peer_timeout(deploy, big, request):
    """Fault: the Test-Client's process group is SIGSTOPped (alive, sockets open, silent)
    as its encryption starts; both services run `--peer-timeout 5`. Expected: the
    operator gets `deadline_exceeded` naming the Test-Client no earlier than the peer
    timeout allows and within 15 s; the Tester drops the session and stays SERVING; once
    resumed (SIGCONT), the Test-Client drops its session too, and the next audit succeeds."""
    tester, client = fast_pair(deploy, big)
    trigger = Trigger("join", client.stop)  # the Test-Client encrypting its rows
    try:
        outcome = deploy.operator(tester, big.name, as_json=False, bootstrap=BIG_BOOTSTRAP, timeout=120,
                                  on_progress=trigger).wait()
        assert_mid_phase(trigger, outcome)
        code, message = assert_clear_error(outcome, {"deadline_exceeded"}, deployment=deploy)
        took = outcome.ended - trigger.fired_at
        assert "Test-Client" in message, message
        # the last heartbeat came at most one heartbeat (1 s) before the stall
        assert PEER_TIMEOUT_S - 1.5 <= took <= ERROR_AFTER_SHORT_STALL_S, f"{took:.1f}s"
        dropped = assert_dropped(tester)
        assert health_status(tester.address) == "SERVING"
    finally:
        client.cont()
    client_dropped = assert_dropped(client)
    next_audit_succeeds(deploy, tester)
    assert_dropped(tester)
    assert_dropped(client)
    assert_no_files(tester, client)
    _announce(request, f"Test-Client stalled (peer timeout {PEER_TIMEOUT_S}s): operator got ({code}) {message!r} "
                       f"{took:.2f}s after the stall; Tester dropped the session {dropped:.2f}s later; the "
                       f"resumed Test-Client {client_dropped:.2f}s after SIGCONT; next audit OK")


def test_test_client_stalled_under_the_tester_peer_timeout_of_15s(deploy, big, request):
    """The acceptance bar: `ppre tester serve --peer-timeout 15` (default heartbeats and
    keepalive; the Test-Client with its defaults), the Test-Client SIGSTOPped mid-audit.
    Expected: the operator's `ppre audit --json` prints `{"error": {"code":
    "deadline_exceeded", ...}}` and exits 2 within 45 s after the stall starts (not
    before the timeout could have run out); the Tester drops the session; after SIGCONT
    the Test-Client drops its session, and the next audit succeeds."""
    tester, client = deploy.pair(big, tester_kw={"peer_timeout": BAR_PEER_TIMEOUT_S})
    operator = deploy.operator(tester, big.name, as_json=True, bootstrap=BIG_BOOTSTRAP, timeout=150)
    try:
        assert wait_for(lambda: client.active_sessions() == 1, 60), deploy.logs()
        time.sleep(3.0)  # the Test-Client is now encrypting
        assert operator.proc.poll() is None, "the audit ended before the fault"
        stalled_at = time.monotonic()
        client.stop()
        outcome = operator.wait()
        error = assert_json_error(outcome, {"deadline_exceeded"}, deployment=deploy)["error"]
        took = outcome.ended - stalled_at
        # the last heartbeat (default every 5 s) came at most 5 s before the stall
        assert BAR_PEER_TIMEOUT_S - 6 <= took <= ERROR_AFTER_BAR_STALL_S, f"{took:.1f}s"
        dropped = assert_dropped(tester)
    finally:
        client.cont()
    client_dropped = assert_dropped(client, timeout=30)
    next_audit_succeeds(deploy, tester)
    assert_no_files(tester, client)
    _announce(request, f"bar: Test-Client stalled under --peer-timeout {BAR_PEER_TIMEOUT_S}: operator got "
                       f"{json.dumps({'error': error})} {took:.2f}s after the stall; Tester dropped the session "
                       f"{dropped:.2f}s later; resumed Test-Client {client_dropped:.2f}s after SIGCONT; next audit OK")


# --------------------------------------------------------------------------- a cut link

def cut_the_link_mid_encryption(deploy, big, tester, client, cut):
    """Cut the link (`cut()`) once the Test-Client encrypts; the operator must get
    `deadline_exceeded` in time and both services must drop the session. Returns the
    error's code and message, seconds to the error, and seconds to each drop."""
    trigger = Trigger("join", cut)  # the Test-Client encrypting its rows
    outcome = deploy.operator(tester, big.name, as_json=False, bootstrap=BIG_BOOTSTRAP, timeout=120,
                              on_progress=trigger).wait()
    assert_mid_phase(trigger, outcome)
    code, message = assert_clear_error(outcome, {"deadline_exceeded"}, deployment=deploy)
    took = outcome.ended - trigger.fired_at
    assert took <= ERROR_AFTER_SHORT_STALL_S, f"{took:.1f}s"
    return code, message, took, assert_dropped(tester), assert_dropped(client, timeout=30)


def test_link_cut_by_a_frozen_proxy(deploy, big, request):
    """Fault: the Tester reaches the Test-Client through a loopback TCP proxy, which stops
    forwarding (both sockets stay open: no FIN, no RST) while the Test-Client encrypts;
    both services run `--peer-timeout 5`. Expected: the operator gets `deadline_exceeded`
    within 15 s; the Tester drops the session at once, the Test-Client once its own peer
    timeout runs out; once the proxy forwards again the next audit succeeds."""
    tester, client = fast_pair(deploy, big, proxy=True)
    proxy = deploy.proxies[-1]
    code, message, took, tester_dropped, client_dropped = cut_the_link_mid_encryption(
        deploy, big, tester, client, proxy.freeze)
    assert proxy.frozen
    proxy.thaw()
    next_audit_succeeds(deploy, tester)
    assert_dropped(tester)
    assert_dropped(client)
    assert_no_files(tester, client)
    _announce(request, f"link cut (variant: loopback proxy that stops forwarding): operator got ({code}) "
                       f"{message!r} {took:.2f}s after the cut; Tester dropped the session {tester_dropped:.2f}s "
                       f"later, Test-Client {client_dropped:.2f}s later; next audit OK")


@pytest.fixture()
def veth_namespace(request):
    usable, why = netns_usable()
    if not usable:
        _announce(request, f"link cut variant netns: skipped ({why}); the proxy variant ran instead")
        pytest.skip(why)
    sweep_stale_namespaces()
    namespace = VethNamespace()
    try:
        namespace.setup()
    except Exception as exc:  # no CAP_NET_ADMIN, no netns support, ...
        _announce(request, f"link cut variant netns: skipped (setup failed: {exc})")
        pytest.skip(f"netns setup failed: {exc}")
    try:
        yield namespace
    finally:
        namespace.teardown()


def test_link_cut_in_a_network_namespace(veth_namespace, deploy, big, request):
    """Fault (root only): the Test-Client runs in its own network namespace, joined to
    the Tester's by one veth pair; the link is set down while the Test-Client encrypts.
    Expected: the operator gets `deadline_exceeded` within 15 s; both services drop the
    session; once the link is up again the next audit succeeds."""
    ns = veth_namespace
    port = free_loopback_port()  # any port is free in the new namespace
    tester, client = deploy.pair(
        big, client_address=f"{ns.ns_ip}:{port}",
        tester_kw={"peer_timeout": PEER_TIMEOUT_S, "env": dict(FAST_LINK)},
        client_kw={"peer_timeout": PEER_TIMEOUT_S, "env": dict(FAST_LINK), "host": "0.0.0.0", "port": port,
                   "prefix": ns.exec_prefix()})
    try:
        code, message, took, tester_dropped, client_dropped = cut_the_link_mid_encryption(
            deploy, big, tester, client, ns.link_down)
    finally:
        ns.link_up()
    next_audit_succeeds(deploy, tester)
    assert_dropped(tester)
    assert_dropped(client)
    assert_no_files(tester, client)
    _announce(request, f"link cut (variant: netns {ns.name}, veth {ns.host_if} set down): operator got ({code}) "
                       f"{message!r} {took:.2f}s after the cut; Tester dropped the session {tester_dropped:.2f}s "
                       f"later, Test-Client {client_dropped:.2f}s later; next audit OK")


# --------------------------------------------------------------------------- SIGTERM

@pytest.mark.parametrize("victim", ["tester", "client"])
def test_sigterm_mid_audit_ends_the_session_cleanly(deploy, big, request, victim):
    """Fault: SIGTERM to one service while the Test-Client encrypts. Expected: its health
    turns NOT_SERVING, the operator gets `shutting_down`, the process exits (status 0)
    within 10 s with its worker processes, the other service drops the session, and
    after a restart the next audit succeeds."""
    tester, client = fast_pair(deploy, big)
    target = tester if victim == "tester" else client
    statuses: list[str] = []
    done = threading.Event()

    def watch_health() -> None:
        deadline = time.monotonic() + 20
        while not done.is_set() and time.monotonic() < deadline:
            status = health_status(target.address, 0.5)
            if not statuses or statuses[-1] != status:
                statuses.append(status)
            if status == "UNREACHABLE" and not target.alive():
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=watch_health, daemon=True)

    def terminate() -> None:
        os.kill(target.pid, signal.SIGTERM)
        watcher.start()

    trigger = Trigger("join", terminate)  # the Test-Client encrypting its rows
    try:
        outcome = deploy.operator(tester, big.name, as_json=False, bootstrap=BIG_BOOTSTRAP, timeout=120,
                                  on_progress=trigger).wait()
        assert_mid_phase(trigger, outcome)
        code, message = assert_clear_error(outcome, {"shutting_down"}, deployment=deploy)
        assert "shutting down" in message, message
        took = outcome.ended - trigger.fired_at
        exit_status = target.proc.wait(timeout=max(1.0, 10.0 - (time.monotonic() - trigger.fired_at)))
        exited = time.monotonic() - trigger.fired_at
    finally:
        done.set()
        if watcher.is_alive():
            watcher.join(timeout=5)
    assert exit_status == 0, target.log_tail()
    assert wait_for(lambda: not group_pids(target.pid), 5), f"workers left: {group_pids(target.pid)}"
    assert "NOT_SERVING" in statuses, statuses
    survivor = client if victim == "tester" else tester
    dropped = assert_dropped(survivor)
    target.start()
    target.wait_healthy()
    next_audit_succeeds(deploy, tester)
    assert_dropped(tester)
    assert_dropped(client)
    assert_no_files(tester, client)
    _announce(request, f"SIGTERM to the {victim}: operator got ({code}) {message!r} {took:.2f}s later; health "
                       f"{' -> '.join(statuses)}; exited with {exit_status} {exited:.2f}s after SIGTERM; the "
                       f"other service dropped the session {dropped:.2f}s later; next audit OK")


# --------------------------------------------------------------------------- concurrency

def _request(dataset: str, bootstrap: int = TINY_BOOTSTRAP, seed: int = 1, **kw) -> pb.AuditRequest:
    return pb.AuditRequest(metric="ero", client_dataset=dataset, bootstrap=bootstrap, has_seed=True, seed=seed, **kw)


def _proto_estimates(event) -> list:
    from common.stats.results import AuditReport
    return [(g.group, g.estimate is not None, g.estimate, g.ci_low, g.ci_high)
            for g in AuditReport.from_proto(event.result).groups]


def max_active(service: ServiceProcess) -> int:
    return max((int(n) for n in ACTIVE_SESSIONS_RE.findall(service.log_bytes())), default=0)


def test_eight_concurrent_audits_match_the_lone_audit(deploy, tiny, request):
    """No fault: with `--max-sessions 8` on both services, 8 audits start at once (same
    request, same seed). Expected: all 8 succeed with exactly the estimates and
    intervals of the same audit run alone, the services really ran them concurrently,
    and both end with no session and no file written."""
    from tester_service.server import run_audit

    tester, client = deploy.pair(tiny, tester_kw={"max_sessions": 8}, client_kw={"max_sessions": 8})
    t0 = time.monotonic()
    # result recipient tester: the operator reads the estimates from the Tester (with
    # `client` only the Test-Client would hold them: design §3.7)
    alone = run_audit(tester.address, _request(tiny.name, result_recipient="tester"), timeout=120)
    alone_s = time.monotonic() - t0
    assert alone.WhichOneof("event") == "result", alone
    assert tester.wait_sessions(0, DROP_S) and client.wait_sessions(0, DROP_S)
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(run_audit, tester.address, _request(tiny.name, result_recipient="tester"), timeout=240)
                   for _ in range(8)]
        events = [f.result(timeout=300) for f in futures]
    together_s = time.monotonic() - t0
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds == ["result"] * 8, [e.error for e in events if e.WhichOneof("event") != "result"]
    reference = _proto_estimates(alone)
    for event in events:
        assert json.loads(event.result.report_json)["n_matched"] == N_TINY_OVERLAP
        got = _proto_estimates(event)
        # Each audit draws fresh masks and pads; the ratios agree to about 1e-11 (common.crypto.masking).
        assert [g[:2] for g in got] == [g[:2] for g in reference], (got, reference)
        assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
                   for g, r in zip(got, reference) for a, b in zip(g[2:], r[2:])), (got, reference)
    peak = (max_active(tester), max_active(client))
    assert min(peak) >= 2, f"the audits did not overlap: peak sessions {peak}"
    assert max(peak) <= 8, peak
    assert_dropped(tester)
    assert_dropped(client)
    assert_no_files(tester, client)
    _announce(request, f"concurrency: 8 audits at once, all identical to the lone audit; alone {alone_s:.1f}s, "
                       f"8 together {together_s:.1f}s; peak active sessions Tester {peak[0]}, Test-Client {peak[1]}")


@pytest.mark.parametrize("limited", ["tester", "client"])
def test_an_audit_beyond_the_session_limit_is_refused(deploy, big, request, limited):
    """With `--max-sessions 1` on one service, a second audit starts while the first runs.
    Expected: the second gets `resource_exhausted` at once, with a message naming the
    limit (relayed from the Test-Client when its limit is the one hit); the first audit
    succeeds; afterwards both services hold no session."""
    tester_kw = {"max_sessions": 1 if limited == "tester" else 4}
    client_kw = {"max_sessions": 1 if limited == "client" else 4}
    tester, client = deploy.pair(big, tester_kw=tester_kw, client_kw=client_kw)
    refused: list[Outcome] = []

    def second_audit() -> None:
        refused.append(deploy.operator(tester, "small", as_json=True, timeout=60).wait())

    # the running audit is the big one: after its shuffled table it still has seconds of work,
    # more than the second operator's process takes to start (the small one could end first)
    trigger = Trigger("psi_shuffled", second_audit)
    first = deploy.operator(tester, big.name, as_json=False, bootstrap=20, timeout=120, on_progress=trigger).wait()
    assert trigger.fired_at is not None, first.describe()
    assert first.rc == 0, f"the running audit failed: {first.describe()}\n{deploy.logs()}"
    assert len(refused) == 1
    error = assert_json_error(refused[0], {"resource_exhausted"}, deployment=deploy)["error"]
    assert "--max-sessions 1" in error["message"] and "limit" in error["message"], error
    assert ("Test-Client" if limited == "client" else "Tester") in error["message"], error
    took = refused[0].ended - refused[0].started
    assert_dropped(tester)
    assert_dropped(client)
    assert_no_files(tester, client)
    _announce(request, f"session limit 1 on the {limited}: extra audit got {json.dumps({'error': error})} in "
                       f"{took:.1f}s (operator process included); the running audit succeeded")


# --------------------------------------------------------------------------- soak

@dataclass(frozen=True)
class Soak:
    """A soak's length: its audits, the warm-up after which nothing may grow, how often it
    samples, and the window of audits whose median RSS is compared (right after the warm-up
    against the last)."""

    audits: int
    warmup: int
    sample_every: int
    window: int


#: the long tier's soak, and the suite's: the same assertions over fewer audits
LONG_SOAK = Soak(audits=200, warmup=50, sample_every=10, window=50)
SUITE_SOAK = Soak(audits=60, warmup=20, sample_every=5, window=20)
#: the most handler threads either service's pool may start (both run with the default session limit)
SOAK_HANDLER_WORKERS = channels.handler_workers(max(tester_server.TesterConfig.max_sessions, ClientConfig.max_sessions))


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("soak", [pytest.param(LONG_SOAK, marks=[pytest.mark.long, pytest.mark.cost(320)], id="200"),
                                  pytest.param(SUITE_SOAK, marks=pytest.mark.cost(30), id="60")])
def test_soak_audits_do_not_grow_memory_fds_or_threads(soak, deploy, tiny, request):
    """No fault: consecutive tiny audits (200 in the long tier, 60 in the suite; 200
    members, B = 20, the tests' Paillier keys) against one pair of long-running service
    processes; each audit starts once both
    services logged the previous session closed. `PPRE_WORKERS=1`: each service is one
    process, so its /proc status (VmRSS, Threads) and /proc/PID/fd cover all it holds
    (the process group is measured too, to prove it). Sampled every `sample_every` audits.
    Expected, after the warm-up (the allocator's arenas fill up over the first
    tens of audits): resident memory grows by at most 10% (median of the samples of the
    last `window` audits against the median of the `window` after warm-up: single samples swing by
    ±10% with the allocator), and open descriptors and our threads do not grow (every
    sample after warm-up at most the warm-up's; gRPC's on-demand EventEngine pool may add
    a few, bounded)."""
    from tester_service.server import run_audit

    env = {"PPRE_WORKERS": "1"}
    tester, client = deploy.pair(tiny, tester_kw={"env": env}, client_kw={"env": env}, test_keys=True)
    samples: dict[int, tuple] = {0: (tester.usage(), client.usage())}
    durations = []
    t_start = time.monotonic()
    for i in range(1, soak.audits + 1):
        t0 = time.monotonic()
        event = run_audit(tester.address, _request(tiny.name), timeout=120)
        durations.append(time.monotonic() - t0)
        assert event.WhichOneof("event") == "result", (i, event)
        assert tester.wait_sessions(0, DROP_S) and client.wait_sessions(0, DROP_S), (i, deploy.logs())
        if i % soak.sample_every == 0:
            time.sleep(0.3)
            samples[i] = (tester.usage(), client.usage())
    total_s = time.monotonic() - t_start
    lines = [f"soak: {soak.audits} audits in {total_s:.0f}s (per audit: median {statistics.median(durations):.2f}s, "
             f"max {max(durations):.2f}s)"]
    for i, (t, c) in sorted(samples.items()):
        lines.append(f"  after {i:3d}: Tester {t}; Test-Client {c}")
    early = [i for i in samples if soak.warmup < i <= soak.warmup + soak.window]
    late = [i for i in samples if i > soak.audits - soak.window]
    verdicts = []
    for side, name in ((0, "Tester"), (1, "Test-Client")):
        rss_early = statistics.median(samples[i][side].rss_kib for i in early)
        rss_late = statistics.median(samples[i][side].rss_kib for i in late)
        verdicts.append((name, rss_early, rss_late))
        lines.append(f"  {name}: median RSS {rss_early / 1024:.1f} MiB (audits {early[0]}-{early[-1]}) -> "
                     f"{rss_late / 1024:.1f} MiB (audits {late[0]}-{late[-1]}): {100 * (rss_late / rss_early - 1):+.1f}%")
    _announce(request, "\n".join(lines))
    for side, (name, rss_early, rss_late) in enumerate(verdicts):
        warm = samples[soak.warmup][side]
        after = [samples[i][side] for i in sorted(samples) if i > soak.warmup]
        assert all(u.group_processes == 1 for u in after), f"{name}: PPRE_WORKERS=1 should mean one process"
        assert rss_late <= 1.10 * rss_early, f"{name}: median RSS {rss_early} -> {rss_late} KiB"
        assert max(u.fds for u in after) <= warm.fds, f"{name}: fds {warm.fds} -> {[u.fds for u in after]}"
        # our threads must not grow at all; gRPC's EventEngine pool may add a thread or two
        # under load (it grows on demand, bounded), where a leak would add one per audit
        assert max(u.own_threads for u in after) <= warm.own_threads, \
            f"{name}: own threads {warm.own_threads} -> {[u.own_threads for u in after]}"
        assert max(u.pool_threads for u in after) <= warm.pool_threads + 4, \
            f"{name}: gRPC pool threads {warm.pool_threads} -> {[u.pool_threads for u in after]}"
        # the handler pool starts a thread when a call finds none idle, never more than its workers
        assert max(u.handler_threads for u in after) <= SOAK_HANDLER_WORKERS, \
            f"{name}: handler threads {[u.handler_threads for u in after]}"
    assert_no_files(tester, client)
