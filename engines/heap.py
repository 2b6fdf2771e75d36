"""Hand memory freed by an unloaded model back to the operating system.

glibc keeps freed memory in its heaps for reuse, and onnxruntime frees a session's weights and
buffers in many pieces spread over the loading and inference threads' arenas, so without a trim
the RSS of a process stays where it was with the model loaded. `malloc_trim(0)` returns the free
pages of every arena (about a millisecond; it runs in the unloading worker thread, without the
GIL). On a C library without it (musl, macOS) `release` does nothing. No `gc.collect()` here: a
session is freed by its reference count, and a full collection of a big heap holds the GIL for
a third of a second, long enough to stall every stream of the event loop.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _libc(name: str) -> Callable[..., int] | None:
    """A C library function by name; None where this C library lacks it (musl, macOS)."""
    try:
        function: Callable[..., int] = getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        return None
    return function


M_ARENA_MAX = -8
"""`mallopt` parameter number of glibc's arena cap (malloc.h)."""

SERVER_ARENAS = 2
"""glibc otherwise gives each thread that meets contention its own arena, up to 8 per core. Each
keeps pieces of what it once held, so the engine, loader and encoder threads of a server left
20-60 MB behind after every model had unloaded, changing from run to run. With two arenas it is
32-38 MB over four runs (bench/), at no measured cost in throughput: the engines' tensors come
from onnxruntime's own arena, not from malloc on every call."""


def limit_arenas(count: int = SERVER_ARENAS) -> bool:
    """Cap glibc's malloc arenas; call before the server starts its threads. Does nothing (False)
    where the C library has no `mallopt` or the operator set `MALLOC_ARENA_MAX` themselves."""
    mallopt = _libc("mallopt")
    if "MALLOC_ARENA_MAX" in os.environ or mallopt is None:
        return False
    return bool(mallopt(M_ARENA_MAX, count))


def release() -> None:
    """Return the free heap pages to the operating system; call after dropping a model."""
    trim = _libc("malloc_trim")
    if trim is not None:
        try:
            trim(0)
        except Exception as exc:  # never let memory housekeeping fail an unload
            log.debug("malloc_trim failed: %s", exc)
