"""Test support: the two services as separate OS processes, an operator process, a TCP
proxy that can freeze, and a direct veth link into a network namespace that can go down.

Used by tests/test_faults.py; its network namespaces (a veth link, or one namespace per
service on a bridge: `NetnsNetwork`) by tests/test_compose.py too. Everything here is
bounded (every wait has a timeout) and idempotent to clean up: `ServiceProcess.close()`,
`FreezableProxy.close()`, `VethNamespace.teardown()` and `NetnsNetwork.teardown()` may be
called any number of times, also after a failure, and never leave a stopped (SIGSTOP)
process behind.

Services are started as `ppre -v tester serve ...` / `ppre -v client serve ...`, each in
its own process group (its worker-pool children included), with an empty working
directory that is also its TMPDIR and HOME, so a test can check that nothing was written
there. Their combined stdout/stderr go to a log file *outside* that directory.

Links use mutual TLS, as deployed: `dev_cert_dir()` is one `ppre certs init` directory for
the test session (outside every run directory); services get `--tls-dir` (or
`--insecure` with `tls=False`), `ppre audit` processes the operator's certificate, and
the addresses of started services are remembered (`channels.remember_dial`) so that an
in-process `run_audit(tester.address, ...)` or `health_status(...)` presents the
operator's certificate too.
"""
from __future__ import annotations

import atexit
import ipaddress
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.crypto import paillier
from common.net import channels
from common.net.tls import CLIENT_IDENTITY, TESTER_IDENTITY, DevCA, TlsIdentity
from tests.helpers import free_loopback_port, make_inputs, pid_alive

REPO = Path(__file__).resolve().parents[1]
_PROXY_VARS = ("http_proxy", "https_proxy", "all_proxy", "grpc_proxy", "no_proxy")
#: the services log this whenever a session opens or closes (at INFO, `ppre -v`)
ACTIVE_SESSIONS_RE = re.compile(rb"active sessions: (\d+)")
#: `ppre audit` without --json prints progress as `[  12.34s] PHASE: message` on stderr
PROGRESS_RE = re.compile(r"^\[\s*([0-9.]+)s\] (\S+): ?(.*)$")
ERROR_RE = re.compile(r"^ppre audit: error \(([a-z_]+)\): (.*)$")


def ppre_argv() -> list[str]:
    """How to run `ppre` here: the console script next to this interpreter, else `-m ppre.cli`."""
    script = Path(sys.executable).with_name("ppre")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    found = shutil.which("ppre")
    if found:
        return [found]
    return [sys.executable, "-m", "ppre.cli"]


#: runs argv[1:] with SIGINT at its default disposition (exec keeps a default, as it keeps
#: an ignored one); -I -S: nothing but the interpreter's built-in modules is loaded
_SIGINT_DEFAULT = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                   "os.execvp(sys.argv[1], sys.argv[1:])")


def foreground_argv(argv: list[str]) -> list[str]:
    """`argv` as a terminal's foreground command gets it: with SIGINT at its default, so
    a Python program turns it into KeyboardInterrupt. Without this, a child inherits the
    test run's disposition, and a test run started in the background by a non-interactive
    shell (`pytest ... &` in a script) ignores SIGINT, as does every child it starts; Python
    then installs no KeyboardInterrupt handler and a test's Ctrl-C is lost. The process
    keeps its pid (the wrapper execs the command)."""
    return [sys.executable, "-I", "-S", "-c", _SIGINT_DEFAULT, *argv]


def child_env(extra: dict[str, str] | None = None, *, test_keys: bool = True) -> dict[str, str]:
    """os.environ without proxies and without inherited PPRE_ settings but the test-key
    size (`PPRE_TEST_KEY_BITS`, tests/conftest.py; `test_keys=False`: production keys), plus
    `extra`."""
    kept = {paillier.TEST_KEY_ENV} if test_keys else set()
    env = {k: v for k, v in os.environ.items()
           if k.lower() not in _PROXY_VARS and (not k.startswith("PPRE_") or k in kept)}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


_CERTS: Path | None = None
_CERTS_LOCK = threading.Lock()


def dev_cert_dir() -> Path:
    """One development CA and role certificates (`ppre certs init`'s layout) for the whole
    test session, in a temporary directory removed at exit."""
    global _CERTS
    with _CERTS_LOCK:
        if _CERTS is None:
            directory = Path(tempfile.mkdtemp(prefix="ppre-test-certs-"))
            atexit.register(shutil.rmtree, directory, True)
            DevCA.generate("PPRE test CA").write(directory)
            _CERTS = directory
        return _CERTS


def operator_tls() -> TlsIdentity:
    return TlsIdentity.from_dir(dev_cert_dir(), "operator")


def tls_argv(tls: bool) -> list[str]:
    return ["--tls-dir", str(dev_cert_dir())] if tls else ["--insecure"]


def serve_tls(address: str, role: str) -> list[str]:
    """The `--tls-dir` flags of a `ppre ROLE serve` process listening on `address`, which
    this process will then reach with the operator's certificate (run_audit, health)."""
    channels.remember_dial(address, operator_tls(), TESTER_IDENTITY if role == "tester" else CLIENT_IDENTITY)
    return tls_argv(True)


def wait_for(condition: Callable[[], object], timeout: float, interval: float = 0.05):
    """Poll until `condition()` is truthy; return its value, or None after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


# --------------------------------------------------------------------------- data

@dataclass
class Dataset:
    """A prepared probability table for the Tester and an ERO dataset for the Test-Client."""

    probabilities: Path
    client_dir: Path
    name: str
    n_tester: int
    n_client: int
    overlap: int


def write_dataset(directory: Path, n_tester: int, n_client: int, overlap: int, *, name: str = "ero",
                  seed: int = 0) -> Dataset:
    directory.mkdir(parents=True, exist_ok=True)
    tester, client = make_inputs(n_tester, n_client, overlap, seed=seed)
    probabilities = directory / f"probabilities-{n_tester}-{seed}.csv"
    client_dir = directory / f"client-{n_client}-{seed}"
    client_dir.mkdir(exist_ok=True)
    tester.to_csv(probabilities, index=False)
    client.to_csv(client_dir / f"{name}.csv", index=False)
    return Dataset(probabilities, client_dir, name, n_tester, n_client, overlap)


# --------------------------------------------------------------------------- process inspection

def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def group_pids(pgid: int) -> list[int]:
    """Live processes of a process group (the service and its worker-pool children)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat")
        if not stat:
            continue
        fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) "
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(entry))
    return sorted(out)


@dataclass(frozen=True)
class Usage:
    """Resources of one process (and of its process group, for RSS)."""

    rss_kib: int          # the main process
    group_rss_kib: int    # the main process plus its worker-pool children
    group_processes: int
    threads: int          # the main process
    fds: int              # the main process
    pool_threads: int = 0  # of them, gRPC's EventEngine pool ("event_engine"), which grows on demand
    handler_threads: int = 0  # of them, the server's handler pool (channels.HANDLER_THREAD_NAME), started on demand

    @property
    def own_threads(self) -> int:
        return self.threads - self.pool_threads - self.handler_threads

    def __str__(self) -> str:
        return (f"rss={self.rss_kib / 1024:.1f} MiB (group {self.group_rss_kib / 1024:.1f} MiB in "
                f"{self.group_processes} processes), threads={self.threads} ({self.pool_threads} in gRPC's "
                f"pool, {self.handler_threads} handlers), fds={self.fds}")


def _status_field(pid: int, name: str) -> int:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    return 0


def usage(pid: int, pgid: int | None = None) -> Usage:
    pids = group_pids(pgid) if pgid is not None else [pid]
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        fds = -1
    pool = handlers = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                name = f.read().strip()
            pool += name == "event_engine"
            handlers += name == channels.HANDLER_THREAD_NAME
    except OSError:
        pass
    return Usage(rss_kib=_status_field(pid, "VmRSS"),
                 group_rss_kib=sum(_status_field(p, "VmRSS") for p in pids),
                 group_processes=len(pids),
                 threads=_status_field(pid, "Threads"),
                 fds=fds, pool_threads=pool, handler_threads=handlers)


def health_status(address: str, timeout: float = 2.0, *, tls: TlsIdentity | None = None,
                  server_name: str | None = None) -> str:
    """SERVING / NOT_SERVING / ... as the gRPC health service answers, or UNREACHABLE.
    Credentials: `tls` (checking `server_name`), else those remembered for the address."""
    with channels.make_channel(address, tls=tls, server_name=server_name) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                              timeout=timeout)
        except grpc.RpcError:
            return "UNREACHABLE"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


# --------------------------------------------------------------------------- services

@dataclass
class ServiceProcess:
    """One `ppre -v {tester|client} serve` process in its own process group.

    `argv_tail` is everything after `ppre -v`; `prefix` (e.g. `ip netns exec NS`) is put
    in front. `address` is where others reach it (HOST:PORT). The run directory (cwd,
    TMPDIR, HOME) must stay empty; the log lives beside it.
    """

    name: str
    argv_tail: list[str]
    address: str
    run_dir: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    prefix: list[str] = field(default_factory=list)
    health_address: str | None = None  # where the test reaches its health service (default: address)
    test_keys: bool = True             # the suite's test keys (False: 2048-bit, `child_env`)
    tls: TlsIdentity | None = None     # what the test presents to it (None: plaintext)
    server_name: str | None = None     # the identity its certificate carries
    proc: subprocess.Popen | None = None
    starts: int = 0
    pgids: list[int] = field(default_factory=list)  # every incarnation's group, for the finalizer
    _log_offset: int = 0   # log bytes of earlier incarnations (a restart appends)

    def start(self) -> "ServiceProcess":
        assert self.proc is None or self.proc.poll() is not None, f"{self.name} is already running"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = child_env({"TMPDIR": str(self.run_dir), "HOME": str(self.run_dir), **self.env}, test_keys=self.test_keys)
        with open(self.log_path, "ab") as log:
            log.write(f"==== start {self.starts + 1}: {' '.join(self.argv_tail)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.prefix + ppre_argv() + ["-v"] + self.argv_tail, cwd=self.run_dir,
                                         env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.pgids.append(self.proc.pid)
        self.starts += 1
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout: float = 60.0) -> None:
        address = self.health_address or self.address
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"{self.name} exited with {self.proc.returncode if self.proc else None}:\n"
                                     f"{self.log_tail()}")
            if health_status(address, 1.0, tls=self.tls, server_name=self.server_name) == "SERVING":
                return
            time.sleep(0.2)
        raise AssertionError(f"{self.name} not healthy after {timeout:.0f}s:\n{self.log_tail()}")

    # -- faults -------------------------------------------------------------------------
    def signal_group(self, sig: int) -> None:
        """Send `sig` to the service and its worker processes (its process group)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the whole group (as a container is killed) and reap the service."""
        if self.proc is None:
            return
        self.signal_group(signal.SIGKILL)
        self.signal_group(signal.SIGCONT)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} (pid {self.proc.pid}) survived SIGKILL for {timeout}s") from None
        wait_for(lambda: not group_pids(self.proc.pid), timeout)

    def stop(self) -> None:
        """SIGSTOP the group: the process is frozen, its sockets stay open."""
        self.signal_group(signal.SIGSTOP)

    def cont(self) -> None:
        self.signal_group(signal.SIGCONT)

    def close(self) -> None:
        """Finalizer: never leave the process, its workers (also those of earlier
        incarnations), or a stopped group behind; and forget how this process dialled it,
        so that a later service on a reused port is not dialled with these credentials."""
        channels.forget_dial(self.address)
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.signal_group(signal.SIGCONT)
            self.signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout=12)
            except subprocess.TimeoutExpired:
                pass
        for pgid in self.pgids:
            for sig in (signal.SIGKILL, signal.SIGCONT):
                try:
                    os.killpg(pgid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        wait_for(lambda: not any(group_pids(g) for g in self.pgids), 10)

    # -- observation --------------------------------------------------------------------
    def log_bytes(self, *, current: bool = True) -> bytes:
        """The log of this incarnation (current=True) or of all of them."""
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return b""
        return data[self._log_offset:] if current else data

    def log_tail(self, n: int = 4000) -> str:
        return self.log_bytes(current=False)[-n:].decode(errors="replace")

    def active_sessions(self) -> int | None:
        """The count in the latest `active sessions: N` log line of this incarnation (None: no such line)."""
        found = ACTIVE_SESSIONS_RE.findall(self.log_bytes())
        return int(found[-1]) if found else None

    def session_log_lines(self) -> int:
        return len(ACTIVE_SESSIONS_RE.findall(self.log_bytes()))

    def wait_sessions(self, count: int, timeout: float) -> bool:
        return wait_for(lambda: self.active_sessions() == count, timeout) is not None

    def usage(self) -> Usage:
        return usage(self.pid, self.pid)

    def written_files(self) -> list[Path]:
        return sorted(p for p in self.run_dir.rglob("*")) if self.run_dir.exists() else []


def _service(name: str, argv: list[str], address: str, base: Path, env: dict[str, str] | None,
             prefix: list[str] | None, tls: bool, server_name: str) -> ServiceProcess:
    operator = operator_tls() if tls else None
    # an in-process run_audit / health check to this address presents the operator's certificate
    channels.remember_dial(address, operator, server_name if tls else None)
    return ServiceProcess(name, argv + tls_argv(tls), address, base / f"run-{name}", base / f"{name}.log",
                          env=dict(env or {}), prefix=list(prefix or []), tls=operator,
                          server_name=server_name if tls else None)


def make_tester(base: Path, dataset: Dataset, client_address: str, *, peer_timeout: float | None = None,
                   max_sessions: int | None = None, env: dict[str, str] | None = None, port: int | None = None,
                   extra: list[str] | None = None, tls: bool = True,
                   release_controls: bool = False) -> ServiceProcess:
    """`tls`: mutual TLS with `dev_cert_dir()` (default), else --insecure. The release
    controls are off unless asked for: these tests run many small audits (the controls
    are tested in tests/test_release.py and tests/attacks/)."""
    port = port or free_loopback_port()
    argv = ["tester", "serve", "--host", "127.0.0.1", "--port", str(port), "--client", client_address,
            "--probabilities", str(dataset.probabilities)]
    if not release_controls:
        argv += ["--no-release-controls"]
    elif "--privacy-ledger" not in (extra or []):
        argv += ["--ephemeral-budget"]  # these tests' services live for one test
    if peer_timeout is not None:
        argv += ["--peer-timeout", str(peer_timeout)]
    if max_sessions is not None:
        argv += ["--max-sessions", str(max_sessions)]
    return _service("tester", argv + list(extra or []), f"127.0.0.1:{port}", base, env, None, tls, TESTER_IDENTITY)


def make_client(base: Path, dataset: Dataset, *, peer_timeout: float | None = None,
                   max_sessions: int | None = None, env: dict[str, str] | None = None, host: str = "127.0.0.1",
                   port: int | None = None, prefix: list[str] | None = None,
                   extra: list[str] | None = None, tls: bool = True,
                   accept_noiseless: bool = True) -> ServiceProcess:
    """`tls`: mutual TLS with `dev_cert_dir()` (default), else --insecure.
    `accept_noiseless`: `--accept-noiseless`, on by default since `make_tester` turns the
    release controls off unless asked (the refusal is tested in tests/attacks/)."""
    port = port or free_loopback_port()
    argv = ["client", "serve", "--host", host, "--port", str(port), "--data-dir", str(dataset.client_dir)]
    if accept_noiseless:
        argv += ["--accept-noiseless"]
    if peer_timeout is not None:
        argv += ["--peer-timeout", str(peer_timeout)]
    if max_sessions is not None:
        argv += ["--max-sessions", str(max_sessions)]
    return _service("client", argv + list(extra or []), f"{host}:{port}", base, env, prefix, tls, CLIENT_IDENTITY)


# --------------------------------------------------------------------------- the operator

@dataclass
class Progress:
    at: float       # time.monotonic() when the line arrived
    elapsed_s: float
    phase: str
    message: str


@dataclass
class Outcome:
    """What one `ppre audit` process gave the operator."""

    rc: int | None
    stdout: str
    stderr: str
    started: float
    ended: float
    progress: list[Progress] = field(default_factory=list)
    timed_out: bool = False

    @property
    def json(self) -> dict | None:
        lines = [ln for ln in self.stdout.splitlines() if ln.strip()]
        if len(lines) != 1:
            return None
        try:
            return json.loads(lines[0])
        except ValueError:
            return None

    @property
    def error(self) -> tuple[str, str] | None:
        """(code, message) from the JSON error object, or from the `ppre audit: error (...)` line."""
        obj = self.json
        if isinstance(obj, dict) and set(obj) == {"error"}:
            return obj["error"].get("code"), obj["error"].get("message")
        for line in self.stderr.splitlines():
            match = ERROR_RE.match(line.strip())
            if match:
                return match.group(1), match.group(2)
        return None

    def phases(self) -> list[str]:
        return [p.phase for p in self.progress]

    def describe(self) -> str:
        return (f"rc={self.rc} after {self.ended - self.started:.1f}s timed_out={self.timed_out}\n"
                f"stdout={self.stdout[-2000:]!r}\nstderr={self.stderr[-3000:]!r}")


class OperatorAudit:
    """`ppre audit --tester ADDRESS ...` as a separate process, started in the background.

    Without `as_json` the CLI prints progress lines on stderr; they are parsed as they
    arrive and `on_progress(Progress)` is called for each (from a reader thread), which
    is how a test injects a fault when a phase starts.
    """

    def __init__(self, tester_address: str, dataset: str, *, as_json: bool, bootstrap: int = 20, seed: int = 1,
                 timeout: float = 300.0, on_progress: Callable[[Progress], None] | None = None,
                 extra: list[str] | None = None, tls: bool = True) -> None:
        argv = ppre_argv() + ["audit", "--tester", tester_address, "--client-dataset", dataset, "--metric", "ero",
                              "--bootstrap", str(bootstrap), "--seed", str(seed)] + tls_argv(tls) + list(extra or [])
        if as_json:
            argv.append("--json")
        self.timeout = timeout
        self.on_progress = on_progress
        self.progress: list[Progress] = []
        self.callback_errors: list[BaseException] = []
        self._stdout: list[bytes] = []
        self._stderr: list[str] = []
        self.started = time.monotonic()
        # as a terminal's foreground command: a SIGINT from a test is Ctrl-C
        self.proc = subprocess.Popen(foreground_argv(argv), env=child_env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self._threads = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._threads:
            t.start()

    def _read_stdout(self) -> None:
        for chunk in iter(lambda: self.proc.stdout.read(65536), b""):
            self._stdout.append(chunk)

    def _read_stderr(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            self._stderr.append(line)
            match = PROGRESS_RE.match(line)
            if match:
                event = Progress(time.monotonic(), float(match.group(1)), match.group(2), match.group(3))
                self.progress.append(event)
                if self.on_progress is not None:
                    try:
                        self.on_progress(event)
                    except BaseException as exc:  # noqa: BLE001 - reported by wait()
                        self.callback_errors.append(exc)

    def wait(self, timeout: float | None = None) -> Outcome:
        timeout = self.timeout if timeout is None else timeout
        timed_out = False
        try:
            self.proc.wait(timeout=max(0.0, self.started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            self.kill()
        ended = time.monotonic()
        for t in self._threads:
            t.join(timeout=10)
        if self.callback_errors:
            raise self.callback_errors[0]
        return Outcome(self.proc.returncode, b"".join(self._stdout).decode(errors="replace"),
                       "\n".join(self._stderr), self.started, ended, list(self.progress), timed_out)

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


# --------------------------------------------------------------------------- a TCP proxy that can freeze

class FreezableProxy:
    """A loopback TCP forwarder (one thread per direction per connection).

    `freeze()` stops moving bytes in both directions while every socket stays open, as
    a cut link looks to both ends: writes pile up in the kernel buffers, nothing arrives,
    no FIN or RST is sent. `thaw()` resumes forwarding; connections whose ends closed in
    the meantime are dropped when the proxy notices.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._frozen = threading.Event()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.connections = 0
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._accept_thread = threading.Thread(target=self._accept, name="proxy-accept", daemon=True)
        self._accept_thread.start()

    @property
    def frozen(self) -> bool:
        return self._frozen.is_set()

    def freeze(self) -> None:
        self._frozen.set()

    def thaw(self) -> None:
        self._frozen.clear()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                down, _ = self.listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            # A new connection while frozen is accepted (SYN is answered by our kernel)
            # but not connected onwards until the link is back, as with a cut link.
            threading.Thread(target=self._connect, args=(down,), daemon=True).start()

    def _connect(self, down: socket.socket) -> None:
        while self._frozen.is_set() and not self._closed.is_set():
            time.sleep(0.05)
        try:
            up = socket.create_connection(self.target, timeout=5)
        except OSError:
            down.close()
            return
        with self._lock:
            if self._closed.is_set():
                up.close()
                down.close()
                return
            self._sockets.update((up, down))
            self.connections += 1
        pair_done = threading.Event()
        for src, dst in ((down, up), (up, down)):
            threading.Thread(target=self._pump, args=(src, dst, pair_done), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, pair_done: threading.Event) -> None:
        try:
            while not self._closed.is_set() and not pair_done.is_set():
                if self._frozen.is_set():
                    time.sleep(0.05)
                    continue
                ready, _, _ = select.select([src], [], [], 0.2)
                if not ready or self._frozen.is_set():
                    continue
                data = src.recv(262144)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            pair_done.set()
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
                with self._lock:
                    self._sockets.discard(s)

    def open_connections(self) -> int:
        with self._lock:
            return len(self._sockets) // 2

    def close(self) -> None:
        self._closed.set()
        self._frozen.clear()
        try:
            self.listener.close()
        except OSError:
            pass
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for s in sockets:
            try:
                s.close()
            except OSError:
                pass
        self._accept_thread.join(timeout=5)


# --------------------------------------------------------------------------- network namespaces
# The one harness for tests that run services in network namespaces (as root, where `ip
# netns` works: `tests.helpers.netns_usable`): one namespace on a veth link that can go
# down (`VethNamespace`, tests/test_faults.py) and one namespace per service on a private
# bridge (`NetnsNetwork`, tests/test_compose.py). Every name holds the test process's pid,
# so that `sweep_stale_namespaces` removes what a run killed hard left behind.

_VETH_PREFIX = "ppre-f"     # VethNamespace: ppre-f<pid>x<n>
_BRIDGE_PREFIX = "ppre-t"   # NetnsNetwork: ppre-t<pid>x<n>-<service>
_NS_RE = re.compile(rf"^(?:{_VETH_PREFIX}|{_BRIDGE_PREFIX})(\d+)x(\d+)(?:-|$)")
_BRIDGE_RE = re.compile(r"\bppb([0-9a-f]+)x\d+\b")
_ns_counter = iter(range(1, 10_000))
_ETC_NETNS = Path("/etc/netns")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _iptables(*args: str) -> subprocess.CompletedProcess | None:
    """`iptables -w ARGS`, or None where there is no iptables (then nothing filters the bridge)."""
    if not shutil.which("iptables"):
        return None
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, timeout=30)


def _forward_rules(bridge: str) -> list[list[str]]:
    """The FORWARD rules that let the test's bridge carry traffic between its namespaces.

    A running Docker engine sets the FORWARD policy to DROP and loads br_netfilter, so
    frames bridged between two namespaces are filtered like routed packets and the
    Tester cannot reach the Test-Client. Accepting this one bridge's traffic, ahead of
    every other rule, leaves the host's policy as it was.
    """
    return [["FORWARD", "-i", bridge, "-j", "ACCEPT"], ["FORWARD", "-o", bridge, "-j", "ACCEPT"]]


def _delete_namespace(name: str) -> None:
    """Kill the processes left in a namespace, then delete it and its /etc/netns entry."""
    for pid in _ip("netns", "pids", name, check=False).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    _ip("netns", "del", name, check=False)
    shutil.rmtree(_ETC_NETNS / name, ignore_errors=True)


def _delete_link(name: str) -> None:
    if name and _ip("link", "show", name, check=False).returncode == 0:
        _ip("link", "del", name, check=False)


def _remove_etc_netns() -> None:
    try:
        _ETC_NETNS.rmdir()      # only if empty: someone else's namespace config may be there
    except OSError:
        pass


def _free_subnet(second_octet: int, prefixlen: int) -> ipaddress.IPv4Network:
    """A random 10.<second_octet>.X.0/<prefixlen> that no address or route here uses."""
    used = _ip("-4", "-o", "addr", "show", check=False).stdout + \
        _ip("-4", "route", "show", "table", "all", check=False).stdout
    free = [x for x in range(1, 255) if f"10.{second_octet}.{x}." not in used]
    if not free:
        raise RuntimeError(f"no free 10.{second_octet}.X.0/{prefixlen}")
    return ipaddress.ip_network(f"10.{second_octet}.{random.SystemRandom().choice(free)}.0/{prefixlen}")


def _veth_into(ns: str, host_end: str, ns_end: str, address: str) -> None:
    """A veth pair whose `ns_end` becomes `eth0` of the (new) namespace `ns`, holding
    `address` (with its prefix length); both it and the namespace's loopback up."""
    _ip("netns", "add", ns)
    _ip("link", "add", host_end, "type", "veth", "peer", "name", ns_end)
    _ip("link", "set", ns_end, "netns", ns)
    _ip("-n", ns, "link", "set", ns_end, "name", "eth0")
    _ip("-n", ns, "addr", "add", address, "dev", "eth0")
    _ip("-n", ns, "link", "set", "lo", "up")
    _ip("-n", ns, "link", "set", "eth0", "up")


def sweep_stale_namespaces() -> None:
    """Remove namespaces (and the processes in them), links, /etc/netns entries and
    FORWARD rules left by earlier runs that died hard (their pid is gone)."""
    for name in _ip("netns", "list", check=False).stdout.split():
        match = _NS_RE.match(name)
        if match and not pid_alive(int(match.group(1))):
            _delete_namespace(name)
            tag = f"{int(match.group(1)):x}x{match.group(2)}"
            _delete_link(f"pfh{tag}")
            _delete_link(f"ppb{tag}")
            _remove_etc_netns()
    listed = _iptables("-S", "FORWARD")
    for rule in listed.stdout.splitlines() if listed is not None and listed.returncode == 0 else ():
        match = _BRIDGE_RE.search(rule)
        if rule.startswith("-A FORWARD ") and match and not pid_alive(int(match.group(1), 16)):
            _iptables("-D", *rule.split()[1:])


@dataclass
class VethNamespace:
    """A network namespace joined to the root namespace by one veth pair (a /30).

    Root side `host_if` holds .1, the namespace's `eth0` holds .2: traffic between the
    two is local on both sides (no bridge, no forwarding, so no iptables FORWARD policy
    is involved). `link_down()` cuts the link by setting the root side down.
    """

    name: str = ""
    host_if: str = ""
    host_ip: str = ""
    ns_ip: str = ""

    def setup(self) -> None:
        pid, n = os.getpid(), next(_ns_counter)
        self.name = f"{_VETH_PREFIX}{pid}x{n}"
        self.host_if = f"pfh{pid:x}x{n}"       # <= 15 characters
        hosts = list(_free_subnet(232, 30).hosts())
        self.host_ip, self.ns_ip = str(hosts[0]), str(hosts[1])
        try:
            _veth_into(self.name, self.host_if, f"pfn{pid:x}x{n}", f"{self.ns_ip}/30")
            _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
            _ip("link", "set", self.host_if, "up")
        except Exception:
            self.teardown()
            raise

    def exec_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def link_down(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def link_up(self) -> None:
        _ip("link", "set", self.host_if, "up")
        # the connected route comes back with the link; wait until the peer answers ARP/ICMP
        wait_for(lambda: subprocess.run(["ping", "-c", "1", "-W", "1", self.ns_ip], capture_output=True,
                                        timeout=5).returncode == 0 if shutil.which("ping") else True, 15)

    def teardown(self) -> None:
        if self.name:
            _delete_namespace(self.name)
        _delete_link(self.host_if)
        self.name = ""
        self.host_if = ""


@dataclass
class NetnsNetwork:
    """One bridge in the root namespace, one namespace + veth per service (a /24 for all:
    the bridge holds .1, the services .10 on). Each namespace resolves the services' names
    through its /etc/netns/<ns>/hosts (which `ip netns exec` bind-mounts)."""

    service_names: list[str]
    tag: str = ""
    subnet: ipaddress.IPv4Network | None = None
    bridge: str = ""
    namespaces: dict[str, str] = field(default_factory=dict)
    addresses: dict[str, str] = field(default_factory=dict)
    host_links: list[str] = field(default_factory=list)
    forward_rules: list[list[str]] = field(default_factory=list)
    created_etc_netns: bool = False

    def setup(self) -> None:
        pid, n = os.getpid(), next(_ns_counter)
        self.tag = f"{pid}x{n}"
        self.bridge = f"ppb{pid:x}x{n}"                       # <= 15 characters
        self.subnet = _free_subnet(231, 24)
        hosts = list(self.subnet.hosts())
        gateway = hosts[0]
        self.addresses = {name: str(hosts[9 + i]) for i, name in enumerate(self.service_names)}
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self.host_links.append(self.bridge)
            _ip("addr", "add", f"{gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            listed = _iptables("-S", "FORWARD")
            if listed is not None and listed.returncode == 0:     # a firewall that may filter the bridge
                for rule in _forward_rules(self.bridge):
                    added = _iptables("-I", *rule)
                    if added.returncode != 0:
                        raise RuntimeError(f"`iptables -I {' '.join(rule)}` failed: {added.stderr.strip()}")
                    self.forward_rules.append(rule)
            self.created_etc_netns = not _ETC_NETNS.exists()
            _ETC_NETNS.mkdir(mode=0o755, exist_ok=True)
            hosts_text = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n" + "".join(
                f"{addr}\t{name}\n" for name, addr in self.addresses.items())
            for i, name in enumerate(self.service_names):
                ns = f"{_BRIDGE_PREFIX}{self.tag}-{name}"
                host_end = f"pph{pid:x}x{n}{i}"
                (_ETC_NETNS / ns).mkdir(mode=0o755, parents=True)
                (_ETC_NETNS / ns / "hosts").write_text(hosts_text)
                self.namespaces[name] = ns
                self.host_links.append(host_end)
                _veth_into(ns, host_end, f"ppn{pid:x}x{n}{i}", f"{self.addresses[name]}/{self.subnet.prefixlen}")
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

    def exec_prefix(self, service: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[service]]

    def teardown(self) -> None:
        for rule in self.forward_rules:
            _iptables("-D", *rule)
        self.forward_rules.clear()
        for ns in list(self.namespaces.values()):
            _delete_namespace(ns)
        self.namespaces.clear()
        for link in reversed(self.host_links):      # veth host ends die with their peers
            _delete_link(link)
        self.host_links.clear()
        if self.created_etc_netns:
            _remove_etc_netns()
