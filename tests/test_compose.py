"""docker-compose.yml, exercised without (and, where one is reachable, with) a Docker engine.

The compose file is the deployment contract, so these tests read it back with PyYAML and
run exactly what it declares:

* every service's `command` is started with its `environment` (on top of os.environ);
  each container volume path is mapped to a temporary host directory filled with
  generated data (300 members each side, 50% overlap);
* services start in `depends_on` order and are polled with their own `healthcheck`
  (run with the service's environment, as Docker runs it); a one-shot service (one that
  others wait for with `service_completed_successfully`: `certs`, which runs `ppre certs
  init` into the volume both services read their TLS certificates from) is run to its end;
* the operator's `ppre audit --json` runs against the Tester, over mutual TLS with the
  operator certificate from that volume, and its JSON is checked.

Networking has two modes, chosen at run time and printed:

* ``netns`` (root and `ip netns` works): each service runs in its own network namespace,
  attached by a veth pair to a private bridge (10.231.X.0/24, X random and unused).
  Container hostnames resolve through ``/etc/netns/<ns>/hosts``, which `ip netns exec`
  bind-mounts over /etc/hosts, so ``client:50052`` is used verbatim. Ports are the
  declared ones (each namespace has its own port space); healthchecks run inside the
  service's namespace against 127.0.0.1, as Docker runs them; the operator runs in the
  root namespace, which holds the bridge's .1 address. Where iptables filters forwarded
  traffic (a running Docker engine sets the FORWARD policy to DROP), two ACCEPT rules for
  the test's own bridge are inserted for the test's duration.
* ``loopback`` (otherwise, or PPRE_TEST_NETWORK=loopback): service hostnames become
  127.0.0.1, ports are replaced by free loopback ports, and services bind 127.0.0.1.

Proxy variables are removed from the children's environment, so all traffic stays on
loopback or on the test's own namespaces. Processes, namespaces, links, iptables rules and
/etc/netns entries are removed in fixture finalizers, also on failure.

Where `docker info` answers and Compose is installed, the same file also runs on the real
engine (skipped otherwise, with the reason printed): the image is built by `compose build`
from the file's own `build:` block, with the build variables of the test's environment as
docs/deployment.md documents them (PPRE_BASE_IMAGE, PPRE_WHEELS, PPRE_INDEX_URL: set by
`. build/offline.env` after scripts/offline-build, which CI's .ci/docker-setup runs; unset,
the base image is pulled), `compose up -d` starts it under a unique project name with the
test's data and free host ports on the declared (loopback) address, and the operator
audits from the host. Then containers fail mid-audit: `docker kill` of the Test-Client, a
SIGKILL of the Tester's process (its restart policy must bring it back by itself), and
`docker pause` of the Test-Client (alive, connected, silent: the Tester's peer timeout,
set to DOCKER_PEER_TIMEOUT_S, must end the audit); each time the operator must get an
``{"error": ...}`` and exit status 2 within FAULT_REPORT_S, and the next audit must
succeed. `compose down -v` and removing the
image's tag clean up. The engine itself is not started here: CI's .ci/run starts one and
stops it on exit.

A last test checks, without starting anything, that the compose file's commands,
variables and ports are ones `ppre.cli.build_parser()` accepts.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from tests.helpers import free_loopback_port, netns_usable
from tests import processes
from tests.processes import NetnsNetwork, ppre_argv, sweep_stale_namespaces

log = logging.getLogger("test_compose")

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

#: The Tester's probability columns (common.races.RACES).
RACE_COLUMNS = ("white", "black", "api", "aian", "multiple", "hispanic")
DATASET = "claims"
N_EACH_SIDE = 300
N_OVERLAP = 150
BOOTSTRAP = 50
HEALTH_TIMEOUT_S = 60.0
AUDIT_TIMEOUT_S = 180.0



# --------------------------------------------------------------------------- compose file

def load_compose() -> dict:
    with open(COMPOSE_FILE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def services(compose: dict) -> dict[str, dict]:
    """The default deployment's services: those of no profile (the optional `dask` profile's
    cluster is tested by tests/test_dask.py)."""
    return {name: svc for name, svc in compose["services"].items() if not svc.get("profiles")}


_VARIABLE = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """`${NAME}`, `${NAME:-default}` and `${NAME-default}` as Compose resolves them, from
    `env` (default: the children's environment, which has no PPRE_ variable: the defaults)."""
    env = child_env() if env is None else env
    return _VARIABLE.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)


def published_addresses(service: dict, env: dict[str, str] | None = None) -> list[str]:
    """Host address of each `ports:` entry after interpolation ("" where the entry names none:
    Docker then publishes on every interface)."""
    out = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            out.append(interpolate(str(entry.get("host_ip", "")), env))
        else:
            parts = interpolate(str(entry), env).split("/")[0].rsplit(":", 2)
            out.append(parts[0].strip("[]") if len(parts) == 3 else "")
    return out


def build_variables(compose: dict) -> dict[str, str]:
    """{build argument: the variable its value reads}, from the shared `build:` block."""
    out = {}
    for arg, value in compose["services"]["tester"]["build"]["args"].items():
        match = _VARIABLE.fullmatch(str(value))
        assert match, f"build arg {arg}: {value!r} should be ${{VARIABLE:-default}}"
        out[arg] = match.group(1)
    return out


def container_ports(service: dict) -> list[int]:
    """Container side of each `ports:` entry ("C", "H:C", "IP:H:C", "H:C/tcp" or long form)."""
    out = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            out.append(int(entry["target"]))
        else:
            out.append(int(str(entry).split("/")[0].rsplit(":", 1)[-1]))
    return out


def volumes(service: dict) -> list[tuple[str, str]]:
    """(host source, container target) of each bind volume."""
    out = []
    for entry in service.get("volumes", []):
        if isinstance(entry, dict):
            out.append((entry["source"], entry["target"]))
        else:
            source, target = str(entry).split(":")[:2]
            out.append((source, target))
    return out


def healthcheck_argv(service: dict) -> list[str]:
    test = service["healthcheck"]["test"]
    if isinstance(test, str):
        return test.split()
    if test[0] == "CMD":
        return list(test[1:])
    if test[0] == "CMD-SHELL":
        return " ".join(test[1:]).split()
    raise AssertionError(f"unsupported healthcheck test {test!r}")


def depends_on(service: dict) -> list[str]:
    deps = service.get("depends_on", [])
    return list(deps) if isinstance(deps, (list, dict)) else []


def one_shot(compose: dict) -> set[str]:
    """Services others wait for to complete (`condition: service_completed_successfully`)."""
    out = set()
    for svc in services(compose).values():
        deps = svc.get("depends_on", {})
        if isinstance(deps, dict):
            out |= {name for name, dep in deps.items()
                    if isinstance(dep, dict) and dep.get("condition") == "service_completed_successfully"}
    return out


def certs_target(compose: dict) -> str:
    """The container path of the TLS certificates volume (what `ppre certs init` writes)."""
    command = services(compose)["certs"]["command"]
    assert command[:3] == ["ppre", "certs", "init"], command
    return command[3]


def start_order(compose: dict) -> list[str]:
    order: list[str] = []
    pending = dict(services(compose))
    while pending:
        ready = [name for name, svc in pending.items() if all(d in order for d in depends_on(svc))]
        assert ready, f"depends_on cycle among {sorted(pending)}"
        for name in sorted(ready):
            order.append(name)
            del pending[name]
    return order


def resolve_ppre(argv: list[str]) -> list[str]:
    return ppre_argv() + list(argv[1:]) if argv and argv[0] == "ppre" else list(argv)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The services' and commands' environment as the compose file declares it: no PPRE_
    setting of this test run, production keys (`tests.processes.child_env`)."""
    return processes.child_env(extra, test_keys=False)


# --------------------------------------------------------------------------- test data

def write_data(base: Path, compose: dict, *, seed: int = 0, n_each_side: int = N_EACH_SIDE,
               n_overlap: int = N_OVERLAP) -> dict[str, Path]:
    """Create every bind source under `base` and fill it from what the compose file declares.

    Returns {container path: host path} for all volumes of all services.
    """
    mounts: dict[str, Path] = {}
    for svc in services(compose).values():
        for source, target in volumes(svc):
            host = (base / source).resolve()
            host.mkdir(parents=True, exist_ok=True)
            host.chmod(0o755)
            mounts[target] = host

    def to_host(container_path: str) -> Path:
        for target, host in mounts.items():
            if container_path == target or container_path.startswith(target.rstrip("/") + "/"):
                return host / os.path.relpath(container_path, target)
        raise AssertionError(f"{container_path} is not under any mounted volume")

    rng = np.random.default_rng(seed)
    tester_ids = [f"m{i:06d}" for i in range(n_each_side)]
    client_ids = tester_ids[:n_overlap] + [f"x{i:06d}" for i in range(n_each_side - n_overlap)]
    probs = rng.dirichlet(np.full(len(RACE_COLUMNS), 0.7), n_each_side)
    tester = pd.DataFrame(probs, columns=list(RACE_COLUMNS))
    tester.insert(0, "member_id", tester_ids)
    client = pd.DataFrame({"member_id": client_ids,
                           "y_true": rng.integers(0, 2, n_each_side),
                           "y_pred": rng.integers(0, 2, n_each_side)})

    env = {k: str(v) for svc in services(compose).values() for k, v in (svc.get("environment") or {}).items()}
    data_file = to_host(env["PPRE_CLIENT_DATA_DIR"]) / f"{DATASET}.csv"
    files = [(data_file, client)]
    if "PPRE_TESTER_MEMBERS" in env:  # the Tester prepares BISG probabilities itself, per audit
        from ppre.synth import SynthConfig, synthesize
        synth = synthesize(SynthConfig(members=n_each_side, seed=seed))
        members = synth.members.assign(member_id=tester_ids)
        files.append((to_host(env["PPRE_TESTER_MEMBERS"]), members))
        if "PPRE_TESTER_SELF_ID" in env:
            rename = dict(zip(synth.members.member_id, tester_ids))
            files.append((to_host(env["PPRE_TESTER_SELF_ID"]),
                          synth.self_id.assign(member_id=synth.self_id.member_id.map(rename))))
    else:
        files.append((to_host(env["PPRE_TESTER_PROBABILITIES"]), tester))
    for path, frame in files:
        path.parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(path, index=False)
        path.chmod(0o644)
    return mounts


def map_paths(value: str, mounts: dict[str, Path]) -> str:
    for target, host in mounts.items():
        if value == target or value.startswith(target.rstrip("/") + "/"):
            return str(host / os.path.relpath(value, target))
    return value


# --------------------------------------------------------------------------- the running stack

@dataclass
class Stack:
    mode: str
    compose: dict
    workdir: Path
    mounts: dict[str, Path]
    network: NetnsNetwork | None = None
    #: loopback mode: (service, container port) -> host port
    port_map: dict[tuple[str, int], int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    logs: dict[str, Path] = field(default_factory=dict)

    # -- addressing --------------------------------------------------------------------
    def _rewrite_address(self, value: str, own: str) -> str:
        """loopback mode: `svc:PORT` / `127.0.0.1:PORT` -> 127.0.0.1:<free port>."""
        host, sep, port = value.rpartition(":")
        if not sep or not port.isdigit():
            return value
        target = own if host in ("127.0.0.1", "localhost", "0.0.0.0") else host
        if target in services(self.compose) and (target, int(port)) in self.port_map:
            return f"127.0.0.1:{self.port_map[(target, int(port))]}"
        return value

    def service_env(self, name: str) -> dict[str, str]:
        declared = {k: interpolate(str(v)) for k, v in (services(self.compose)[name].get("environment") or {}).items()}
        env = {k: map_paths(v, self.mounts) for k, v in declared.items()}
        if self.mode == "loopback":
            ports = container_ports(services(self.compose)[name])
            for key, value in list(env.items()):
                if value.isdigit() and int(value) in ports:
                    env[key] = str(self.port_map[(name, int(value))])
                    if key.endswith("_PORT"):
                        env[key[: -len("_PORT")] + "_HOST"] = "127.0.0.1"   # bind loopback only
                else:
                    env[key] = self._rewrite_address(value, name)
        return env

    def operator_address(self, name: str = "tester") -> str:
        port = container_ports(services(self.compose)[name])[0]
        if self.mode == "netns":
            return f"{self.network.addresses[name]}:{port}"
        return f"127.0.0.1:{self.port_map[(name, port)]}"

    def in_service(self, name: str, argv: list[str]) -> list[str]:
        argv = resolve_ppre(argv)
        if self.mode == "netns":
            return self.network.exec_prefix(name) + argv
        return [self._rewrite_address(a, name) for a in argv]

    # -- processes ---------------------------------------------------------------------
    def start(self, name: str) -> None:
        svc = services(self.compose)[name]
        command = svc["command"]
        assert isinstance(command, list), f"{name}: command must be list-form"
        command = [map_paths(a, self.mounts) for a in command]  # `ppre certs init /certs`
        self.logs[name] = self.workdir / f"{name}.log"
        with open(self.logs[name], "wb") as out:
            self.procs[name] = subprocess.Popen(self.in_service(name, command), env=child_env(self.service_env(name)),
                                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                cwd=self.workdir)

    def log_tail(self, name: str, n: int = 3000) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace")[-n:] if path and path.exists() else ""

    def healthy(self, name: str) -> bool:
        """The service's own compose healthcheck, run where and as Docker would run it (in the
        container's environment: PPRE_TLS_DIR gives it the certificates)."""
        argv = self.in_service(name, healthcheck_argv(services(self.compose)[name]))
        try:
            return subprocess.run(argv, env=child_env(self.service_env(name)), capture_output=True,
                                  timeout=20).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def wait_healthy(self, name: str, timeout: float = HEALTH_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self.procs[name]
            if proc.poll() is not None:
                raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")
            if self.healthy(name):
                return
            time.sleep(0.5)
        raise AssertionError(f"{name} not healthy after {timeout:.0f}s:\n{self.log_tail(name)}")

    def up(self) -> None:
        for name in start_order(self.compose):
            self.start(name)
            if name in one_shot(self.compose):
                proc = self.procs.pop(name)
                try:
                    rc = proc.wait(timeout=HEALTH_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
                    raise AssertionError(f"{name} did not finish:\n{self.log_tail(name)}") from None
                assert rc == 0, f"{name} exited with {rc}:\n{self.log_tail(name)}"
            else:
                self.wait_healthy(name)

    def down(self) -> None:
        for name in reversed(list(self.procs)):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    # -- the operator ------------------------------------------------------------------
    def audit(self, dataset: str) -> tuple[int, dict, str]:
        argv = ppre_argv() + ["audit", "--tester", self.operator_address(), "--client-dataset", dataset,
                              "--metric", "ero", "--bootstrap", str(BOOTSTRAP), "--seed", "1", "--json",
                              "--result-recipient", "tester",  # the operator reads the estimates
                              "--tls-dir", str(self.mounts[certs_target(self.compose)])]
        proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=AUDIT_TIMEOUT_S)
        lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
        assert len(lines) == 1, f"expected one JSON line, got stdout={proc.stdout!r} stderr={proc.stderr!r}"
        return proc.returncode, json.loads(lines[0]), proc.stderr


def _announce(request, message: str) -> None:
    """Print the network mode where `pytest -q` shows it (and into the captured output/log)."""
    print(message)
    log.info(message)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\n[test_compose] {message}")


@pytest.fixture(scope="module")
def stack(request, tmp_path_factory):
    compose = load_compose()
    workdir = tmp_path_factory.mktemp("compose")
    mounts = write_data(workdir, compose)
    names = start_order(compose)

    network, mode, why = None, "loopback", ""
    usable, why = netns_usable()
    if usable:
        sweep_stale_namespaces()
        network = NetnsNetwork(names)
        try:
            network.setup()
            mode = "netns"
        except Exception as exc:  # no CAP_NET_ADMIN, no netns support, ...
            why = f"netns setup failed: {exc}"
            network = None
    deployment = Stack(mode=mode, compose=compose, workdir=workdir, mounts=mounts, network=network)
    if mode == "loopback":
        for name in names:
            for port in container_ports(services(compose)[name]):
                deployment.port_map[(name, port)] = free_loopback_port()
        _announce(request, f"network mode: loopback ({why}); ports {deployment.port_map}")
    else:
        _announce(request, f"network mode: netns (subnet {network.subnet}, bridge {network.bridge}, "
                           f"namespaces {network.namespaces}, addresses {network.addresses})")
    try:
        deployment.up()
        yield deployment
    finally:
        deployment.down()
        if network is not None:
            network.teardown()


def check_result(result: dict, n_matched: int = N_OVERLAP) -> None:
    assert result.get("metric") == "ero", result
    assert result["n_matched"] == n_matched, result
    # the deployment runs with the release controls on: noise, and ERO's interval from
    # parametric draws of its released aggregates and second moments (common.stats.moments)
    assert result["release"]["controls"] and result["release"]["rho"] > 0, result
    assert result["interval"] == "percentile" and result["release"]["interval_from"].startswith("second moments"), \
        result
    groups = result["groups"]
    assert [g["group"] for g in groups] == [*RACE_COLUMNS, "overall"], groups
    assert result["verdict"]["rule"] == "range", result
    for g in groups:
        est = g["estimate"]
        if est is None or g["ci_low"] is None:  # a random group's noised denominator within 3 sd of 0
            continue
        assert g["ci_low"] - 1e-9 <= est <= g["ci_high"] + 1e-9, g


# --------------------------------------------------------------------------- tests

@pytest.mark.slow
def test_compose_services_run_an_audit(stack):
    rc, result, stderr = stack.audit(DATASET)
    assert rc == 0, (result, stderr, stack.log_tail("tester"), stack.log_tail("client"))
    check_result(result)
    assert all(stack.healthy(name) for name in stack.procs)


@pytest.mark.slow
def test_services_stay_healthy_after_a_failed_audit(stack):
    bad = "no_such_dataset"
    rc, result, stderr = stack.audit(bad)
    assert rc == 2, (rc, result, stderr)
    assert set(result) == {"error"}, result
    message = json.dumps(result["error"])
    assert bad in message and "dataset" in message, result
    for name, proc in stack.procs.items():
        assert proc.poll() is None, f"{name} died after a failed audit:\n{stack.log_tail(name)}"
        assert stack.healthy(name), f"{name} unhealthy after a failed audit:\n{stack.log_tail(name)}"
    rc, result, stderr = stack.audit(DATASET)
    assert rc == 0, (result, stderr)
    check_result(result)


# --------------------------------------------------------------------------- a real Docker engine

#: The Docker variant's data: large enough that an audit lasts seconds on 2 cores, so that
#: a container can be killed while the two services are exchanging messages.
DOCKER_N_EACH_SIDE = 3000
DOCKER_N_OVERLAP = 1500
#: The services' PPRE_PEER_TIMEOUT in the Docker variant: a frozen peer must end the audit
#: in seconds, not in the default's minutes (heartbeats keep a busy peer's link alive).
DOCKER_PEER_TIMEOUT_S = 10
#: How long the operator may take to report a killed or frozen peer: failing fast is the point.
FAULT_REPORT_S = DOCKER_PEER_TIMEOUT_S + 20.0
#: Building the image: minutes on a cold cache (apt inside a bare base, or pip from an index).
BUILD_TIMEOUT_S = 900


def _docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["docker", *args], env=child_env(), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"`docker {' '.join(args)}` failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def _docker_compose_cmd() -> list[str] | None:
    """`docker compose` (v2 plugin), else `docker-compose` (v1 or v2 standalone)."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if not shutil.which(cmd[0]):
            continue
        try:
            out = subprocess.run(cmd + ["version", "--short"], env=child_env(), capture_output=True, text=True,
                                 timeout=30)
        except subprocess.TimeoutExpired:
            continue
        if out.returncode == 0 and re.match(r"v?\d+\.", out.stdout.strip()):
            return cmd
    return None


def docker_unavailable() -> str:
    """Why the Docker variant cannot run here ("" when it can)."""
    if not shutil.which("docker"):
        return "no `docker` client on PATH"
    try:
        info = _docker("info", "--format", "{{.ServerVersion}}", timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "`docker info` timed out"
    if info.returncode != 0:
        return f"no Docker engine reachable (`docker info`: {(info.stderr or info.stdout).strip()[:200]})"
    if _docker_compose_cmd() is None:
        return "Docker engine reachable but neither `docker compose` nor `docker-compose` works"
    return ""


def _established_from_peer(tcp_table: str, port: int) -> bool:
    """Does a /proc/net/tcp table hold an established connection to `port` from another
    address than loopback (the other container, not a healthcheck)?"""
    for line in tcp_table.splitlines()[1:]:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        if state == "01" and int(local.split(":")[1], 16) == port and not remote.startswith("0100007F:"):
            return True
    return False


@dataclass
class DockerStack:
    """One compose project on a real engine: the repository's compose file with the test's image,
    data (bind mounts from a temporary directory) and published ports (free loopback ports)."""

    compose_cmd: list[str]
    project: str
    compose_file: Path
    image: str
    compose: dict
    #: (service, container port) -> published loopback port
    ports: dict[tuple[str, int], int]
    #: the host directory bind-mounted as the certificates volume (the operator's --tls-dir)
    certs: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 300,
            check: bool = True) -> subprocess.CompletedProcess:
        """`compose ARGS` on the test's project; `env`: variables the file reads (build args)."""
        argv = self.compose_cmd + ["-p", self.project, "-f", str(self.compose_file), *args]
        proc = subprocess.run(argv, env=child_env(env), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"`{' '.join(argv)}` failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                                 f"{proc.stderr[-3000:]}\n{self.logs()}")
        return proc

    def logs(self) -> str:
        try:
            return self.run("logs", "--no-color", "--tail", "40", timeout=60, check=False).stdout[-5000:]
        except subprocess.TimeoutExpired:
            return "(`logs` timed out)"

    def container(self, service: str) -> str:
        ids = _docker("ps", "-aq", "--filter", f"label=com.docker.compose.project={self.project}",
                      "--filter", f"label=com.docker.compose.service={service}").stdout.split()
        assert len(ids) == 1, f"{service}: expected one container, found {ids}"
        return ids[0]

    def state(self, service: str) -> tuple[str, str, int]:
        """(status, health, restart count) of the service's container."""
        fmt = "{{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}-{{end}} {{.RestartCount}}"
        status, health, restarts = _docker("inspect", "-f", fmt, self.container(service)).stdout.split()
        return status, health, int(restarts)

    def wait_healthy(self, timeout: float = HEALTH_TIMEOUT_S) -> None:
        """Every service running and healthy by its own compose healthcheck."""
        deadline = time.monotonic() + timeout
        states = {}
        while time.monotonic() < deadline:
            states = {name: self.state(name)[:2] for name in services(self.compose)
                      if name not in one_shot(self.compose)}
            if all(s == ("running", "healthy") for s in states.values()):
                return
            time.sleep(0.5)
        raise AssertionError(f"not healthy after {timeout:.0f}s: {states}\n{self.logs()}")

    def up(self) -> None:
        self.run("up", "-d", timeout=300)
        self.wait_healthy()

    def crash(self, service: str) -> None:
        """SIGKILL the service's own process (the child of the container's init), from inside
        the container, so that this works on any engine (also one in a VM)."""
        # Not checked: the container stops with its process, which may end this `exec` too.
        self.exec(service, "kill -KILL $(cat /proc/1/task/1/children)", check=False)

    def exec(self, service: str, script: str, check: bool = True) -> str:
        return _docker("exec", self.container(service), "sh", "-c", script, timeout=30, check=check).stdout

    def audit_argv(self, dataset: str = DATASET) -> list[str]:
        port = self.ports[("tester", container_ports(services(self.compose)["tester"])[0])]
        return ppre_argv() + ["audit", "--tester", f"127.0.0.1:{port}", "--client-dataset", dataset,
                              "--metric", "ero", "--bootstrap", str(BOOTSTRAP), "--seed", "1", "--json",
                              "--result-recipient", "tester",  # the operator reads the estimates
                              "--tls-dir", str(self.certs)]

    def audit(self, dataset: str = DATASET) -> tuple[int, dict, str]:
        proc = subprocess.run(self.audit_argv(dataset), env=child_env(), capture_output=True, text=True,
                              timeout=AUDIT_TIMEOUT_S)
        return proc.returncode, _one_json(proc.stdout, proc.stderr), proc.stderr

    def audit_with_fault(self, victim: str, inject) -> tuple[int, dict, str, float]:
        """Start an audit, call `inject()` once the Tester is connected to the Test-Client (an
        established peer connection in the Test-Client's namespace), and return the operator's
        (exit status, JSON, stderr, seconds from the fault to the operator's answer)."""
        peer_port = container_ports(services(self.compose)["client"])[0]
        proc = subprocess.Popen(self.audit_argv(), env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        try:
            deadline = time.monotonic() + AUDIT_TIMEOUT_S
            while not _established_from_peer(self.exec("client", "cat /proc/net/tcp"), peer_port):
                if proc.poll() is not None:
                    out, err = proc.communicate()
                    raise AssertionError(f"the audit ended before the services were connected: {out} {err}")
                assert time.monotonic() < deadline, "the Tester never connected to the Test-Client"
                time.sleep(0.05)
            time.sleep(0.5)         # well into the exchange (the PSI phase lasts seconds)
            assert proc.poll() is None, "the audit ended before the fault; make the data larger"
            inject()
            injected_at = time.monotonic()
            try:
                out, err = proc.communicate(timeout=FAULT_REPORT_S)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"the operator had no answer {FAULT_REPORT_S:.0f}s after the fault in the "
                                     f"{victim} (a hang)\n{self.logs()}") from None
            return proc.returncode, _one_json(out, err), err, time.monotonic() - injected_at
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    def down(self) -> None:
        self.run("down", "-v", "--remove-orphans", "--timeout", "15", timeout=300, check=False)


def _one_json(stdout: str, stderr: str) -> dict:
    lines = [ln for ln in stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one JSON line, got stdout={stdout!r} stderr={stderr!r}"
    return json.loads(lines[0])


@contextlib.contextmanager
def _timed(timings: dict[str, float], key: str):
    t0 = time.monotonic()
    try:
        yield
    finally:
        timings[key] = round(time.monotonic() - t0, 1)


@pytest.fixture(scope="module")
def docker_stack(request, tmp_path_factory):
    """Build the image, `compose up` the repository's compose file on the reachable engine,
    and take it all down again (containers, network, the image's tag) afterwards.

    The engine is whatever `docker` reaches (CI's .ci/docker-setup starts one and stops it
    when .ci/run exits). The image is built as docs/deployment.md tells users to build it:
    `compose build` of the file's `build:` block, whose arguments come from the build
    variables in this process's environment (after `. build/offline.env`, the offline
    route's base image and wheels; none set, the online route)."""
    reason = docker_unavailable()
    if reason:
        _announce(request, f"docker compose variant skipped: {reason}")
        pytest.skip(reason)
    compose_cmd = _docker_compose_cmd()
    compose = load_compose()
    workdir = tmp_path_factory.mktemp("docker")
    mounts = write_data(workdir, compose, n_each_side=DOCKER_N_EACH_SIDE, n_overlap=DOCKER_N_OVERLAP)
    project = f"ppretest{os.getpid()}x{random.SystemRandom().randrange(16 ** 6):06x}"
    image = f"ppre-test:{project}"

    # The compose file as written, its build context the repository and its image the test's
    # tag, with the test's data, host ports and peer timeout; everything else (build args,
    # published address, healthchecks, depends_on, init, restart) as declared.
    # Named volumes (the certificates) become bind mounts too, so the operator on the host
    # reads its certificate; the image's user (uid 10001) must be able to write there.
    derived = copy.deepcopy(compose)
    derived.pop("volumes", None)
    derived["services"] = services(derived)      # the default deployment only
    for svc in services(compose).values():  # every named volume: certificates, the Tester's state
        for source, target in volumes(svc):
            if source in (compose.get("volumes") or {}):
                mounts[target].chmod(0o777)
    ports: dict[tuple[str, int], int] = {}
    for name, svc in services(derived).items():
        svc["build"] = {**svc["build"], "context": str(ROOT), "dockerfile": str(DOCKERFILE)}
        svc["image"] = image
        declared = [str(v) for v in svc.get("volumes", [])]
        svc["volumes"] = [f"{mounts[target]}:{target}" + (":ro" if entry.endswith(":ro") else "")
                          for (_, target), entry in zip(volumes(svc), declared)]
        if name in one_shot(compose):
            continue
        assert "PPRE_PEER_TIMEOUT" in svc["environment"], f"{name}: PPRE_PEER_TIMEOUT is not declared"
        svc["environment"]["PPRE_PEER_TIMEOUT"] = str(DOCKER_PEER_TIMEOUT_S)
        if "PPRE_PRIVACY_BUDGET" in svc["environment"]:  # these tests run more audits than it allows
            svc["environment"]["PPRE_PRIVACY_BUDGET"] = "100"
        svc["ports"] = []
        for entry, port in zip(services(compose)[name]["ports"], container_ports(services(compose)[name])):
            ports[(name, port)] = free_loopback_port()      # the declared address, a free host port
            parts = str(entry).split("/")[0].rsplit(":", 2)
            address = f"{parts[0]}:" if len(parts) == 3 else ""
            svc["ports"].append(f"{address}{ports[(name, port)]}:{port}")
    compose_file = workdir / "docker-compose.yml"
    compose_file.write_text(yaml.safe_dump(derived, sort_keys=False))
    stack = DockerStack(compose_cmd=compose_cmd, project=project, compose_file=compose_file, image=image,
                        certs=mounts[certs_target(compose)],
                        compose=compose, ports=ports)

    build_env = {var: os.environ[var] for var in build_variables(compose).values() if os.environ.get(var)}
    route = "offline" if build_env.get("PPRE_WHEELS") else "online"
    server = _docker("version", "--format", "{{.Server.Version}}").stdout.strip()
    _announce(request, f"docker compose variant: engine {server}, `{' '.join(compose_cmd)}`, project {project}, "
                       f"{route} build ({build_env or 'no build variables'}), ports {ports}")
    try:
        with _timed(stack.timings, "build"):
            stack.run("build", env=build_env, timeout=BUILD_TIMEOUT_S)
        with _timed(stack.timings, "up"):
            stack.up()
        yield stack
    finally:
        with _timed(stack.timings, "down"):
            stack.down()
        _docker("rmi", image, check=False)
        _announce(request, f"docker compose variant timings (s): {stack.timings}")


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S + 300)    # this test's setup builds the image
def test_docker_compose_up_runs_an_audit(docker_stack):
    with _timed(docker_stack.timings, "audit"):
        rc, result, stderr = docker_stack.audit()
    assert rc == 0, (result, stderr, docker_stack.logs())
    check_result(result, DOCKER_N_OVERLAP)
    # published on the host's loopback only, as the compose file declares by default
    for (name, port), host_port in docker_stack.ports.items():
        bindings = _docker("port", docker_stack.container(name), f"{port}/tcp").stdout.split()
        assert bindings == [f"127.0.0.1:{host_port}"], (name, port, bindings)
    rc, result, stderr = docker_stack.audit("no_such_dataset")
    assert rc == 2 and set(result) == {"error"} and "no_such_dataset" in json.dumps(result), (rc, result, stderr)
    docker_stack.wait_healthy(timeout=5)


@pytest.mark.slow
def test_the_image_runs_the_crypto_backend_this_cpu_allows(docker_stack):
    """The image carries the `ifma` extra and the compiled IFMA kernel (Dockerfile EXTRAS,
    the offline wheels): on a CPU with AVX-512 IFMA both services say at start-up that they
    run it with the kernel loaded, elsewhere the portable backend (design §4.9)."""
    from common.crypto import crypto_mb
    expected = ("crypto backend ifma (AVX-512 IFMA found, crypto_mb loaded; IFMA kernel loaded)"
                if crypto_mb.cpu_has_ifma() else "crypto backend portable")
    for name, line in (("tester", "tester serving on"), ("client", "client serving on")):
        logs = docker_stack.run("logs", "--no-color", name, timeout=60).stdout
        starts = [entry for entry in logs.splitlines() if line in entry]
        assert starts and all(expected in entry for entry in starts), (name, expected, starts)


@pytest.mark.slow
def test_docker_client_killed_mid_audit(request, docker_stack):
    """`docker kill` of the Test-Client while the Tester talks to it: the operator gets a clear
    error, promptly; the Tester stays healthy; once the Test-Client is up again, audits succeed."""
    client = docker_stack.container("client")
    rc, result, stderr, seconds = docker_stack.audit_with_fault("Test-Client", lambda: _docker("kill", client))
    _announce(request, f"Test-Client killed mid-audit: exit {rc} after {seconds:.1f}s: {json.dumps(result)}")
    assert rc == 2, (rc, result, stderr)
    assert set(result) == {"error"} and set(result["error"]) == {"code", "message"}, result
    assert "Test-Client" in result["error"]["message"], result
    assert docker_stack.state("tester")[:2] == ("running", "healthy"), docker_stack.logs()

    with _timed(docker_stack.timings, "client restart"):
        docker_stack.up()
    rc, result, stderr = docker_stack.audit()
    assert rc == 0, (result, stderr, docker_stack.logs())
    check_result(result, DOCKER_N_OVERLAP)


@pytest.mark.slow
def test_docker_tester_crash_mid_audit(request, docker_stack):
    """The Tester's process dies (SIGKILL) mid-audit: the operator gets a clear
    error, promptly; the compose restart policy brings the Tester back by itself (no
    `compose up`), and the next audit succeeds."""
    restarts = docker_stack.state("tester")[2]
    rc, result, stderr, seconds = docker_stack.audit_with_fault("Tester", lambda: docker_stack.crash("tester"))
    _announce(request, f"Tester crashed mid-audit: exit {rc} after {seconds:.1f}s: {json.dumps(result)}")
    assert rc == 2, (rc, result, stderr)
    assert set(result) == {"error"} and set(result["error"]) == {"code", "message"}, result
    assert "Tester" in result["error"]["message"], result

    with _timed(docker_stack.timings, "tester self-restart"):
        docker_stack.wait_healthy()
    assert docker_stack.state("tester")[2] == restarts + 1, "the restart policy should have restarted the Tester"
    rc, result, stderr = docker_stack.audit()
    assert rc == 0, (result, stderr, docker_stack.logs())
    check_result(result, DOCKER_N_OVERLAP)


@pytest.mark.slow
def test_docker_client_frozen_mid_audit(request, docker_stack):
    """`docker pause` of the Test-Client while the Tester talks to it: its connections stay
    open but nothing comes back, not even heartbeats. The Tester must give up after its peer
    timeout and the operator get a clear error, not a hang; after `unpause`, audits succeed."""
    client = docker_stack.container("client")
    try:
        rc, result, stderr, seconds = docker_stack.audit_with_fault("Test-Client",
                                                                 lambda: _docker("pause", client))
        _announce(request, f"Test-Client frozen mid-audit: exit {rc} after {seconds:.1f}s: {json.dumps(result)}")
        assert rc == 2, (rc, result, stderr)
        assert set(result) == {"error"} and set(result["error"]) == {"code", "message"}, result
        assert "Test-Client" in result["error"]["message"], result
        assert seconds >= DOCKER_PEER_TIMEOUT_S * 0.5, f"an error {seconds:.1f}s after the freeze: {result}"
    finally:
        _docker("unpause", client, check=False)
    with _timed(docker_stack.timings, "client unpause"):
        docker_stack.wait_healthy()
    rc, result, stderr = docker_stack.audit()
    assert rc == 0, (result, stderr, docker_stack.logs())
    check_result(result, DOCKER_N_OVERLAP)


# --------------------------------------------------------------------------- building and publishing

OFFLINE_BUILD = ROOT / "scripts" / "offline-build"


def test_compose_publishes_both_services_on_loopback_unless_told_otherwise():
    compose = load_compose()
    published = {name: svc for name, svc in compose["services"].items() if svc.get("ports")}
    assert set(published) == {"tester", "client"}, sorted(published)
    for name, svc in published.items():
        n = len(svc["ports"])
        assert published_addresses(svc, {}) == ["127.0.0.1"] * n, (name, svc["ports"])
        # docs/deployment.md, "Exposing the ports": one variable moves both
        assert published_addresses(svc, {"PPRE_PUBLISH_ADDRESS": "0.0.0.0"}) == ["0.0.0.0"] * n, name
        assert published_addresses(svc, {"PPRE_PUBLISH_ADDRESS": "192.0.2.7"}) == ["192.0.2.7"] * n, name


def test_compose_build_args_default_to_the_online_build_and_read_the_offline_variables():
    compose = load_compose()
    builds = [svc.get("build") for svc in compose["services"].values()]
    assert all(build == builds[0] for build in builds), "every service (dask profile too): one build"
    build = builds[0]
    assert isinstance(build, dict) and build["context"] == ".", build
    # Each argument is one of the Dockerfile's, and with no variable set it is that ARG's
    # default: `docker compose up -d --build` online builds exactly what `docker build .` does.
    defaults = dict(re.findall(r"^ARG (\w+)=(.*)$", DOCKERFILE.read_text(), re.M))
    assert set(build["args"]) == set(defaults), (sorted(build["args"]), sorted(defaults))
    for arg, value in build["args"].items():
        assert interpolate(str(value), {}) == defaults[arg], (arg, value, defaults[arg])
    variables = build_variables(compose)
    assert variables == {"BASE_IMAGE": "PPRE_BASE_IMAGE", "WHEELS": "PPRE_WHEELS", "INDEX_URL": "PPRE_INDEX_URL",
                         "EXTRAS": "PPRE_EXTRAS"}
    # The offline route: the env file scripts/offline-build writes sets the base image and
    # the wheels, and the wheels' folder is one .dockerignore lets into the build context.
    script = OFFLINE_BUILD.read_text()
    assert set(re.findall(r"^export (\w+)=", script, re.M)) == {variables["BASE_IMAGE"], variables["WHEELS"]}
    wheels = re.search(r"^WHEELS=(\S+)", script, re.M).group(1)
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert "build" in ignore and f"!{wheels}" in ignore, f"{wheels} must be in the build context"


def _compose_config(env: dict[str, str]) -> dict:
    cmd = _docker_compose_cmd()
    if cmd is None:
        pytest.skip("neither `docker compose` nor `docker-compose` works here")
    proc = subprocess.run(cmd + ["-f", str(COMPOSE_FILE), "config"], env=child_env(env), capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)["services"]


def test_compose_resolves_the_published_address_and_build_args_as_documented():
    """Compose itself (no engine needed) reads the variables docs/deployment.md names."""
    default = _compose_config({})
    offline = _compose_config({"PPRE_BASE_IMAGE": "ppre-base:bookworm", "PPRE_WHEELS": "build/wheels",
                               "PPRE_PUBLISH_ADDRESS": "0.0.0.0", "PPRE_EXTRAS": ""})
    for name in ("tester", "client"):
        assert published_addresses(default[name]) == ["127.0.0.1"], default[name]["ports"]
        assert published_addresses(offline[name]) == ["0.0.0.0"], offline[name]["ports"]
        assert default[name]["build"]["args"] == {"BASE_IMAGE": "python:3.11-slim", "WHEELS": "", "INDEX_URL": "",
                                                  "EXTRAS": "ifma"}
        # an empty PPRE_EXTRAS leaves the extra out (`${PPRE_EXTRAS-ifma}`: only unset means ifma)
        assert offline[name]["build"]["args"] == {"BASE_IMAGE": "ppre-base:bookworm", "WHEELS": "build/wheels",
                                                  "INDEX_URL": "", "EXTRAS": ""}


def test_offline_build_refuses_clearly_without_an_engine(tmp_path):
    """scripts/offline-build names what is missing and where the guide is (no engine here)."""
    env = {**child_env(), "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    proc = subprocess.run(["bash", str(OFFLINE_BUILD)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "docs/deployment.md" in proc.stderr, proc.stderr
    assert "docker info" in proc.stderr or "no 'docker' command" in proc.stderr, proc.stderr
    proc = subprocess.run(["bash", str(OFFLINE_BUILD), "--no-such-flag"], env=env, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "--no-such-flag" in proc.stderr and "usage:" in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- no drift from the CLI

def _parse(argv: list[str], env: dict[str, str], monkeypatch) -> argparse.Namespace:
    """Parse with a fresh parser: the serve commands read their env fallbacks at build time."""
    from ppre.cli import build_parser

    for key in [k for k in os.environ if k.startswith("PPRE_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        return build_parser().parse_args(argv)
    finally:
        for key in env:
            monkeypatch.delenv(key, raising=False)


def _sentinel(value: str) -> str:
    if value.isdigit():
        return str(int(value) + 1)
    try:
        return repr(float(value) / 2)  # a different number that still parses
    except ValueError:
        return f"{value}-sentinel"


def _same(parsed, declared: str) -> bool:
    """The parsed value is the declared text ("600" declares 600.0 for a float option)."""
    if str(parsed) == declared:
        return True
    try:
        return float(parsed) == float(declared)
    except (TypeError, ValueError):
        return False


@pytest.mark.slow
def test_compose_file_matches_the_cli(monkeypatch):
    compose = load_compose()
    svcs = services(compose)
    assert set(svcs) == {"tester", "client", "certs"}, sorted(svcs)
    assert one_shot(compose) == {"certs"}
    dockerfile = [line.strip() for line in DOCKERFILE.read_text().splitlines()
                  if line.strip() and not line.lstrip().startswith("#")]
    exposed = {int(p) for line in dockerfile if line.upper().startswith("EXPOSE") for p in re.findall(r"\d+", line)}
    # One Dockerfile for users and CI: a slim Python image unless BASE_IMAGE says otherwise.
    assert dockerfile[0] == "ARG BASE_IMAGE=python:3.11-slim", dockerfile[0]
    froms = [line.split()[1] for line in dockerfile if line.upper().startswith("FROM ")]
    assert froms[0] == "${BASE_IMAGE}", froms
    users = [line.split()[1] for line in dockerfile if line.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"
    cmds = [line for line in dockerfile if line.upper().startswith("CMD")]
    assert cmds and json.loads(cmds[-1][3:]) == ["ppre", "--help"], cmds
    listening: dict[str, int] = {}

    # The certificates: `ppre certs init` writes them into a named volume, once (no restart);
    # both services wait for it to finish, mount it read-only and read it (PPRE_TLS_DIR).
    certs = svcs["certs"]
    cargs = _parse(certs["command"][1:], {}, monkeypatch)
    assert (cargs.command, cargs.action, callable(cargs.func)) == ("certs", "init", True), certs["command"]
    (volume, target), = volumes(certs)
    assert target == cargs.directory == certs_target(compose) and not str(certs["volumes"][0]).endswith(":ro")
    assert volume in compose.get("volumes", {}), f"{volume} should be a named volume"
    assert str(certs.get("restart", "no")) == "no"

    for name, svc in svcs.items():
        if name in one_shot(compose):
            continue
        assert f"{volume}:{target}:ro" in svc["volumes"], f"{name}: mounts the certificates read-only"
        assert svc["depends_on"]["certs"]["condition"] == "service_completed_successfully", name
        assert svc["environment"].get("PPRE_TLS_DIR") == target, f"{name}: PPRE_TLS_DIR"
        command = svc["command"]
        assert isinstance(command, list) and command[0] == "ppre", f"{name}: list-form `ppre ...` command"
        env = svc.get("environment")
        assert isinstance(env, dict), f"{name}: mapping-form environment"
        env = {k: interpolate(str(v)) for k, v in env.items()}

        # The command parses, with the declared environment, to a runnable sub-command.
        args = _parse(command[1:], env, monkeypatch)
        assert callable(getattr(args, "func", None)), f"{name}: {command} is not a runnable command"
        assert hasattr(args, "port"), f"{name}: {command} takes no port"
        listening[name] = args.port

        # Every variable is read by that command: setting it changes what the command parses,
        # and the declared value is what it parses to.
        declared = vars(args)
        for key, value in env.items():
            assert key.startswith("PPRE_"), f"{name}: {key} is not a PPRE_ variable"
            without = vars(_parse(command[1:], {k: v for k, v in env.items() if k != key}, monkeypatch))
            changed = vars(_parse(command[1:], {**env, key: _sentinel(value)}, monkeypatch))
            moved = [attr for attr in declared if changed[attr] != without[attr]]
            assert moved, f"{name}: `{' '.join(command)}` ignores {key}"
            assert any(_same(declared[attr], value) for attr in moved), (name, key, value, moved)

        # Ports: what is published is what the service listens on, and the image exposes it.
        ports = container_ports(svc)
        assert ports == [args.port], f"{name}: publishes {ports}, listens on {args.port}"
        assert args.port in exposed, f"{name}: port {args.port} not in the Dockerfile's EXPOSE {sorted(exposed)}"

        # Path variables point into a mounted volume (read-only: the services never write data).
        targets = [t for _, t in volumes(svc)]
        for key, value in env.items():
            if value.startswith("/"):
                assert any(value == t or value.startswith(t.rstrip("/") + "/") for t in targets), (name, key)
        # The writable volumes: the Tester's state (privacy ledger, audit log), which must
        # outlive a restart, and apart from it the audit log's key (and exported head); the
        # Test-Client's results; they hold no member-level data.
        state = {v.rsplit("/", 1)[0] for k, v in env.items() if k in ("PPRE_PRIVACY_LEDGER", "PPRE_AUDIT_LOG")}
        assert len(state) <= 1, f"{name}: the ledger and the audit log belong in one state volume"
        keys = {v.rsplit("/", 1)[0] for k, v in env.items() if k == "PPRE_AUDIT_LOG_KEY_FILE"}
        assert not ("PPRE_AUDIT_LOG" in env) or keys, f"{name}: an audit log needs PPRE_AUDIT_LOG_KEY_FILE"
        assert not (keys & state), f"{name}: the audit log's key belongs outside the log's volume"
        results = {v for k, v in env.items() if k == "PPRE_CLIENT_RESULTS_DIR"}
        for entry in svc.get("volumes", []):
            writable = str(entry).split(":")[1] in state | keys | results
            assert str(entry).endswith(":ro") != bool(writable), f"{name}: volume {entry} should be read-only"

        # SIGTERM reaches the service (an init as PID 1 forwards it) and it has time to finish:
        # the services exit within 10 s of SIGTERM.
        assert svc.get("init") is True, f"{name}: init: true"
        grace = re.fullmatch(r"(\d+)s", str(svc.get("stop_grace_period", "")))
        assert grace and int(grace.group(1)) > 10, f"{name}: stop_grace_period above 10s"

        # The healthcheck is `ppre health` against the service's own port.
        check = healthcheck_argv(svc)
        assert check[0] == "ppre", check
        hargs = _parse(check[1:], {}, monkeypatch)
        assert hargs.command == "health" and callable(hargs.func), check
        host, _, port = hargs.address.rpartition(":")
        assert host in ("127.0.0.1", "localhost") and int(port) == args.port, (name, check)
        # over mutual TLS with the container's own certificate (Docker runs it in the container's env)
        assert args.tls_dir == target and not args.insecure and hargs.tls_role == args.tls_role, (name, check)

    # The Tester reaches the Test-Client by its service name and listening port, after it is healthy.
    tester_args = _parse(svcs["tester"]["command"][1:],
                         {k: interpolate(str(v)) for k, v in svcs["tester"]["environment"].items()}, monkeypatch)
    host, _, port = tester_args.client.rpartition(":")
    assert host in svcs and int(port) == listening[host], tester_args.client
    assert svcs["tester"]["depends_on"][host]["condition"] == "service_healthy"
    assert svcs["tester"]["volumes"] and svcs["client"]["volumes"]
