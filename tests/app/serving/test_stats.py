"""`/stats`, `/requests` and `/metrics` move as requests run; memory figures are real."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.main import create_app
from app.serving import memory
from tests.conftest import CACHE_DIR, LiveServer, decode, free_port, test_settings


def metrics(server: LiveServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with server.client() as http:
        response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def speak(server: LiveServer, text: str, model: str = "espeak") -> None:
    with server.client() as http:
        response = http.post("/v1/audio/speech", json={
            "model": model, "input": text, "response_format": "pcm"})
    assert response.status_code == 200


def fresh() -> str:
    return f"Statistics sentence {random.randrange(10**6)} is counted."


def test_metrics_parse_and_counters_move(server: LiveServer) -> None:
    text = fresh()
    before = metrics(server)
    speak(server, text)
    speak(server, text)
    after = metrics(server)

    def moved(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert moved("voxmux_requests_total", model="espeak", status="done") == 2
    assert moved("voxmux_request_duration_seconds_count", model="espeak") == 2
    assert moved("voxmux_ttfb_seconds_count", model="espeak") == 2
    assert moved("voxmux_rtf_count", model="espeak") == 2
    assert moved("voxmux_cache_misses_total") == 1 and moved("voxmux_cache_hits_total") == 1
    assert moved("voxmux_cache_items") == 1
    assert after[("voxmux_queue_depth", (("model", "espeak"),))] == 0
    assert after[("voxmux_active", (("model", "espeak"),))] == 0
    assert after[("voxmux_models_loaded", ())] >= 2  # kokoro preloaded, espeak just now
    assert after[("voxmux_model_loaded", (("model", "espeak"),))] == 1
    assert after[("voxmux_engine_load_seconds_count", (("model", "kokoro"),))] >= 1


def test_stats_move_as_requests_run(server: LiveServer) -> None:
    with server.client() as http:
        before = http.get("/stats").json()
        text = fresh()
        speak(server, text)
        speak(server, text)
        with http.stream("POST", "/v1/audio/speech", json={
                "model": "espeak", "input": " ".join([fresh()] * 40),
                "response_format": "pcm"}) as response:
            next(response.iter_bytes())
        after = http.get("/stats").json()
    assert after["requests"]["total"] - before["requests"]["total"] == 3
    assert after["requests"]["ok"] - before["requests"]["ok"] >= 2
    assert after["cache"]["hits"] - before["cache"]["hits"] == 1
    assert after["cache"]["misses"] - before["cache"]["misses"] == 2
    assert after["cache"]["bytes"] > before["cache"]["bytes"]
    assert after["uptime_s"] >= before["uptime_s"]
    for window in ("latency_ms", "ttfb_ms"):
        p = after[window]
        assert 0 < p["p50"] <= p["p95"] <= p["p99"]
    assert after["rtf"]["mean"] > 0
    assert after["models"]["espeak"]["status"] == "ready"
    assert after["memory"]["rss"] > 10 << 20
    assert after["memory"]["vram_measured"] in (True, False)


def test_requests_are_listed_newest_first(server: LiveServer) -> None:
    texts = [fresh(), fresh()]
    for text in texts:
        speak(server, text)
    with server.client() as http:
        rows = http.get("/requests").json()["data"]
    assert len(rows) <= 100
    newest, previous = rows[0], rows[1]
    assert newest["created"] >= previous["created"]
    assert newest["chars"] == len(texts[1]) and previous["chars"] == len(texts[0])
    assert newest["status"] == "done" and newest["cache"] == "miss"
    assert newest["model"] == "espeak" and newest["segments_done"] == newest["segments"]
    assert newest["t_total_ms"] >= newest["ttfb_ms"] > 0 and newest["queue_position"] is None
    assert "text" not in newest and "input" not in newest  # the log keeps no user text


def test_two_apps_in_one_process_keep_separate_metrics(tmp_path: Path) -> None:
    one = create_app(test_settings(tmp_path, preload=[]))
    two = create_app(test_settings(tmp_path, preload=[]))
    one.state.service.metrics.requests.labels("espeak", "done").inc()
    first = one.state.service.metrics.render({}).decode()
    second = two.state.service.metrics.render({}).decode()
    assert 'voxmux_requests_total{model="espeak",status="done"} 1.0' in first
    assert "voxmux_requests_total{" not in second


def test_rss_is_the_kernels_vmrss() -> None:
    status = Path("/proc/self/status").read_text()
    vmrss = next(int(line.split()[1]) * 1024 for line in status.splitlines()
                 if line.startswith("VmRSS:"))
    assert memory.rss_bytes() == pytest.approx(vmrss, abs=1 << 20)
    assert memory.rss_bytes(os.getpid()) == pytest.approx(vmrss, abs=1 << 20)
    assert memory.rss_bytes(2**22 + 1) is None  # above any pid the kernel hands out


TRACKED = """
import json
from dataclasses import asdict
from app.serving import memory
tracker = memory.MemoryTracker()
ballast = bytearray(64 << 20)
ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page so it is resident
tracker.update()
del ballast
print(json.dumps(asdict(tracker.finish())))
"""


def test_memory_tracker_reports_rss_and_honest_vram() -> None:
    """In a process of its own: in the suite's, other threads (its live servers) free memory
    while the ballast is held, and the peak came out 50 MiB over the start once in CI."""
    rss = memory.rss_bytes()
    assert rss is not None and rss > 10 << 20
    run = subprocess.run([sys.executable, "-c", TRACKED], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[3])
    mem = json.loads(run.stdout)
    assert isinstance(mem["rss_peak"], int) and isinstance(mem["rss_start"], int)
    assert mem["rss_peak"] >= mem["rss_start"] + (60 << 20)
    assert set(mem) == {"rss_start", "rss_end", "rss_peak", "vram_start", "vram_end",
                        "vram_peak", "vram_measured"}
    if mem["vram_measured"]:
        assert isinstance(mem["vram_peak"], int)
    else:
        assert mem["vram_start"] is mem["vram_end"] is mem["vram_peak"] is None
    json.dumps(mem)


def test_vram_is_this_pids_usage_over_every_device() -> None:
    """No GPU here: NVML's answers are stubbed to check the per-PID arithmetic."""
    pid = 4242

    class Proc:
        def __init__(self, pid: int, used: int | None) -> None:
            self.pid, self.usedGpuMemory = pid, used

    class StubNvml:
        def __init__(self) -> None:
            self.compute = {"gpu0": [Proc(pid, 300), Proc(7, 999)], "gpu1": [Proc(pid, 200)]}

        def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Proc]:
            return self.compute[handle]

        def nvmlDeviceGetGraphicsRunningProcesses(self, handle: str) -> list[Proc]:
            return [Proc(pid, 300)] if handle == "gpu0" else []  # the same context, listed twice

    stub = StubNvml()
    nvml = memory.Nvml()
    nvml._module, nvml._handles = stub, ["gpu0", "gpu1"]
    assert nvml.available and nvml.used_by(pid) == 500 and nvml.used_by(99) == 0
    stub.compute["gpu1"] = [Proc(pid, None)]  # NVML_VALUE_NOT_AVAILABLE
    assert nvml.used_by(pid) is None


def test_the_japanese_readers_memory_leaves_with_the_last_engine_reading_japanese(
        tmp_path: Path) -> None:
    """In a server process of its own (the test process shares one reader among its servers):
    /stats shows the reader's memory while Kokoro is loaded and none once it is unloaded."""
    port = free_port()
    env = {**os.environ, "VOXMUX_HOST": "127.0.0.1", "VOXMUX_PORT": str(port),
           "VOXMUX_PRELOAD": "kokoro", "VOXMUX_IDLE_TTL": "-1", "VOXMUX_LOG_LEVEL": "warning",
           "VOXMUX_MODELS_DIR": str(tmp_path / "models"), "VOXMUX_CACHE_DIR": str(CACHE_DIR),
           "VOXMUX_CREDENTIALS_DIR": str(tmp_path / "credentials")}
    process = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], env=env,
                               cwd=Path(__file__).resolve().parents[3])
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if http.get("/health").json()["status"] == "ok":
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.2)
            assert http.get("/stats").json()["memory"]["helpers_rss"] > 30 << 20
            http.post("/v1/models/kokoro/unload").raise_for_status()
            assert http.get("/stats").json()["memory"]["helpers_rss"] == 0
            reply = http.post("/v1/audio/speech", json={
                "model": "kokoro", "input": "今日は良い天気です。", "response_format": "wav"})
            reply.raise_for_status()
            audio = decode(reply.content, "wav")
            assert audio.sample_rate == 24000 and audio.duration > 0.8 and audio.rms > 0.01
            assert http.get("/stats").json()["memory"]["helpers_rss"] > 30 << 20
    finally:
        process.terminate()
        process.wait(timeout=30)
