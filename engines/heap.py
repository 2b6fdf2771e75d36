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
from collections.abc import Callable

log = logging.getLogger(__name__)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError):
        return None
    return trim


def release() -> None:
    """Return the free heap pages to the operating system; call after dropping a model."""
    trim = _malloc_trim()
    if trim is not None:
        try:
            trim(0)
        except Exception as exc:  # never let memory housekeeping fail an unload
            log.debug("malloc_trim failed: %s", exc)
