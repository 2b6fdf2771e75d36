"""Shared fixtures: a real uvicorn server on a free port, real engines, real clients."""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI

from app.http.connections import server_config
from app.main import create_app
from app.settings import Settings

CACHE_DIR = Path(__file__).resolve().parent.parent / "var" / "test-cache"
WRITABLE = ("VOXMUX_DATA_DIR", "VOXMUX_LEXICONS_DIR", "VOXMUX_CREDENTIALS_DIR")
"""Settings whose default is a folder of the working tree's var/ that a server writes to."""
_SCRATCH = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Whatever a test starts without naming these folders (a `voxmux serve` process, an app on
    default settings) writes into a folder of the run's own, never into the working tree's
    var/ that `make serve` reads (a fuzzed lexicon there was applied to its requests)."""
    import os
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="voxmux-tests-"))
    config.stash[_SCRATCH] = root
    for name in WRITABLE:
        os.environ[name] = str(root / name.removeprefix("VOXMUX_").lower())  # a shell's too


def pytest_unconfigure(config: pytest.Config) -> None:
    import shutil

    if (root := config.stash.get(_SCRATCH, None)) is not None:
        shutil.rmtree(root, ignore_errors=True)


ENGINE_SIGNS = ("LiveServer", "start_server", "start_with_faulty", "subprocess", "hear(",
                "engines.kokoro", "engines.piper", "engines.hibari", "engines.espeak",
                "build_engine", "build_registry", "create_app", "import ray", "from ray",
                "redis_server", "playwright", "from bench")
"""What in a test module's source means it runs engines (or a server, a browser, a cluster,
a process): `make check` (`--no-engines`) leaves such a module out."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--no-engines", action="store_true",
                     help="only the tests that run no engine, server or process (make check)")


CLUSTER = "tests/cluster/"
"""Node ids of the tests that start Ray clusters."""


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (`make test TEST_WORKERS=2`), a module's tests stay on one worker,
    so its module fixtures (a server, a model) start once, and every Ray test shares one
    worker, so two local clusters never start at once on a small machine."""
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return CLUSTER if nodeid.startswith(CLUSTER) else nodeid.split("::", 1)[0]

    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the scheduler takes this order
        # The Ray group first: it is the longest, so it must not be the last to start.
        items.sort(key=lambda item: not item.nodeid.startswith(CLUSTER))
    if not config.getoption("--no-engines"):
        return
    heavy: dict[Path, bool] = {}

    def runs_engines(item: pytest.Item) -> bool:
        path = Path(str(item.path))
        if path not in heavy:
            text = path.read_text()
            heavy[path] = any(sign in text for sign in ENGINE_SIGNS)
        return heavy[path] or "server" in getattr(item, "fixturenames", ())

    kept = [item for item in items if not runs_engines(item)]
    config.hook.pytest_deselected(items=[item for item in items if runs_engines(item)])
    items[:] = kept



def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class LiveServer:
    app: FastAPI
    url: str
    server: uvicorn.Server
    thread: threading.Thread

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=120, **kwargs)

    def segments(self, model: str, text: str) -> list[str]:
        """How this server cuts `text` for `model` (its planner, its settings)."""
        # In a thread of its own: the caller may run an event loop already (Playwright's).
        with ThreadPoolExecutor(1) as thread:
            plan = thread.submit(asyncio.run, self.app.state.service.plan(
                model=model, text=text)).result()
        segments: list[str] = plan.segments
        return segments

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_server(settings: Settings) -> LiveServer:
    port = free_port()
    app = create_app(settings)
    config = server_config(app, settings, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=5).json()["status"] != "loading":
                return LiveServer(app, url, server, thread)
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.should_exit = True
    raise RuntimeError("server did not become ready")


def test_settings(tmp: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "models_dir": tmp / "models",
        "cache_dir": CACHE_DIR,
        "credentials_dir": tmp / "credentials",
        "data_dir": tmp / "data",
        "lexicons_dir": tmp / "lexicons",  # never the working tree's var/
        "preload": ["kokoro"],
        "queue_size": 64,
        "gc_freeze": False,  # many apps in one process: none freezes the others' objects
    }
    values.update(overrides)
    return Settings(**values)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # Never idle out: the suite runs longer than the default TTL, and its tests expect the
    # preloaded model to stay loaded.
    live = start_server(test_settings(tmp_path_factory.mktemp("server"), idle_ttl=-1))
    yield live
    live.stop()


@dataclass
class Decoded:
    samples: np.ndarray
    sample_rate: int

    @property
    def duration(self) -> float:
        return len(self.samples) / self.sample_rate

    @property
    def rms(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.samples)))) if len(self.samples) else 0.0


def decode(data: bytes, fmt: str, pcm_rate: int | None = None) -> Decoded:
    """Decode with FFmpeg through PyAV (an independent decoder); `pcm` is raw s16le."""
    if fmt == "pcm":
        assert pcm_rate, "pcm needs its rate from X-Sample-Rate"
        samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768
        return Decoded(samples, pcm_rate)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        rate = stream.codec_context.sample_rate
        frames = [f.to_ndarray().astype(np.float32).reshape(f.layout.nb_channels, -1)[0]
                  for f in container.decode(stream)]
    samples = np.concatenate(frames) if frames else np.zeros(0, np.float32)
    if np.abs(samples).max(initial=0) > 2:  # integer sample formats
        samples = samples / 32768
    return Decoded(samples, rate)


test_settings.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test
