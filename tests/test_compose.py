"""docker-compose.yml, exercised without (and, where one is reachable, with) a Docker engine.

The compose file is the deployment contract, so these tests read it back with PyYAML and
run exactly what it declares:

* every service's `command` is started with its `environment` (on top of os.environ);
  each container volume path is mapped to a temporary host directory filled with
  generated data (300 members each side, 50% overlap);
* services start in `depends_on` order and are polled with their own `healthcheck`;
* the operator's `ppre audit --json` runs against the Tester and its JSON is checked.

Networking has two modes, chosen at run time and printed:

* ``netns`` (root and `ip netns` works): each service runs in its own network namespace,
  attached by a veth pair to a private bridge (10.231.X.0/24, X random and unused).
  Container hostnames resolve through ``/etc/netns/<ns>/hosts``, which `ip netns exec`
  bind-mounts over /etc/hosts, so ``client:50052`` is used verbatim. Ports are the
  declared ones (each namespace has its own port space); healthchecks run inside the
  service's namespace against 127.0.0.1, as Docker runs them; the operator runs in the
  root namespace, which holds the bridge's .1 address.
* ``loopback`` (otherwise, or PPRE_TEST_NETWORK=loopback): service hostnames become
  127.0.0.1, ports are replaced by free loopback ports, and services bind 127.0.0.1.

Proxy variables are removed from the children's environment, so all traffic stays on
loopback or on the test's own namespaces. Processes, namespaces, links and
/etc/netns entries are removed in fixture finalizers, also on failure.

A separate test runs the same audit through `docker compose up` when `docker info`
succeeds (skipped otherwise), and another checks, without starting anything, that the
compose file's commands, variables and ports are ones `ppre.cli.build_parser()` accepts.
"""
from __future__ import annotations

import argparse
import copy
import ipaddress
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

from tests.helpers import free_loopback_port

log = logging.getLogger("test_compose")

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

#: The Tester's probability columns (SPEC.md section 1; common.races.RACES).
RACE_COLUMNS = ("white", "black", "api", "aian", "multiple", "hispanic")
DATASET = "claims"
N_EACH_SIDE = 300
N_OVERLAP = 150
BOOTSTRAP = 50
HEALTH_TIMEOUT_S = 60.0
AUDIT_TIMEOUT_S = 180.0

_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "no_proxy")


# --------------------------------------------------------------------------- compose file

def load_compose() -> dict:
    with open(COMPOSE_FILE, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def services(compose: dict) -> dict[str, dict]:
    return compose["services"]


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


def ppre_argv() -> list[str]:
    """How to run `ppre` here: the console script next to this interpreter, else `-m ppre.cli`."""
    script = Path(sys.executable).with_name("ppre")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("ppre")
    if found:
        return [found]
    return [sys.executable, "-m", "ppre.cli"]


def resolve_ppre(argv: list[str]) -> list[str]:
    return ppre_argv() + list(argv[1:]) if argv and argv[0] == "ppre" else list(argv)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in _PROXY_VARS and not k.startswith("PPRE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


# --------------------------------------------------------------------------- test data

def write_data(base: Path, compose: dict, *, seed: int = 0) -> dict[str, Path]:
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
    tester_ids = [f"m{i:06d}" for i in range(N_EACH_SIDE)]
    client_ids = tester_ids[:N_OVERLAP] + [f"x{i:06d}" for i in range(N_EACH_SIDE - N_OVERLAP)]
    probs = rng.dirichlet(np.full(len(RACE_COLUMNS), 0.7), N_EACH_SIDE)
    tester = pd.DataFrame(probs, columns=list(RACE_COLUMNS))
    tester.insert(0, "member_id", tester_ids)
    client = pd.DataFrame({"member_id": client_ids,
                           "y_true": rng.integers(0, 2, N_EACH_SIDE),
                           "y_pred": rng.integers(0, 2, N_EACH_SIDE)})

    env = {k: str(v) for svc in services(compose).values() for k, v in (svc.get("environment") or {}).items()}
    data_file = to_host(env["PPRE_CLIENT_DATA_DIR"]) / f"{DATASET}.csv"
    files = [(data_file, client)]
    if "PPRE_TESTER_MEMBERS" in env:  # the Tester prepares BISG probabilities itself, per audit
        from ppre.synth import SynthConfig, synthesize
        synth = synthesize(SynthConfig(members=N_EACH_SIDE, seed=seed))
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


# --------------------------------------------------------------------------- networking

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_NS_PREFIX = "ppre-t"
_NS_RE = re.compile(rf"^{_NS_PREFIX}(\d+)x(\d+)-")
_counter = iter(range(1, 10_000))


def sweep_stale_namespaces() -> None:
    """Remove leftovers of earlier runs that were killed hard (their pid is gone)."""
    listing = _ip("netns", "list", check=False).stdout.split()
    for name in listing:
        match = _NS_RE.match(name)
        if match and not _pid_alive(int(match.group(1))):
            for pid in _ip("netns", "pids", name, check=False).stdout.split():   # orphaned services
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", name, check=False)
            shutil.rmtree(Path("/etc/netns") / name, ignore_errors=True)
            _ip("link", "del", f"ppb{int(match.group(1)):x}x{match.group(2)}", check=False)
            try:
                Path("/etc/netns").rmdir()      # only if that run left it empty
            except OSError:
                pass


@dataclass
class NetnsNetwork:
    """One bridge in the root namespace, one namespace + veth per service."""

    service_names: list[str]
    tag: str = ""
    subnet: ipaddress.IPv4Network | None = None
    bridge: str = ""
    namespaces: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    host_links: list[str] = field(default_factory=list)
    created_etc_netns: bool = False

    def setup(self) -> None:
        pid, n = os.getpid(), next(_counter)
        self.tag = f"{pid}x{n}"
        self.bridge = f"ppb{pid:x}x{n}"                       # <= 15 characters
        self.subnet = self._free_subnet()
        hosts = list(self.subnet.hosts())
        gateway = hosts[0]
        self.addresses = {name: str(hosts[9 + i]) for i, name in enumerate(self.service_names)}
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self.host_links.append(self.bridge)
            _ip("addr", "add", f"{gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            etc_netns = Path("/etc/netns")
            self.created_etc_netns = not etc_netns.exists()
            etc_netns.mkdir(mode=0o755, exist_ok=True)
            hosts_text = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + "".join(
                f"{addr}\t{name}\n" for name, addr in self.addresses.items())
            for i, name in enumerate(self.service_names):
                ns = f"{_NS_PREFIX}{self.tag}-{name}"
                host_end, ns_end = f"pph{pid:x}x{n}{i}", f"ppn{pid:x}x{n}{i}"
                _ip("netns", "add", ns)
                self.namespaces[name] = ns
                (etc_netns / ns).mkdir(mode=0o755, parents=True)
                (etc_netns / ns / "hosts").write_text(hosts_text)
                _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
                self.host_links.append(host_end)
                _ip("link", "set", ns_end, "netns", ns)
                _ip("-n", ns, "link", "set", ns_end, "name", "eth0")
                _ip("-n", ns, "addr", "add", f"{self.addresses[name]}/{self.subnet.prefixlen}", "dev", "eth0")
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("link", "set", host_end, "master", self.bridge)
                _ip("link", "set", host_end, "up")
            # Each namespace sees the others' hostnames; verify resolution where it matters.
            for name, ns in self.namespaces.items() if shutil.which("getent") else ():
                for other, addr in self.addresses.items():
                    out = subprocess.run(["ip", "netns", "exec", ns, "getent", "hosts", other],
                                         capture_output=True, text=True, timeout=30)
                    if addr not in out.stdout:
                        raise RuntimeError(f"{other} does not resolve to {addr} in {ns}: {out.stdout!r}")
        except Exception:
            self.teardown()
            raise

    def _free_subnet(self) -> ipaddress.IPv4Network:
        used = _ip("-4", "-o", "addr", "show", check=False).stdout + _ip("-4", "route", "show", "table", "all",
                                                                      check=False).stdout
        candidates = [x for x in range(1, 255) if f"10.231.{x}." not in used]
        random.SystemRandom().shuffle(candidates)
        if not candidates:
            raise RuntimeError("no free 10.231.X.0/24")
        return ipaddress.ip_network(f"10.231.{candidates[0]}.0/24")

    def exec_prefix(self, service: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[service]]

    def teardown(self) -> None:
        for ns in list(self.namespaces.values()):
            _ip("netns", "del", ns, check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        self.namespaces.clear()
        for link in reversed(self.host_links):      # veth host ends die with their peers
            if _ip("link", "show", link, check=False).returncode == 0:
                _ip("link", "del", link, check=False)
        self.host_links.clear()
        if self.created_etc_netns:
            try:
                Path("/etc/netns").rmdir()
            except OSError:
                pass                                    # someone else's namespace config is there


def netns_usable() -> tuple[bool, str]:
    if os.environ.get("PPRE_TEST_NETWORK", "").lower() == "loopback":
        return False, "PPRE_TEST_NETWORK=loopback"
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False, "not running as root"
    if not shutil.which("ip"):
        return False, "iproute2 `ip` not found"
    return True, ""


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
        declared = {k: str(v) for k, v in (services(self.compose)[name].get("environment") or {}).items()}
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
        self.logs[name] = self.workdir / f"{name}.log"
        with open(self.logs[name], "wb") as out:
            self.procs[name] = subprocess.Popen(self.in_service(name, command), env=child_env(self.service_env(name)),
                                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                cwd=self.workdir)

    def log_tail(self, name: str, n: int = 3000) -> str:
        path = self.logs.get(name)
        return path.read_text(errors="replace")[-n:] if path and path.exists() else ""

    def healthy(self, name: str) -> bool:
        """The service's own compose healthcheck, run where Docker would run it."""
        argv = self.in_service(name, healthcheck_argv(services(self.compose)[name]))
        try:
            return subprocess.run(argv, env=child_env(), capture_output=True, timeout=20).returncode == 0
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
                              "--metric", "ero", "--bootstrap", str(BOOTSTRAP), "--seed", "1", "--json"]
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


def check_result(result: dict) -> None:
    assert result.get("metric") == "ero", result
    assert result["n_matched"] == N_OVERLAP, result
    assert result["bootstrap"] == BOOTSTRAP, result
    groups = result["groups"]
    assert len(groups) == len(RACE_COLUMNS), groups
    assert {g["group"] for g in groups} == set(RACE_COLUMNS), groups
    for g in groups:
        est = g["estimate"]
        if est is None:
            continue
        assert g["ci_low"] is not None and g["ci_high"] is not None, g
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


def _docker_compose_cmd() -> list[str] | None:
    """`docker compose` or `docker-compose`, version 2 or later (`up --wait`)."""
    for cmd in (["docker", "compose"], ["docker-compose"]):
        if not shutil.which(cmd[0]):
            continue
        try:
            out = subprocess.run(cmd + ["version", "--short"], capture_output=True, text=True, timeout=30)
        except subprocess.TimeoutExpired:
            continue
        major = re.match(r"v?(\d+)\.", out.stdout.strip())
        if out.returncode == 0 and major and int(major.group(1)) >= 2:
            return cmd
    return None


@pytest.mark.slow
def test_docker_compose_up_runs_an_audit(tmp_path):
    if not shutil.which("docker"):
        reason = "no `docker` client on PATH"
    else:
        try:
            info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
            reason = "" if info.returncode == 0 else \
                f"no Docker engine reachable (`docker info`: {(info.stderr or info.stdout).strip()[:200]})"
        except subprocess.TimeoutExpired:
            reason = "`docker info` timed out"
    if not reason and _docker_compose_cmd() is None:
        reason = "Docker engine reachable but no Compose v2 (`docker compose` / `docker-compose`) is installed"
    if reason:
        print(f"skipping docker compose test: {reason}")
        pytest.skip(reason)

    compose = load_compose()
    mounts = write_data(tmp_path, compose)
    # A derived compose file: absolute build context, the temporary data, free loopback ports.
    derived = copy.deepcopy(compose)
    ports = {}
    for name, svc in services(derived).items():
        build = svc.get("build")
        if isinstance(build, dict):
            build["context"] = str(ROOT / build.get("context", "."))
        elif build is not None:
            svc["build"] = str(ROOT / build)
        svc["volumes"] = [f"{mounts[target]}:{target}:ro" for _, target in volumes(svc)]
        published = []
        for port in container_ports(svc):
            ports[(name, port)] = free_loopback_port()
            published.append(f"127.0.0.1:{ports[(name, port)]}:{port}")
        svc["ports"] = published
    compose_file = tmp_path / "docker-compose.yml"
    compose_file.write_text(yaml.safe_dump(derived, sort_keys=False))
    project = f"ppretest{os.getpid()}"
    base = _docker_compose_cmd() + ["-p", project, "-f", str(compose_file)]
    try:
        up = subprocess.run(base + ["up", "-d", "--build", "--wait"], capture_output=True, text=True, timeout=900)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
        tester_port = ports[("tester", container_ports(services(compose)["tester"])[0])]
        argv = ppre_argv() + ["audit", "--tester", f"127.0.0.1:{tester_port}", "--client-dataset", DATASET,
                              "--metric", "ero", "--bootstrap", str(BOOTSTRAP), "--seed", "1", "--json"]
        proc = subprocess.run(argv, env=child_env(), capture_output=True, text=True, timeout=AUDIT_TIMEOUT_S)
        if proc.returncode != 0:
            logs = subprocess.run(base + ["logs", "--no-color"], capture_output=True, text=True, timeout=60)
            raise AssertionError(f"{proc.stdout}\n{proc.stderr}\n{logs.stdout[-4000:]}")
        check_result(json.loads(proc.stdout))
    finally:
        subprocess.run(base + ["down", "-v", "--remove-orphans", "--timeout", "10"], capture_output=True,
                       timeout=300)


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


@pytest.mark.slow
def test_compose_file_matches_the_cli(monkeypatch):
    compose = load_compose()
    svcs = services(compose)
    assert set(svcs) == {"tester", "client"}, sorted(svcs)
    dockerfile = [line.strip() for line in DOCKERFILE.read_text().splitlines()
                  if line.strip() and not line.lstrip().startswith("#")]
    exposed = {int(p) for line in dockerfile if line.upper().startswith("EXPOSE") for p in re.findall(r"\d+", line)}
    assert dockerfile[0].startswith("FROM python:3.11-slim"), dockerfile[0]
    users = [line.split()[1] for line in dockerfile if line.upper().startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"
    cmds = [line for line in dockerfile if line.upper().startswith("CMD")]
    assert cmds and json.loads(cmds[-1][3:]) == ["ppre", "--help"], cmds
    listening: dict[str, int] = {}

    for name, svc in svcs.items():
        command = svc["command"]
        assert isinstance(command, list) and command[0] == "ppre", f"{name}: list-form `ppre ...` command"
        env = svc.get("environment")
        assert isinstance(env, dict), f"{name}: mapping-form environment"
        env = {k: str(v) for k, v in env.items()}

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
            assert any(str(declared[attr]) == value for attr in moved), (name, key, value, moved)

        # Ports: what is published is what the service listens on, and the image exposes it.
        ports = container_ports(svc)
        assert ports == [args.port], f"{name}: publishes {ports}, listens on {args.port}"
        assert args.port in exposed, f"{name}: port {args.port} not in the Dockerfile's EXPOSE {sorted(exposed)}"

        # Path variables point into a mounted volume (read-only: the services never write data).
        targets = [t for _, t in volumes(svc)]
        for key, value in env.items():
            if value.startswith("/"):
                assert any(value == t or value.startswith(t.rstrip("/") + "/") for t in targets), (name, key)
        for entry in svc.get("volumes", []):
            assert str(entry).endswith(":ro"), f"{name}: volume {entry} should be read-only"

        # The healthcheck is `ppre health` against the service's own port.
        check = healthcheck_argv(svc)
        assert check[0] == "ppre", check
        hargs = _parse(check[1:], {}, monkeypatch)
        assert hargs.command == "health" and callable(hargs.func), check
        host, _, port = hargs.address.rpartition(":")
        assert host in ("127.0.0.1", "localhost") and int(port) == args.port, (name, check)

    # The Tester reaches the Test-Client by its service name and listening port, after it is healthy.
    tester_args = _parse(svcs["tester"]["command"][1:],
                         {k: str(v) for k, v in svcs["tester"]["environment"].items()}, monkeypatch)
    host, _, port = tester_args.client.rpartition(":")
    assert host in svcs and int(port) == listening[host], tester_args.client
    assert svcs["tester"]["depends_on"][host]["condition"] == "service_healthy"
    assert svcs["tester"]["volumes"] and svcs["client"]["volumes"]
