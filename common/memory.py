"""Giving a finished session's memory back to the operating system.

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
from functools import lru_cache


@lru_cache(maxsize=1)
def _malloc_trim():
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None


def release_freed_memory() -> None:
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
