"""A service process's memory: no core dumps, and a finished session's memory given back.

`protect_process()` (design §7: keys and member-level data never at rest) turns
core dumps off for the service and each of its worker processes — the core-size limit
to 0, and the process marked non-dumpable (Linux `prctl(PR_SET_DUMPABLE, 0)`, which also
keeps other processes of the same user from attaching to it or reading its memory) —
so a crash never writes a process's keys and tables to disk.

A session holds tables of up to gigabytes (a million rows of points, sealed vectors and
ciphertexts); once it ends, Python frees them but glibc keeps most of the pages in its
heap, so a long-running service would sit at the peak of its largest audit and its
resident memory would drift with each audit's allocation pattern. After a session ends,
each service collects cycles (a failed session's traceback can hold its tables) and
asks glibc to return free heap pages (`malloc_trim`); elsewhere the second step is
skipped.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import resource
import sys
from functools import lru_cache

#: prctl option (linux/prctl.h)
PR_SET_DUMPABLE = 4


@lru_cache(maxsize=1)
def _libc():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None


def protect_process() -> None:
    """No core dump of this process, ever (module docstring); idempotent."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    libc = _libc()
    if sys.platform.startswith("linux") and libc is not None and hasattr(libc, "prctl"):
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _malloc_trim():
    libc = _libc()
    return getattr(libc, "malloc_trim", None) if libc is not None else None


def release_freed_memory() -> None:
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
