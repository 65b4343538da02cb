"""`--executor dask://HOST:PORT`: a service's per-row work on a Dask distributed cluster.

`DaskExecutor` is a `common.execution.parallel.Executor` over a `distributed.Client`: the chunk
functions a session hands its executor (`run_chunks`, `stream`, `submit`) run as Dask
tasks on the cluster's workers instead of a pool of local processes, for a service whose
per-row work should use more cores than its host has. Addresses: `dask://HOST:PORT`
(plain TCP, the same as `tcp://HOST:PORT`) or `tls://HOST:PORT` (Dask's TLS, set up with
Dask's own settings, below); PORT defaults to 8786, the scheduler's.

What travels to the cluster. Each task is a chunk function and its arguments, pickled:
top-level functions over raw integers and bytes (ciphertexts, curve points, hashed ids),
and the narrow task objects a key builds for one operation (`PrivateKey.decrypt_task()`
carries the Paillier prime p, `CommutativeKey.multiply_task()` an X25519 scalar,
`SessionSalt.hash_task()` the session salt, with member ids as arguments). Never a key
object itself (those refuse pickling). So the scheduler and every worker hold, in memory
and for as long as the task runs, key material and member-level data of the party whose
service uses the cluster. Hence:

* the cluster belongs to that party, inside its trust boundary: the Tester and the
  Test-Client each use their own (one party's workers would otherwise see the other's
  keys); `ppre demo`, `audit --local` and the compose file's `dask` profile share one
  cluster between both services only because one operator runs everything there;
* **nothing is ever written to disk.** A Dask worker spills task data to its local
  directory when its memory fills (`distributed.worker.memory.target` / `.spill`), which
  would put key material and member data at rest. `start()` runs a check on every
  worker (`client.run`) and refuses (`InputError`, parameter `--executor`) a cluster
  where any worker could spill: both fractions must be False and the worker's store a
  plain in-memory dict. Start workers with

      DASK_DISTRIBUTED__WORKER__MEMORY__TARGET=False \\
      DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False  dask worker tcp://SCHEDULER:8786

  (`False` capitalised: Dask reads the value as a Python literal). Pausing
  (`...__PAUSE`) may stay: a paused worker only stops taking tasks. Workers that join
  later are checked before they get a task (every task is restricted to checked
  workers); one that fails is left out and named in a warning. The check also turns
  core dumps off in each worker process (`common.execution.memory.protect_process`, as the local
  pool's workers do), so a crashing worker leaves no image of its memory on disk;
* a task that raises returns its exception as a value (`_Task`), so the worker never
  logs "Compute Failed" with the task's arguments; it is raised again here. Futures are
  released as soon as their result is taken (`_DaskFuture.result`), so a worker keeps a
  chunk's result only until the service has it; `stream`'s window bounds what is in
  flight;
* the links to the scheduler and between it and the workers carry those tasks: they must
  be a private network (as the compose file's internal network is), or `tls://` with
  Dask's TLS settings on the service (`DASK_DISTRIBUTED__COMM__TLS__CA_FILE`,
  `...__TLS__CLIENT__CERT`, `...__TLS__CLIENT__KEY`, and `DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True`)
  and on the scheduler and workers (`dask scheduler --tls-ca-file ... --tls-cert ...
  --tls-key ...`, the same for `dask worker`). A `tcp://` address that is not loopback
  is accepted with a warning;
* every worker must have this package installed (the same version as the service):
  tasks name functions of `common`, `tester_service` and `client_service` by reference.
  A worker that cannot import them fails the check.

`workers` is the number of threads of the checked workers (at least 1), what
`chunk_count()` cuts each step into; reading it connects if `start()` was not called.
`shutdown()` closes this service's client only, never the cluster.
"""
from __future__ import annotations

import ipaddress
import logging
import re
import threading
import time
import traceback
import uuid
from typing import Any, Callable

from common.execution import parallel
from common.errors import InputError, ShuttingDownError

log = logging.getLogger("ppre.dask")

#: how long `start()` tries to reach the scheduler
CONNECT_TIMEOUT_S = 10.0
#: how long `start()` (and a task with no checked worker to run on) waits for a worker
WORKER_WAIT_S = 30.0
#: how often the set of workers is looked at again (new ones checked, gone ones dropped)
REFRESH_S = 5.0
#: how long `result()` waits before it looks whether the task's workers are still there
POLL_S = 5.0
#: how long closing the client may take
CLOSE_TIMEOUT_S = 10.0
#: the scheduler's default port
DEFAULT_PORT = 8786

_ADDRESS = re.compile(r"(?P<scheme>dask|tcp|tls)://"
                      r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?)"
                      r"(?::(?P<port>\d{1,5}))?/?")
_SPILL_OFF = ("DASK_DISTRIBUTED__WORKER__MEMORY__TARGET=False and DASK_DISTRIBUTED__WORKER__MEMORY__SPILL=False "
              "in every worker's environment (`False` capitalised)")


def parse_address(spec: str) -> tuple[str, str]:
    """(the address `distributed.Client` dials, the executor's name) of `dask://HOST:PORT`,
    `tcp://HOST:PORT` or `tls://HOST:PORT`; a malformed one is an `InputError`."""
    text = (spec or "").strip()
    match = _ADDRESS.fullmatch(text)
    port = int(match.group("port")) if match and match.group("port") else DEFAULT_PORT
    if match is None or not 0 < port < 65536:
        shown = text if len(text) <= 100 else text[:100] + "..."
        raise InputError(f"'{shown}' is not a Dask scheduler address: expected dask://HOST:PORT "
                         f"(or tcp://HOST:PORT, tls://HOST:PORT; PORT defaults to {DEFAULT_PORT})",
                         parameter="--executor")
    scheme, host = match.group("scheme"), match.group("host")
    dial = f"{'tls' if scheme == 'tls' else 'tcp'}://{host}:{port}"
    name = f"{'tls' if scheme == 'tls' else 'dask'}://{host}:{port}"
    return dial, name


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --------------------------------------------------------------------------- on the workers

def _inspect_worker(dask_worker) -> dict:
    """Run on each worker by `client.run`: turn its core dumps off, and say whether it
    could write task data to disk. Importing this module there is also the check that the
    worker has this package."""
    import dask.config

    from common.execution.memory import protect_process

    protect_process()
    manager = getattr(dask_worker, "memory_manager", None)
    target = getattr(manager, "memory_target_fraction", dask.config.get("distributed.worker.memory.target"))
    spill = getattr(manager, "memory_spill_fraction", dask.config.get("distributed.worker.memory.spill"))
    data = getattr(dask_worker, "data", None)
    state = getattr(dask_worker, "state", None)
    nthreads = getattr(state, "nthreads", None) or getattr(dask_worker, "nthreads", 1)
    return {"target": repr(target), "spill": repr(spill), "target_off": target is False, "spill_off": spill is False,
            "store": type(data).__name__, "memory_only": type(data) is dict, "nthreads": int(nthreads)}


class _Failure:
    """What a task that raised returns instead of raising (module docstring): the
    exception (or, when it cannot be pickled, its type's name) and the worker's traceback."""

    def __init__(self, exc: BaseException) -> None:
        import pickle
        try:
            pickle.dumps(exc)
            self.exc: BaseException | None = exc
        except Exception:
            self.exc = None
        self.type_name = type(exc).__name__
        self.traceback = "".join(traceback.format_exception(exc))

    def reraise(self) -> None:
        exc = self.exc or RuntimeError(f"a Dask task failed with {self.type_name} (the exception could not be "
                                       f"sent back)")
        exc.__cause__ = _RemoteTraceback(self.traceback)
        raise exc


class _RemoteTraceback(Exception):
    """The worker's traceback, chained under the exception raised here (like a process
    pool's)."""

    def __str__(self) -> str:
        return f'\n"""\n{self.args[0]}"""'


class _Task:
    """fn(*args) on a worker; an exception comes back as a `_Failure` value."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any) -> Any:
        try:
            return self.fn(*args)
        except Exception as exc:
            return _Failure(exc)


def _task_name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return re.sub(r"[^A-Za-z0-9_]", "_", name)[:60] or "task"


# --------------------------------------------------------------------------- in the service

class _DaskFuture:
    """One submitted task: `result()` waits for it (a task stranded on workers that are
    gone is submitted again to the checked ones) and releases the Dask future at once, so
    the cluster drops the chunk's result; `done()` tells whether it has finished;
    `cancel()` releases it too."""

    def __init__(self, executor: "DaskExecutor", future, fn: Callable[..., Any], args: tuple,
                 allowed: list[str]) -> None:
        self._executor = executor
        self._future = future
        self._call: tuple | None = (fn, args)
        self._allowed = set(allowed)
        self._done = False
        self._value: Any = None
        self._failure: _Failure | None = None

    def result(self, timeout: float | None = None) -> Any:
        if not self._done:
            self._wait(timeout)
        if self._failure is not None:
            self._failure.reraise()
        return self._value

    def _wait(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            future = self._future
            if future is None:
                raise _cancelled()
            wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            try:
                value = future.result(timeout=wait)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
                self._resubmit_if_stranded()
                continue
            except BaseException:
                self._release()
                raise
            break
        self._release()
        self._done = True
        if isinstance(value, _Failure):
            self._failure = value
        else:
            self._value = value

    def _resubmit_if_stranded(self) -> None:
        """The task may run only on workers checked when it was submitted: when none of them
        is left (a restarted worker comes back under a new address), submit it again."""
        if self._allowed & self._executor.checked_workers(refresh=True):
            return
        fn, args = self._call
        old = self._future
        self._future, self._allowed = self._executor._submit_task(fn, args)
        try:
            old.cancel()
        except Exception:
            pass

    def _release(self) -> None:
        self._future = None
        self._call = None

    def done(self) -> bool:
        """Whether `result()` would return (or raise) without waiting."""
        future = self._future
        return self._done or future is None or future.done()

    def cancel(self) -> bool:
        future = self._future
        self._release()
        if future is None or self._done:
            return False
        try:
            future.cancel()
        except Exception:  # the client is closing; the scheduler drops the task with it
            return False
        return True


def _cancelled() -> BaseException:
    from concurrent.futures import CancelledError
    return CancelledError("the Dask task was cancelled")


class DaskExecutor(parallel.Executor):
    """Chunks on a Dask distributed cluster (module docstring)."""

    def __init__(self, spec: str, *, connect_timeout: float = CONNECT_TIMEOUT_S,
                 worker_wait: float = WORKER_WAIT_S) -> None:
        self.address, self.name = parse_address(spec)
        self._connect_timeout = connect_timeout
        self._worker_wait = worker_wait
        self._lock = threading.RLock()
        self._client = None
        self._closed = False
        self._checked: dict[str, int] = {}     # worker address -> threads, checked: no spilling
        self._refused: dict[str, str] = {}     # worker address -> why it gets no task
        self._refreshed_at = 0.0

    def __repr__(self) -> str:
        return f"DaskExecutor({self.name}, {'connected' if self._client is not None else 'not connected'})"

    # -- state -----------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._client is not None

    @property
    def workers(self) -> int:  # type: ignore[override]
        """Threads of the checked workers (at least 1); connects if not yet started."""
        self._get_client()
        with self._lock:
            return max(1, sum(self._checked.values()))

    def checked_workers(self, refresh: bool = False) -> set[str]:
        """Addresses of the workers that passed the check (and are still connected)."""
        self._get_client()
        self._refresh(force=refresh)
        with self._lock:
            return set(self._checked)

    # -- connecting ------------------------------------------------------------------------
    def start(self) -> "DaskExecutor":
        """Connect, wait for a worker, and check every worker (module docstring); an
        `InputError` naming --executor when the scheduler cannot be reached or a worker
        could spill to disk."""
        self._get_client()
        return self

    def _get_client(self):
        with self._lock:
            if self._closed:
                raise ShuttingDownError(f"the Dask executor ({self.name}) is shut down")
            if self._client is None:
                client = self._connect()
                try:
                    self._first_check(client)
                except BaseException:
                    self._close(client, CLOSE_TIMEOUT_S)
                    raise
                self._client = client
            return self._client

    def _connect(self):
        import distributed
        from distributed.security import Security

        security = Security()
        if self.address.startswith("tls://") and not (security.tls_ca_file and security.tls_client_cert):
            raise InputError(f"{self.name} is a TLS address, but Dask's TLS settings are missing: set "
                             f"DASK_DISTRIBUTED__COMM__TLS__CA_FILE, DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT and "
                             f"DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY (or the same keys in a Dask config file)",
                             parameter="--executor")
        host = self.address.split("://", 1)[1].rsplit(":", 1)[0]
        if self.address.startswith("tcp://") and not _is_loopback(host):
            log.warning("executor %s: the link to the Dask cluster is not encrypted and carries key material "
                        "and member-level data; use it only on a private network, or tls://", self.name)
        try:
            client = distributed.Client(self.address, timeout=self._connect_timeout, security=security,
                                        set_as_default=False, name="ppre")
        except (OSError, TimeoutError) as exc:
            reason = str(exc).split("\n", 1)[0][:200] or type(exc).__name__
            raise InputError(f"cannot reach the Dask scheduler at {self.name} within {self._connect_timeout:g} s "
                             f"({reason}): is `dask scheduler` running there?", parameter="--executor") from None
        except Exception as exc:  # a TLS context Dask could not build, an unknown scheme, ...
            raise InputError(f"cannot connect to the Dask scheduler at {self.name}: {type(exc).__name__}: "
                             f"{str(exc)[:200]}", parameter="--executor") from None
        log.info("executor %s: connected to the Dask scheduler", self.name)
        return client

    def _first_check(self, client) -> None:
        try:
            client.wait_for_workers(1, timeout=self._worker_wait)
        except TimeoutError:
            raise InputError(f"no Dask worker joined the scheduler at {self.name} within {self._worker_wait:g} s; "
                             f"start workers (`dask worker {self.address}` with {_SPILL_OFF})",
                             parameter="--executor") from None
        good, bad = self._check(client, None)
        if bad:
            shown = "; ".join(f"{addr}: {why}" for addr, why in sorted(bad.items())[:3])
            more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
            raise InputError(f"the Dask cluster at {self.name} is refused: {len(bad)} of {len(good) + len(bad)} "
                             f"workers could write task data (key material, member-level data) to disk or cannot "
                             f"run this package's tasks — {shown}{more}. Start every worker with {_SPILL_OFF}, "
                             f"and with this package installed", parameter="--executor")
        with self._lock:
            self._checked = good
            self._refreshed_at = time.monotonic()
        log.info("executor %s: %d workers, %d threads, spilling off on every one", self.name, len(good),
                 sum(good.values()))

    @staticmethod
    def _check(client, addresses: list[str] | None) -> tuple[dict[str, int], dict[str, str]]:
        """({address: threads} of the workers that pass, {address: why} of the others)."""
        try:
            reports = client.run(_inspect_worker, workers=addresses, on_error="return")
        except Exception as exc:
            raise InputError(f"cannot check the Dask workers ({type(exc).__name__}: {str(exc)[:200]}); is this "
                             f"package installed on every worker?", parameter="--executor") from None
        good, bad = {}, {}
        for address, report in reports.items():
            if isinstance(report, BaseException):
                bad[address] = (f"the check failed on it ({type(report).__name__}: {str(report)[:120]}); is this "
                                f"package installed there?")
            elif not (report["target_off"] and report["spill_off"] and report["memory_only"]):
                bad[address] = (f"memory target {report['target']}, spill {report['spill']}, store "
                                f"{report['store']} (spilling must be off: both False, a plain in-memory store)")
            else:
                good[address] = max(1, report["nthreads"])
        return good, bad

    def _refresh(self, force: bool = False) -> None:
        """Look at the cluster's workers again (at most every REFRESH_S unless forced):
        check the new ones, drop the gone ones."""
        with self._lock:
            client = self._client
            if client is None or (not force and time.monotonic() - self._refreshed_at < REFRESH_S):
                return
            self._refreshed_at = time.monotonic()
            current = client.nthreads()
            new = [a for a in current if a not in self._checked and a not in self._refused]
            good, bad = self._check(client, new) if new else ({}, {})
            for address, why in bad.items():
                log.warning("executor %s: worker %s gets no task: %s", self.name, address, why)
            self._checked = {a: n for a, n in self._checked.items() if a in current}
            self._checked.update(good)
            self._refused = {a: why for a, why in {**self._refused, **bad}.items() if a in current}

    # -- work ------------------------------------------------------------------------------
    def _submit_task(self, fn: Callable[..., Any], args: tuple):
        """(the Dask future of fn(*args), the workers it may run on): only checked ones,
        waiting up to WORKER_WAIT_S for one when none is connected."""
        client = self._get_client()
        self._refresh()
        deadline = time.monotonic() + self._worker_wait
        with self._lock:
            allowed = sorted(self._checked)
        while not allowed:
            if time.monotonic() > deadline:
                raise InputError(f"no checked Dask worker (spilling off) is connected to {self.name} "
                                 f"(for {self._worker_wait:g} s)", parameter="--executor")
            time.sleep(min(1.0, REFRESH_S))
            self._refresh(force=True)
            with self._lock:
                allowed = sorted(self._checked)
        future = client.submit(_Task(fn), *args, key=f"ppre-{_task_name(fn)}-{uuid.uuid4().hex}", pure=False,
                               workers=allowed, allow_other_workers=False)
        return future, set(allowed)

    def submit(self, fn: Callable[..., Any], *args: Any) -> _DaskFuture:
        future, allowed = self._submit_task(fn, args)
        return _DaskFuture(self, future, fn, args, sorted(allowed))

    def shutdown(self, wait: bool = True) -> None:
        """Close this service's client (its tasks are dropped with it); never the cluster."""
        with self._lock:
            client, self._client = self._client, None
            self._closed = True
        if client is not None:
            self._close(client, CLOSE_TIMEOUT_S if wait else 2.0)

    @staticmethod
    def _close(client, timeout: float) -> None:
        try:
            client.close(timeout=timeout)
        except Exception as exc:  # a scheduler already gone: nothing left to release
            log.debug("closing the Dask client: %s", type(exc).__name__)
