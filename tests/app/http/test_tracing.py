"""A traced request as an operator sees it in their tracing backend: one tree per request, a
root span carrying what they filter on, a child for the plan, each lane wait, each engine
segment and each encode, and errors on the spans they happened in. Spans are caught by the
SDK's in-memory exporter; the app runs real engines (eSpeak NG, and the fault-injecting test
engine for an engine that raises)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from app.main import create_app
from app.serving import tracing
from tests.conftest import decode, test_settings
from tests.reliability.faulty import MODEL, Faults, faulty_catalogue, faulty_engines

TEXT = ("The morning train left the station on time. Passengers read their papers in silence. "
        "Outside, the fields were covered in frost.")


@dataclass
class Traced:
    client: TestClient
    exporter: InMemorySpanExporter

    def trace(self, request_id: str, timeout: float = 10) -> tuple[ReadableSpan,
                                                                    list[ReadableSpan]]:
        """The root span of the request with `request_id` and the other spans of its trace,
        once the root has ended (the client can have the body a moment before)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.exporter.get_finished_spans()
            roots = [s for s in spans if s.parent is None
                     and (s.attributes or {}).get("voxmux.request_id") == request_id]
            if roots or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert len(roots) == 1, f"no root span for {request_id}"
        root = roots[0]
        assert root.context is not None
        rest = [s for s in spans if s is not root and s.context is not None
                and s.context.trace_id == root.context.trace_id]
        return root, rest


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use(provider)
    tmp = tmp_path_factory.mktemp("tracing")
    try:
        with faulty_engines(Faults()):
            app = create_app(test_settings(tmp, catalogue=faulty_catalogue(tmp),
                                           preload=["espeak"]))
        with TestClient(app) as client:
            yield Traced(client, exporter)
    finally:
        tracing.use(None)
        provider.shutdown()


def request_id() -> str:
    return f"trace-{uuid.uuid4().hex[:12]}"


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return sorted((s for s in spans if s.name == name), key=lambda s: s.start_time or 0)


def test_a_streamed_request_is_one_tree_with_what_users_filter_on(traced: Traced) -> None:
    text = f"{TEXT} Number {uuid.uuid4().int % 1000}."  # nothing cached
    rid = request_id()
    body = {"model": "espeak", "voice": "en-us", "input": text, "response_format": "flac"}
    response = traced.client.post("/v1/audio/speech", json=body, headers={"X-Request-ID": rid})
    assert response.status_code == 200, response.text
    assert response.headers["x-request-id"] == rid
    audio = decode(response.content, "flac")
    segments = int(response.headers["x-voxmux-segments"])
    assert segments >= 3

    root, spans = traced.trace(rid)
    assert root.name == "POST /v1/audio/speech"
    attributes = dict(root.attributes or {})
    assert attributes["http.route"] == "/v1/audio/speech"
    assert attributes["http.response.status_code"] == 200
    assert attributes["voxmux.model"] == "espeak" and attributes["voxmux.voice"] == "en-us"
    assert attributes["voxmux.format"] == "flac"
    assert attributes["voxmux.characters"] == len(text)
    assert str(attributes["voxmux.client"]).startswith("addr:")
    assert attributes["voxmux.cache_hit"] is False
    assert attributes["voxmux.segments"] == segments
    assert abs(float(attributes["voxmux.audio_seconds"]) - audio.duration) < 0.01  # type: ignore[arg-type]
    assert root.status.status_code is StatusCode.UNSET

    assert root.context is not None
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id
               for s in spans), "every span is a child of the request's root"
    plan, waits, renders = named(spans, "plan"), named(spans, "lane wait"), named(spans, "segment")
    assert len(plan) == 1 and plan[0].attributes == {
        "voxmux.model": "espeak", "voxmux.voice": "en-us", "voxmux.characters": len(text),
        "voxmux.segments": segments, "voxmux.client": attributes["voxmux.client"]}
    assert len(waits) == len(renders) == segments
    assert len(named(spans, "encode")) >= segments  # a chunk per segment, and the end
    assert plan[0].end_time is not None and waits[0].start_time is not None
    assert plan[0].end_time <= waits[0].start_time  # planned before the first engine turn
    for wait, render in zip(waits, renders, strict=True):
        assert wait.end_time is not None and render.start_time is not None
        assert wait.end_time <= render.start_time
        assert (render.attributes or {})["voxmux.model"] == "espeak"
    spoken = sum(float((r.attributes or {})["voxmux.audio_seconds"])  # type: ignore[arg-type]
                 for r in renders)
    assert 0.5 * audio.duration < spoken <= audio.duration + 0.01  # the rest: sentence pauses
    assert sum(int((r.attributes or {})["voxmux.characters"])  # type: ignore[call-overload]
               for r in renders) >= len(text) - 2 * segments  # (spaces between segments)

    again = request_id()
    repeat = traced.client.post("/v1/audio/speech", json=body, headers={"X-Request-ID": again})
    assert repeat.content == response.content
    root, spans = traced.trace(again)
    assert (root.attributes or {})["voxmux.cache_hit"] is True
    assert named(spans, "segment") == [] and named(spans, "lane wait") == []
    assert len(named(spans, "plan")) == 1


def test_an_unknown_voice_fails_the_root_span(traced: Traced) -> None:
    rid = request_id()
    response = traced.client.post("/v1/audio/speech", headers={"X-Request-ID": rid}, json={
        "model": "espeak", "voice": "no-such-voice", "input": "Hello there."})
    assert response.status_code == 400
    root, spans = traced.trace(rid)
    assert root.status.status_code is StatusCode.ERROR
    assert "no-such-voice" in (root.status.description or "")
    assert [e.name for e in root.events] == ["exception"]
    assert (root.attributes or {})["http.response.status_code"] == 400
    (plan,) = named(spans, "plan")
    assert plan.status.status_code is StatusCode.ERROR


def test_an_engine_that_raises_fails_its_segment_and_the_request(traced: Traced) -> None:
    rid = request_id()
    response = traced.client.post("/v1/audio/speech", headers={"X-Request-ID": rid}, json={
        "model": MODEL, "input": f"BOOM goes segment {uuid.uuid4().hex[:6]}."})
    assert response.status_code == 500
    root, spans = traced.trace(rid)
    assert root.status.status_code is StatusCode.ERROR
    assert "exception" in [e.name for e in root.events]
    assert (root.attributes or {})["voxmux.outcome"] == "error"
    (segment,) = named(spans, "segment")
    assert segment.status.status_code is StatusCode.ERROR
    (event,) = segment.events
    assert event.name == "exception"
    assert "injected fault" in str((event.attributes or {})["exception.message"])


def test_a_callers_trace_is_continued(traced: Traced) -> None:
    trace_id, parent_id = uuid.uuid4().hex, uuid.uuid4().hex[:16]
    rid = request_id()
    response = traced.client.post("/v1/audio/speech", json={
        "model": "espeak", "input": "Joined to the caller's trace.", "response_format": "pcm"},
        headers={"X-Request-ID": rid, "traceparent": f"00-{trace_id}-{parent_id}-01"})
    assert response.status_code == 200
    spans = traced.exporter.get_finished_spans()
    deadline = time.monotonic() + 10
    while not (roots := [s for s in spans if (s.attributes or {}).get("voxmux.request_id") == rid]
               ) and time.monotonic() < deadline:
        time.sleep(0.05)
        spans = traced.exporter.get_finished_spans()
    (root,) = roots
    assert root.context is not None and root.parent is not None
    assert f"{root.context.trace_id:032x}" == trace_id
    assert f"{root.parent.span_id:016x}" == parent_id


def test_a_websocket_session_is_traced(traced: Traced) -> None:
    rid = request_id()
    text = f"{TEXT} Session {uuid.uuid4().int % 1000}."
    with traced.client.websocket_connect("/ws/v1/tts", headers={"X-Request-ID": rid}) as ws:
        ws.send_json({"model": "espeak", "voice": "en-us", "input": text})
        while True:
            message = ws.receive()
            if "text" in message and '"done"' in message["text"]:
                break
    root, spans = traced.trace(rid)
    assert root.name == "WS /ws/v1/tts"
    attributes = root.attributes or {}
    assert attributes["voxmux.model"] == "espeak" and attributes["voxmux.characters"] == len(text)
    assert float(attributes["voxmux.audio_seconds"]) > 1  # type: ignore[arg-type]
    assert len(named(spans, "segment")) == attributes["voxmux.segments"] >= 3


def _everything_recorded(spans: list[ReadableSpan]) -> str:
    """Every attribute, event attribute and status description of `spans`, as one text."""
    parts: list[str] = []
    for s in spans:
        parts += [str(v) for v in (s.attributes or {}).values()]
        parts.append(s.status.description or "")
        for event in s.events:
            parts += [str(v) for v in (event.attributes or {}).values()]
    return "\n".join(parts)


def test_a_refused_input_is_not_copied_into_the_trace(traced: Traced) -> None:
    """The input text stays out of the trace, also when the error the client gets quotes it."""
    rid = request_id()
    secret = "ひみつのあいことば"
    response = traced.client.post("/v1/audio/speech", headers={"X-Request-ID": rid}, json={
        "model": "hibari", "input": f"{secret}です。"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_language" and secret[:5] in error["message"]
    root, spans = traced.trace(rid)
    assert root.status.status_code is StatusCode.ERROR
    assert "unsupported_language" in _everything_recorded([root])
    recorded = _everything_recorded([root, *spans])
    assert secret[:5] not in recorded, recorded
