"""Traces are off unless asked for, and then cost nothing when off; asked for with the standard
`OTEL_*` variables, a real `voxmux serve` sends its spans over OTLP/HTTP to a receiver in the
test, as it would to a collector."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from opentelemetry import trace

from app.main import create_app
from app.serving import tracing
from app.settings import Settings
from tests.conftest import CACHE_DIR, free_port, test_settings
from tests.otlp import ReceivedSpan, Receiver, receiver

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_") or name == "VOXMUX_OTEL":
            monkeypatch.delenv(name)


@pytest.mark.parametrize(("otel", "environ", "on"), [
    (None, {}, False),
    (None, {"OTEL_SERVICE_NAME": "tts"}, False),
    (None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    (None, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    (None, {"OTEL_TRACES_EXPORTER": "otlp"}, True),
    (None, {"OTEL_TRACES_EXPORTER": "none",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    (None, {"OTEL_SDK_DISABLED": "true",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
    (True, {}, True),
    (False, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
])
def test_the_standard_variables_or_voxmux_otel_turn_traces_on(
        otel: bool | None, environ: dict[str, str], on: bool) -> None:
    assert tracing.wanted(Settings(otel=otel), environ) is on


def exporter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "Otel" in t.name or "Span" in t.name]


def test_off_there_is_no_provider_no_thread_and_no_span(
        tmp_path: Path, no_otel_env: None) -> None:
    app = create_app(test_settings(tmp_path, preload=[]))
    assert tracing.provider() is None
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # none installed
    with TestClient(app) as client:
        response = client.post("/v1/audio/speech", json={
            "model": "espeak", "input": "Nobody traces this.", "response_format": "wav"})
        assert response.status_code == 200
        with tracing.span("anything") as span:
            assert not span.is_recording() and not span.get_span_context().is_valid
        assert tracing.carrier() == {}
    assert exporter_threads() == []


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Receiver]]:
    """`voxmux serve` in a process of its own, exporting to a receiver in this one."""
    with receiver() as received:
        port = free_port()
        environment = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            "VOXMUX_HOST": "127.0.0.1", "VOXMUX_PORT": str(port), "VOXMUX_PRELOAD": "espeak",
            "VOXMUX_MODELS_DIR": str(tmp_path / "models"), "VOXMUX_CACHE_DIR": str(CACHE_DIR),
            "OTEL_EXPORTER_OTLP_ENDPOINT": received.endpoint,
            "OTEL_SERVICE_NAME": "voxmux-under-test",
            "OTEL_BSP_SCHEDULE_DELAY": "200",  # ms: spans leave soon after they end
        }
        process = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], env=environment,
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if httpx.get(url + "/health", timeout=5).json()["status"] in ("ok", "idle"):
                        break
                except httpx.TransportError:
                    pass
                assert process.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.2)
            yield url, received
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_a_real_server_exports_its_spans_over_otlp_http(served: tuple[str, Receiver]) -> None:
    url, received = served
    rid = "otlp-check-0001"
    response = httpx.post(url + "/v1/audio/speech", timeout=60, headers={"X-Request-ID": rid},
                          json={"model": "espeak", "voice": "en-us", "response_format": "mp3",
                                "input": "Spans leave the process. They reach a collector."})
    assert response.status_code == 200 and response.headers["x-request-id"] == rid

    def whole(spans: list[ReceivedSpan]) -> bool:
        roots = [s for s in spans if s.attributes.get("voxmux.request_id") == rid]
        return bool(roots) and any(s.name == "segment" and s.trace_id == roots[0].trace_id
                                   for s in spans)

    spans = received.wait(whole)
    (root,) = [s for s in spans if s.attributes.get("voxmux.request_id") == rid]
    assert root.name == "POST /v1/audio/speech" and root.parent_id == ""
    assert root.resource["service.name"] == "voxmux-under-test"
    assert root.attributes["voxmux.model"] == "espeak"
    assert root.attributes["voxmux.format"] == "mp3"
    assert root.attributes["voxmux.cache_hit"] is False
    assert root.attributes["voxmux.audio_seconds"] > 1
    names = {s.name for s in spans if s.trace_id == root.trace_id}
    assert {"plan", "lane wait", "segment", "encode"} <= names
