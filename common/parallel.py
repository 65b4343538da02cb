"""Where heavy chunk functions run: inline, or on a pool of local processes.

The roadmap's executor seam: protocol code calls `run_chunks(fn, argument_tuples)`
with top-level functions over raw integers (`common.paillier.*_chunk`) or a narrow,
picklable task object built by a key for that one operation
(`PrivateKey.decrypt_task()`: p and h_p, never the key object, which refuses pickling),
and this module decides where they run. Worker processes are started with `spawn`
(never `fork`: the gRPC server's threads must not be copied, nor the parent's keys);
secrets travel to them only pickled through the pool's in-memory pipes, never through a
file, and the pool drops each task once its chunk is done. Workers never dump core
(`_exit_with_parent`).

`PPRE_WORKERS` sets the pool size (default: the number of CPUs; 1 = inline).
"""
from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Callable, Sequence

from common.errors import InputError

#: the long steps (bootstrap, decryption) are cut into at least this many chunks
CHECKPOINT_CHUNKS = 16

_lock = threading.Lock()
_pool: ProcessPoolExecutor | None = None


def worker_count() -> int:
    value = os.environ.get("PPRE_WORKERS")
    if value:
        if not value.strip().isdigit():
            raise InputError(f"must be a whole number of processes, got '{value}'", parameter="PPRE_WORKERS")
        return max(1, int(value))
    return max(1, os.cpu_count() or 1)


#: how often a worker checks that the service that started it is still alive
PARENT_CHECK_S = 1.0


def _exit_with_parent(parent: int) -> None:
    """Worker initializer: no core dumps (`common.memory.protect_process`: a worker holds
    key material and tables too), and the worker exits as soon as its service is gone. A
    service killed on its own (SIGKILL, the OOM killer) would otherwise leave its workers
    running: they wait on the pool's pipe, whose other end they also hold, so they never
    see it close."""
    from common.memory import protect_process
    protect_process()
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os._exit(1)
    threading.Thread(target=watch, name="ppre-parent-watch", daemon=True).start()


def _get_pool() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ProcessPoolExecutor(max_workers=worker_count(),
                                        mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_exit_with_parent, initargs=(os.getpid(),))
        return _pool


def run_chunks(fn: Callable[..., Any], argument_tuples: Sequence[tuple], *, min_parallel: int = 2,
               checkpoint: Callable[[], None] | None = None) -> list[Any]:
    """[fn(*args) for args in argument_tuples], in order, on the pool when worthwhile.

    `checkpoint()` runs after each chunk; whatever it raises stops the call (chunks not
    yet started are cancelled), which is how a session abandons work nobody awaits.
    """
    if worker_count() <= 1 or len(argument_tuples) < min_parallel:
        results_in_order = (fn(*args) for args in argument_tuples)
    else:
        results_in_order = _get_pool().map(fn, *zip(*argument_tuples))
    results = []
    for result in results_in_order:
        results.append(result)
        if checkpoint is not None:
            checkpoint()
    return results


def chunk_count(minimum: int = 1) -> int:
    """How many chunks to cut a step into: two per worker (load balance), and at least
    `minimum` (`CHECKPOINT_CHUNKS` for the long steps, so checkpoints come every few seconds)."""
    return max(minimum, 2 * worker_count())


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


def shutdown(wait: bool = True) -> None:
    """Stop the pool. `wait=False` (a service shutting down) does not wait for chunks
    still running: their worker processes are terminated, so that the service exits
    within its grace period whatever step it was in."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
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
