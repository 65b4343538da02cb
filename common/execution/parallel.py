"""Where heavy chunk functions run: the executor a session receives.

Protocol code never chooses where its work runs: each session is handed an `Executor`
(its service's, made once at start-up from `--executor` / `PPRE_EXECUTOR`) and calls
`executor.run_chunks(fn, argument_tuples)`, `executor.stream(...)` or
`executor.submit(...)` with top-level functions over raw integers and bytes
(`common.crypto.paillier.*_chunk`, `tester_service.aggregation`) or a narrow, picklable task
object built by a key for that one operation (`PrivateKey.decrypt_task()`,
`PrivateKey.encrypt_task()`, `CommutativeKey.multiply_task()`, `SessionSalt.hash_task()`:
never the key object itself, which refuses pickling). Three executors:

* `InlineExecutor` (`inline`): in the calling thread; what the sans-I/O sessions use
  when given nothing (tests, one-process tools).
* `ProcessExecutor` (`processes`, `processes:N`; the services' embedded default, N =
  `PPRE_WORKERS` or the CPU count): a pool of local worker processes started with
  `spawn` (never `fork`: the gRPC server's threads must not be copied, nor the parent's
  keys). Secrets travel to them only pickled through the pool's in-memory pipes, never
  through a file, and the pool drops each task once its chunk is done. Workers never
  dump core and exit with their service (`_exit_with_parent`).
* `DaskExecutor` (`dask://HOST:PORT`, `common.execution.dask_executor`): a Dask distributed
  cluster, for a service whose per-row work should run on more cores than its host has.

This module holds the interface and the local executors and imports no executor module;
`common.execution.executors.executor_from_spec` (the factory, which imports them all) turns the
text form into one; `shutdown()` stops it.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Sequence

from common.errors import InputError

#: the long steps (bootstrap, decryption) are cut into at least this many chunks
CHECKPOINT_CHUNKS = 16
#: how often a worker checks that the service that started it is still alive
PARENT_CHECK_S = 1.0


def worker_count() -> int:
    """`PPRE_WORKERS`, or the number of CPUs: the size of a local process pool."""
    value = os.environ.get("PPRE_WORKERS")
    if value:
        if not value.strip().isdigit():
            raise InputError(f"must be a whole number of processes, got '{value}'", parameter="PPRE_WORKERS")
        return max(1, int(value))
    return max(1, os.cpu_count() or 1)


def split(seq: Sequence[Any], parts: int) -> list[Sequence[Any]]:
    """Split into at most `parts` contiguous, near-equal, non-empty slices."""
    parts = max(1, min(parts, len(seq)))
    size, extra = divmod(len(seq), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(seq[start:end])
        start = end
    return out


class _Done:
    """An inline 'future': the call already ran (or raised) when it was submitted."""

    __slots__ = ("_value", "_error")

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self._value = self._error = None
        try:
            self._value = fn(*args)
        except BaseException as exc:  # re-raised by result(), like a pool's future
            self._error = exc

    def result(self, timeout: float | None = None) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def done(self) -> bool:
        return True

    def cancel(self) -> bool:
        return False


class Executor:
    """Where a session's chunk functions run (module docstring). Subclasses give
    `workers`, `submit` and `shutdown`; the rest is common."""

    #: how many chunks can run at once (1: inline)
    workers: int = 1
    #: what the report and the logs call it (no address secrets: an address only)
    name: str = "inline"

    def submit(self, fn: Callable[..., Any], *args: Any):
        """Start fn(*args); returns a future: `result()` waits for it, `done()` tells
        whether it has finished, `cancel()` drops it if it has not started."""
        raise NotImplementedError

    def shutdown(self, wait: bool = True) -> None:
        """Stop the executor; `wait=False` (a service shutting down) does not wait for
        chunks still running."""

    def chunk_count(self, minimum: int = 1) -> int:
        """How many chunks to cut a step into: two per worker (load balance), and at least
        `minimum` (`CHECKPOINT_CHUNKS` for the long steps, so checkpoints come every few
        seconds)."""
        return max(minimum, 2 * self.workers)

    def run_chunks(self, fn: Callable[..., Any], argument_tuples: Sequence[tuple], *, min_parallel: int = 2,
                   checkpoint: Callable[[], None] | None = None) -> list[Any]:
        """[fn(*args) for args in argument_tuples], in order, on the workers when worthwhile.

        `checkpoint()` runs after each chunk; whatever it raises stops the call (chunks not
        yet started are cancelled), which is how a session abandons work nobody awaits.
        """
        if self.workers <= 1 or len(argument_tuples) < min_parallel:
            results = []
            for args in argument_tuples:
                results.append(fn(*args))
                if checkpoint is not None:
                    checkpoint()
            return results
        return list(self.stream(fn, argument_tuples, checkpoint=checkpoint, window=len(argument_tuples)))

    def stream(self, fn: Callable[..., Any], argument_tuples: Iterable[tuple], *, window: int | None = None,
               checkpoint: Callable[[], None] | None = None) -> Iterator[Any]:
        """fn(*args) for each args, yielded in order as they finish, with at most `window`
        chunks in flight (default: two per worker) and `argument_tuples` read only as
        chunks are started: a producer of bounded memory whose consumer (e.g. the gRPC
        stream) can work on one result while the workers compute the next ones."""
        window = max(1, window or 2 * self.workers)
        pending: collections.deque = collections.deque()
        todo = iter(argument_tuples)
        try:
            for args in todo:
                pending.append(self.submit(fn, *args))
                while len(pending) >= window:
                    yield pending.popleft().result()
                    if checkpoint is not None:
                        checkpoint()
            while pending:
                yield pending.popleft().result()
                if checkpoint is not None:
                    checkpoint()
        finally:
            for future in pending:  # a consumer that stopped early, or a failed chunk
                future.cancel()


class InlineExecutor(Executor):
    """Every chunk in the calling thread."""

    workers = 1
    name = "inline"

    def submit(self, fn: Callable[..., Any], *args: Any) -> _Done:
        return _Done(fn, args)


def _exit_with_parent(parent: int) -> None:
    """Worker initializer: no core dumps (`common.execution.memory.protect_process`: a worker holds
    key material and tables too), and the worker exits as soon as its service is gone. A
    service killed on its own (SIGKILL, the OOM killer) would otherwise leave its workers
    running: they wait on the pool's pipe, whose other end they also hold, so they never
    see it close."""
    import signal

    from common.execution.memory import protect_process
    protect_process()
    # Ctrl-C in a terminal reaches the whole process group: the service (or `ppre audit
    # --local`) ends its audits cleanly and then stops the pool; a worker dying of it first
    # would break the pool under the running audit.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)
    threading.Thread(target=watch, name="ppre-parent-watch", daemon=True).start()


class ProcessExecutor(Executor):
    """A pool of `workers` local processes, started on first use (module docstring)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = max(1, workers if workers is not None else worker_count())
        self.name = f"processes:{self.workers}"
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    @property
    def started(self) -> bool:
        return self._pool is not None

    def _get_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPoolExecutor(max_workers=self.workers,
                                                 mp_context=multiprocessing.get_context("spawn"),
                                                 initializer=_exit_with_parent, initargs=(os.getpid(),))
            return self._pool

    def start(self) -> "ProcessExecutor":
        """Start the worker processes now (a service does so at start-up, so that the
        first audit does not wait for them)."""
        if self.workers > 1:
            pool = self._get_pool()
            for future in [pool.submit(os.getpid) for _ in range(self.workers)]:
                future.result()
        return self

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future | _Done:
        if self.workers <= 1:
            return _Done(fn, args)
        return self._get_pool().submit(fn, *args)

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is None:
            return
        # ProcessPoolExecutor has no public way to stop busy workers before Python 3.14
        # (terminate_workers); its process table is the only handle on them.
        workers = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=wait, cancel_futures=True)
        if not wait:
            for process in workers:
                process.terminate()
            for process in workers:
                process.join(timeout=2)
