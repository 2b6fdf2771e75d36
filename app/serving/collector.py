"""Short pauses of Python's cyclic garbage collector.

A full collection walks every container object the process tracks: about 320,000 once the
engines are loaded (their front ends' tables, onnxruntime's and numpy's bindings, the app), which
holds the GIL for 90-120 ms, and with it every thread, the event loop included. Work that
allocates a lot (a lexicon compiled, a book planned, a large JSON body) sets one off now and
then, so every client saw a 100 ms stall at times (bench/results/loop_lag.md). What is loaded at
start lives as long as the process: `settle()` moves it out of the collector's sight
(`gc.freeze()`), so a full collection walks only what came after it. Models are freed by their
reference counts (tests/engines/test_memory_release.py), so freezing one that is unloaded later
leaves nothing behind.
"""

from __future__ import annotations

import gc


def settle(*, collect: bool = False) -> None:
    """Freeze what is alive now; `collect` first (a full collection: at start only, before the
    server takes requests)."""
    if collect:
        gc.collect()
    gc.freeze()
