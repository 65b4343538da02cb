"""`--executor dask://HOST:PORT` (common/execution/dask_executor.py) on real Dask clusters started here.

* an ERO audit through both services (`ppre.local.local_services`) with their per-row work
  on a two-process Dask cluster gives the same estimates and intervals as the same audit
  inline, and the cluster's workers really ran every chunk;
* after it, nothing under the cluster's local directory, the workers' TMPDIR or this
  test's TMPDIR, and nothing the workers logged, holds a member id or a key (the Paillier
  primes and the X25519 scalars, captured as they are generated, as
  tests/test_secrets_at_rest.py does);
* a cluster whose workers could spill task data to disk is refused (InputError naming
  --executor), and a spilling worker that joins later gets no task; a malformed address,
  an unreachable scheduler and a TLS address without TLS settings are refused quickly;
* a task's exception comes back without the worker logging the task; `shutdown` leaves
  the cluster running;
* docker-compose.yml's `dask` profile is valid (`docker compose --profile dask config`):
  a scheduler and workers from the project's image, spilling off, no published port, and
  both services reading PPRE_EXECUTOR.
"""
from __future__ import annotations

import logging
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dask
import distributed
import pytest
import yaml

from client_service.datasets import DatasetRegistry
from common.execution import parallel
from common.execution.dask_executor import DaskExecutor, parse_address
from common.execution.executors import executor_from_spec
from common.errors import InputError, ShuttingDownError
from common.stats.results import AuditReport
from ppre.local import local_services
from proto import ppre_pb2 as pb
from tester_service.inputs import read_probability_table
from tester_service.server import run_audit
from tests.helpers import NO_RELEASE_CONTROLS, TEST_BITS, free_loopback_port, wait_until, write_inputs
from tests.test_secrets_at_rest import _int_bytes, captured  # noqa: F401  (the fixture)

ROOT = Path(__file__).resolve().parents[1]
SPILL_OFF = {"distributed.worker.memory.target": False, "distributed.worker.memory.spill": False}
SPILL_OFF_ENV = {"DASK_DISTRIBUTED__WORKER__MEMORY__TARGET": "False",
                 "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL": "False"}


def _executed(client: distributed.Client) -> dict[str, int]:
    """Tasks each worker has run."""
    return client.run(lambda dask_worker: dask_worker.state.executed_count)


@pytest.fixture(autouse=True)
def _keep_this_process_dumpable(monkeypatch):
    """The executor's worker check turns core dumps off where the worker runs, which for
    the in-process clusters below is the test process itself: not here (the process-based
    cluster checks it on its workers)."""
    monkeypatch.setattr("common.execution.memory.protect_process", lambda: None)


def _in_process_cluster(**memory) -> distributed.LocalCluster:
    """One worker thread in this process, with the given worker memory settings."""
    with dask.config.set({f"distributed.worker.memory.{k}": v for k, v in memory.items()}):
        return distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://",
                                        host="127.0.0.1", dashboard_address=None)


# --------------------------------------------------------------------------- an audit on a cluster

def _audit(executor, tp, cp) -> AuditReport:
    with local_services(lambda: read_probability_table(tp), DatasetRegistry(named={"ero": cp}),
                        modulus_bits=TEST_BITS, allow_insecure=True, release=NO_RELEASE_CONTROLS,
                        executor=executor) as svc:
        event = run_audit(svc.tester_address, pb.AuditRequest(metric="ero", client_dataset="ero", bootstrap=30,
                                                              has_seed=True, seed=5), timeout=120)
        assert event.WhichOneof("event") == "result", event
        assert wait_until(lambda: svc.client_servicer.active_sessions == 0 and svc.tester_config.sessions == [])
    return AuditReport.from_proto(event.result)


def _numbers(report: AuditReport) -> list[float | None]:
    return [x for g in report.groups for x in (g.estimate, g.ci_low, g.ci_high)]


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=0, abs_tol=1e-9)


@pytest.mark.slow
def test_audit_on_a_dask_cluster_matches_inline_and_leaves_nothing_at_rest(tmp_path, monkeypatch, captured, capfd):
    data, scratch, temp = tmp_path / "data", tmp_path / "dask", tmp_path / "tmp"
    for d in (data, scratch, temp):
        d.mkdir()
    tester, client, tp, cp = write_inputs(data, 150, 120, seed=31)
    # The worker processes inherit this environment: spilling off, and their TMPDIR here.
    for key, value in {**SPILL_OFF_ENV, "TMPDIR": str(temp)}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(tempfile, "tempdir", None)
    with dask.config.set(SPILL_OFF):
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           local_directory=str(scratch), dashboard_address=None)
    observer = None
    try:
        observer = distributed.Client(cluster, set_as_default=False)
        address = cluster.scheduler_address.replace("tcp://", "dask://")
        executor = executor_from_spec(address)
        assert isinstance(executor, DaskExecutor) and executor.name == address
        submitted = []
        real = executor.submit

        def counting(fn, *args):
            submitted.append(type(fn).__name__ if not hasattr(fn, "__name__") else fn.__name__)
            return real(fn, *args)
        monkeypatch.setattr(executor, "submit", counting)
        try:
            on_dask = _audit(executor, tp, cp)      # not started: the first chunk connects
            assert executor.started and executor.workers == 2
        finally:
            executor.shutdown()
        inline = _audit(parallel.InlineExecutor(), tp, cp)

        assert on_dask.n_matched == inline.n_matched == 120
        assert [g.group for g in on_dask.groups] == [g.group for g in inline.groups]
        a, b = _numbers(on_dask), _numbers(inline)
        assert all(_close(x, y) for x, y in zip(a, b)), (a, b)
        assert any(x is not None for x in a)
        # every chunk ran on the cluster, on both workers; the Paillier decryption among them
        executed = _executed(observer)
        assert len(executed) == 2 and all(executed.values()), executed
        assert sum(executed.values()) == len(submitted) >= 8, (executed, submitted)
        assert "ModPDecryption" in submitted, submitted
        # the check turned core dumps off in each worker process (the real protect_process
        # runs there: the no-op above is this process's only)
        assert set(observer.run(resource.getrlimit, resource.RLIMIT_CORE).values()) == {(0, 0)}

        # Nothing at rest: every file under the cluster's directory, the workers' TMPDIR and
        # the rest of this test's directory (but the inputs), while the workers still run.
        assert len(captured.paillier) == 2 and len(captured.com) >= 4
        members = [m.encode() for m in set(tester.member_id) | set(client.member_id)]
        secrets = {f"{name} (bytes {i})": form for name, x in captured.key_ints().items()
                   for i, form in enumerate(_int_bytes(x))}
        secrets.update({name: text.encode() for name, text in captured.key_text().items()})
        secrets.update(captured.key_bytes())
        assert [n for n, s in secrets.items() if s in f"x{captured.paillier[0].p:x}y".encode()]  # it would see one
        files = [p for p in tmp_path.rglob("*") if p.is_file() and data not in p.parents]
        assert any(scratch in p.parents for p in files), files  # the workers' directory is there
        for path in files:
            blob = path.read_bytes()
            assert not [m for m in members if m in blob], path
            assert not [n for n, s in secrets.items() if s in blob], path
    finally:
        if observer is not None:
            observer.close()
        cluster.close()
    out, err = capfd.readouterr()        # what the workers and the scheduler logged
    logged = (out + err).encode()
    assert not [m for m in members if m in logged]
    assert not [n for n, s in secrets.items() if s in logged]


# --------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("memory", [{"target": 0.6, "spill": 0.7}, {"target": False, "spill": 0.7},
                                    {"target": 0.6, "spill": False}], ids=["default", "spill", "target"])
def test_a_cluster_whose_workers_can_spill_is_refused(memory):
    cluster = _in_process_cluster(**memory)
    try:
        executor = DaskExecutor(cluster.scheduler_address)
        with pytest.raises(InputError) as info:
            executor.start()
        message = str(info.value)
        assert info.value.parameter == "--executor" and "'--executor'" in message
        assert "DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False" in message, message
        assert "DASK_DISTRIBUTED__WORKER__MEMORY__TARGET=False" in message, message
        assert not executor.started
        with pytest.raises(InputError):  # and stays refused: no task reaches the cluster
            executor.submit(pow, 2, 3)
    finally:
        cluster.close()


def test_a_spilling_worker_that_joins_later_gets_no_task(monkeypatch):
    monkeypatch.setattr("common.execution.dask_executor.REFRESH_S", 0.0)
    cluster = _in_process_cluster(**{"target": False, "spill": False})
    executor = DaskExecutor(cluster.scheduler_address)
    try:
        executor.start()
        good = executor.checked_workers()
        assert len(good) == 1 and executor.workers == 1
        with dask.config.set({"distributed.worker.memory.target": 0.6, "distributed.worker.memory.spill": 0.7}):
            cluster.scale(2)
            cluster.wait_for_workers(2, timeout=30)
        assert executor.checked_workers(refresh=True) == good
        assert list(executor.stream(pow, [(2, i) for i in range(12)])) == [2 ** i for i in range(12)]
        observer = distributed.Client(cluster, set_as_default=False)
        try:
            executed = _executed(observer)
        finally:
            observer.close()
        assert len(executed) == 2 and executed == {**dict.fromkeys(executed, 0), **{a: 12 for a in good}}, executed
    finally:
        executor.shutdown()
        cluster.close()


@pytest.mark.parametrize("spec", ["dask://", "dask://:8786", "dask://host:port", "dask://host:99999",
                                  "dask://host:0", "dask://a b:8786", "dask://user@host:8786",
                                  "dask://host:8786/path", "tcp://host:8786:1", "dask:/host:8786"])
def test_a_malformed_address_is_refused(spec):
    t0 = time.monotonic()
    with pytest.raises(InputError) as info:
        executor_from_spec(spec)
    assert info.value.parameter == "--executor" and "dask://HOST:PORT" in str(info.value)
    assert time.monotonic() - t0 < 1


def test_addresses():
    assert parse_address("dask://scheduler:8786") == ("tcp://scheduler:8786", "dask://scheduler:8786")
    assert parse_address("tcp://10.0.0.5:9000") == ("tcp://10.0.0.5:9000", "dask://10.0.0.5:9000")
    assert parse_address("tls://dask-scheduler:8786") == ("tls://dask-scheduler:8786", "tls://dask-scheduler:8786")
    assert parse_address("dask://[::1]:8786") == ("tcp://[::1]:8786", "dask://[::1]:8786")
    assert parse_address(" dask://scheduler ") == ("tcp://scheduler:8786", "dask://scheduler:8786")


def test_an_unreachable_scheduler_is_refused_quickly():
    port = free_loopback_port()
    executor = DaskExecutor(f"dask://127.0.0.1:{port}", connect_timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(InputError) as info:
        executor.start()
    assert time.monotonic() - t0 < 5
    message = str(info.value)
    assert info.value.parameter == "--executor" and f"dask://127.0.0.1:{port}" in message, message
    assert "scheduler" in message
    assert not executor.started


def test_a_plain_tcp_link_off_loopback_is_warned_about(caplog):
    caplog.set_level(logging.WARNING, logger="ppre.dask")
    with pytest.raises(InputError):
        DaskExecutor("dask://192.0.2.1:8786", connect_timeout=0.5).start()   # TEST-NET-1: nothing answers
    assert "not encrypted" in caplog.text and "tls://" in caplog.text, caplog.text


def test_a_tls_address_needs_dask_tls_settings():
    t0 = time.monotonic()
    with pytest.raises(InputError) as info:
        DaskExecutor(f"tls://127.0.0.1:{free_loopback_port()}").start()
    assert time.monotonic() - t0 < 2
    assert info.value.parameter == "--executor" and "DASK_DISTRIBUTED__COMM__TLS__CA_FILE" in str(info.value)


# --------------------------------------------------------------------------- tasks, shutdown

def _fails(x):
    raise ValueError(f"chunk failed after {len(x)} values")


def test_a_failing_task_is_raised_here_and_not_logged_by_the_worker():
    """Dask's worker logs a failed task ("Compute Failed", with its exception and
    traceback, and in some versions the start of its arguments): a chunk that fails
    through the executor comes back as a value and is raised here, so the worker logs
    nothing of it."""
    records: list[str] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("distributed")
    logger.addHandler(handler)
    cluster = _in_process_cluster(target=False, spill=False)
    executor = DaskExecutor(cluster.scheduler_address)
    member_ids = ["m000123", "m000456"]
    try:
        raw = distributed.Client(cluster, set_as_default=False)   # the control: plain Dask logs them
        try:
            with pytest.raises(ValueError):
                raw.submit(_fails, member_ids).result()
        finally:
            raw.close()
        assert wait_until(lambda: any("Compute Failed" in r and "after 2 values" in r for r in records), 5), records
        records.clear()

        with pytest.raises(ValueError, match="after 2 values") as info:
            executor.submit(_fails, member_ids).result()
        assert "_fails" in str(info.value.__cause__)  # the worker's traceback, chained
        with pytest.raises(ValueError):
            list(executor.stream(_fails, [([1],), ([2],)]))
        assert executor.run_chunks(divmod, [(7, 2), (9, 4), (1, 1)]) == [(3, 1), (2, 1), (1, 0)]
        time.sleep(0.2)
        assert not [r for r in records if "Compute Failed" in r or "after 2 values" in r or "m000123" in r], records
    finally:
        logger.removeHandler(handler)
        executor.shutdown()
        cluster.close()


def test_a_task_stranded_on_gone_workers_is_submitted_again(monkeypatch):
    """A task may run only on the workers checked when it was submitted; when none of them
    is left (a restarted worker comes back under a new address), `result()` submits it
    again to the checked workers instead of waiting forever."""
    from common.execution.dask_executor import _DaskFuture, _Task

    monkeypatch.setattr("common.execution.dask_executor.POLL_S", 0.2)
    cluster = _in_process_cluster(target=False, spill=False)
    executor = DaskExecutor(cluster.scheduler_address)
    try:
        client = executor._get_client()
        gone = "tcp://127.0.0.1:9"
        stranded = client.submit(_Task(pow), 2, 5, key="stranded", workers=[gone], allow_other_workers=False)
        future = _DaskFuture(executor, stranded, pow, (2, 5), [gone])
        t0 = time.monotonic()
        assert future.result(timeout=30) == 32
        assert time.monotonic() - t0 < 10
        assert future.done() and future._future is None
    finally:
        executor.shutdown()
        cluster.close()


def test_shutdown_closes_the_client_not_the_cluster():
    cluster = _in_process_cluster(target=False, spill=False)
    try:
        executor = DaskExecutor(cluster.scheduler_address).start()
        future = executor.submit(pow, 3, 4)
        assert future.result() == 81 and future.result() == 81
        assert future._future is None      # released as soon as its result was taken
        executor.shutdown(wait=False)
        with pytest.raises(ShuttingDownError):
            executor.submit(pow, 2, 2)
        other = DaskExecutor(cluster.scheduler_address).start()  # the cluster still serves
        try:
            assert other.submit(pow, 2, 10).result() == 1024
        finally:
            other.shutdown()
    finally:
        cluster.close()


# --------------------------------------------------------------------------- the compose profile

def _compose_config(env: dict[str, str]) -> dict | None:
    from tests.processes import child_env
    from tests.test_compose import _docker_compose_cmd

    cmd = _docker_compose_cmd()
    if cmd is None:
        pytest.skip("neither `docker compose` nor `docker-compose` works here")
    proc = subprocess.run(cmd + ["-f", str(ROOT / "docker-compose.yml"), "--profile", "dask", "config"],
                          env=child_env(env), capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def _environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_compose_dask_profile_is_valid_and_keeps_task_data_in_memory():
    config = _compose_config({"PPRE_EXECUTOR": "dask://dask-scheduler:8786"})
    svcs = config["services"]
    assert {"dask-scheduler", "dask-worker", "tester", "client"} <= set(svcs), sorted(svcs)
    for name in ("tester", "client"):
        assert _environment(svcs[name])["PPRE_EXECUTOR"] == "dask://dask-scheduler:8786", name
    for name in ("dask-scheduler", "dask-worker"):
        svc = svcs[name]
        assert svc.get("profiles") == ["dask"], name
        assert not svc.get("ports"), f"{name}: nothing of the cluster is published on the host"
        assert svc.get("build") == svcs["tester"].get("build"), f"{name}: the services' own image"
        command = svc["command"]
        assert isinstance(command, list) and command[0] == "dask", command
    worker = svcs["dask-worker"]
    assert worker["command"][:3] == ["dask", "worker", "tcp://dask-scheduler:8786"], worker["command"]
    env = _environment(worker)
    assert env["DASK_DISTRIBUTED__WORKER__MEMORY__TARGET"] == "False", env
    assert env["DASK_DISTRIBUTED__WORKER__MEMORY__SPILL"] == "False", env
    assert svcs["dask-scheduler"]["command"][:2] == ["dask", "scheduler"]
    # the default deployment (no PPRE_EXECUTOR) keeps the local process pools
    default = _compose_config({})["services"]
    assert _environment(default["tester"])["PPRE_EXECUTOR"] == "processes"
    assert _environment(default["client"])["PPRE_EXECUTOR"] == "processes"


@pytest.mark.slow
def test_the_compose_cluster_commands_make_a_cluster_the_services_accept(tmp_path):
    """The profile's scheduler and worker commands and environment, run here as processes
    (the scheduler on a free loopback port, the workers' directory and TMPDIR under
    tmp_path): the executor accepts the cluster they make and runs chunks on both worker
    processes; the same worker command without the compose file's variables is refused."""
    dask_cli = Path(sys.executable).with_name("dask")
    if not dask_cli.is_file():
        pytest.skip(f"no `dask` command next to {sys.executable}")
    svcs = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    port = free_loopback_port()
    renames = {"8786": str(port), "tcp://dask-scheduler:8786": f"tcp://127.0.0.1:{port}",
               "/tmp/dask": str(tmp_path / "dask")}

    def argv(name: str, *extra: str) -> list[str]:
        command = svcs[name]["command"]
        assert command[0] == "dask", command
        return [str(dask_cli), *(renames.get(str(a), str(a)) for a in command[1:]), *extra]

    base = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
    base["TMPDIR"] = str(tmp_path)
    procs: list[subprocess.Popen] = []

    def start(args: list[str], env: dict[str, str], log: str) -> None:
        with open(tmp_path / log, "wb") as out:
            procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))

    executor = None
    try:
        start(argv("dask-scheduler", "--host", "127.0.0.1"), base, "scheduler.log")
        worker_env = {**base, **{k: str(v) for k, v in svcs["dask-worker"]["environment"].items()}}
        start(argv("dask-worker"), worker_env, "worker.log")
        executor = DaskExecutor(f"dask://127.0.0.1:{port}", connect_timeout=30).start()
        assert wait_until(lambda: len(executor.checked_workers(refresh=True)) == 2, 30), \
            (tmp_path / "worker.log").read_text()
        assert executor.workers == 2
        assert executor.run_chunks(pow, [(3, i) for i in range(8)]) == [3 ** i for i in range(8)]
        executor.shutdown()

        start(argv("dask-worker", "--name", "spilling"), base, "spilling-worker.log")
        refused = DaskExecutor(f"dask://127.0.0.1:{port}", connect_timeout=30)
        checker = distributed.Client(f"tcp://127.0.0.1:{port}", set_as_default=False, timeout=30)
        try:
            checker.wait_for_workers(4, timeout=30)
        finally:
            checker.close()
        with pytest.raises(InputError, match="DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False"):
            refused.start()
    finally:
        if executor is not None:
            executor.shutdown()
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
