"""The longest input finishes on every model and every route, and `request_timeout` bounds one
segment's wait and synthesis, never a long text that keeps speaking.

Every route reads the same `SpeechJob`, whose per-segment timeout is the only one on the way
(streamed HTTP and SSE through `JobResponse`, whole clips through `whole_clip`, both WebSocket
framings through one session loop). So the cheap engine, eSpeak NG, runs the 4,096-character
text on every route; Piper runs seven sentences, one segment each (`segment_growth` 1: what the
timeout bounds is one segment, however the text is packed), once per kind of consumer (streamed
HTTP, whole clip on LunaVox's `/v1/synth`, the case that used to answer 504, and WebSocket),
under a timeout of a few times what its longest segment takes this machine now, below the whole
request's length, so the test means the same on a fast, a slow or a busy CPU."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from app.main import create_app
from app.settings import Settings
from engines.base import SynthesisRequest
from tests.conftest import Decoded, LiveServer, decode, start_server, test_settings

SENTENCE = "Sentence {n} of this long text is spoken in full, and none of it may be cut. "


def long_text(limit: int = 4096) -> str:
    text, n = "", 1
    while len(text) < limit:
        text += SENTENCE.format(n=n)
        n += 1
    return text[:limit].rsplit(" ", 1)[0] + "."


TEXT = long_text()
PIPER_SENTENCE = ("Sentence {n} of the text Piper reads is spoken in full, and none of it may be "
                  "cut, however long the request lasts. ")
PIPER_TEXT = "".join(PIPER_SENTENCE.format(n=n) for n in range(1, 8)).strip()


def assert_whole(audio: Decoded, text: str = TEXT) -> None:
    """All of it spoken: 12 to 22 characters a second (4,096 characters: about 4 minutes)."""
    assert len(text) / 22 < audio.duration < len(text) / 12, audio.duration
    assert audio.rms > 0.01


def ws_url(server: LiveServer, path: str) -> str:
    return server.url.replace("http://", "ws://", 1) + path


def openai_route(server: LiveServer, model: str, text: str = TEXT) -> Decoded:
    with server.client() as http:
        response = http.post("/v1/audio/speech", json={
            "model": model, "input": text, "voice": "alloy", "response_format": "pcm"})
    assert response.status_code == 200, response.text
    return decode(response.content, "pcm", pcm_rate=int(response.headers["x-sample-rate"]))


def sse_route(server: LiveServer, model: str) -> Decoded:
    with server.client() as http:
        response = http.post("/v1/audio/speech", json={
            "model": model, "input": TEXT, "voice": "alloy", "response_format": "pcm",
            "stream_format": "sse"})
    events = [json.loads(line[6:]) for line in response.text.splitlines()
              if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done", events[-1]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events
                   if e["type"] == "speech.audio.delta")
    return decode(pcm, "pcm", pcm_rate=int(response.headers["x-sample-rate"]))


def synth_route(server: LiveServer, model: str, text: str = TEXT) -> Decoded:
    response = httpx.post(server.url + "/v1/synth", json={"text": text, "model": model},
                          timeout=600)
    assert response.status_code == 200, response.text
    return decode(response.content, "wav")


def legacy_route(server: LiveServer, model: str) -> Decoded:
    response = httpx.get(server.url + "/api/tts", params={"text": TEXT, "model": model},
                         timeout=600)
    assert response.status_code == 200, response.text
    return decode(response.content, "wav")


def legacy_stream_route(server: LiveServer, model: str) -> Decoded:
    response = httpx.get(server.url + "/api/tts/stream", params={"text": TEXT, "model": model},
                         timeout=600)
    assert response.status_code == 200, response.text
    return decode(response.content, "wav")


def voxmux_ws_route(server: LiveServer, model: str, text: str = TEXT) -> Decoded:
    pcm, rate = b"", 0
    with connect(ws_url(server, "/ws/v1/tts"), max_size=None, open_timeout=30) as ws:
        ws.send(json.dumps({"model": model, "input": text, "voice": "alloy"}))
        while True:
            frame = ws.recv(timeout=600)
            if isinstance(frame, bytes):
                pcm += frame
                continue
            message = json.loads(frame)
            if message["type"] == "started":
                rate = message["sample_rate"]
            elif message["type"] != "progress" and message["type"] != "segment":
                assert message["type"] == "done", message
                break
    return decode(pcm, "pcm", pcm_rate=rate)


def lunavox_ws_route(server: LiveServer, model: str) -> Decoded:
    pcm = b""
    with connect(ws_url(server, "/v1/stream"), max_size=None, open_timeout=30) as ws:
        ws.send(json.dumps({"text": TEXT, "model": model}))
        while isinstance(frame := ws.recv(timeout=600), bytes):
            pcm += frame
    done = json.loads(frame)
    assert done["done"] is True, done
    return decode(pcm, "pcm", pcm_rate=done["sample_rate"])


Route = Callable[..., Decoded]
"""(server, model) or (server, model, text): speaks `text` (default `TEXT`) and decodes it."""
ROUTES: dict[str, Route] = {
    "openai": openai_route, "sse": sse_route, "synth": synth_route, "legacy": legacy_route,
    "legacy-stream": legacy_stream_route, "voxmux-ws": voxmux_ws_route,
    "lunavox-ws": lunavox_ws_route,
}

SHORT_TIMEOUT = 8.0
"""eSpeak NG's per-segment timeout on every route: far above one of its segments."""

SEGMENT_MARGIN = 2.5
"""The timeout over one segment's time measured just before: room for the machine to slow down
2.5x meanwhile; the whole text (seven sentences: seven times the longest) outlasts it unless the
machine speeds up 2.8x or more."""


def segment_seconds(settings: Settings, model: str, text: str) -> float:
    """What the model's longest segment of `text`, cut as the whole-file route cuts it, takes on
    this machine now, in-process (its engine warmed up on a short sentence first)."""
    service = create_app(settings).state.service
    try:
        plan = asyncio.run(service.plan(model=model, text=text, whole=True))
        longest = max(plan.segments, key=len)
        handle = service.registry[model]
        voice = handle.entry.default_voice
        handle.engine.load()
        try:
            handle.engine.synthesize(SynthesisRequest(text="Warm up.", voice=voice))
            started = time.monotonic()
            handle.engine.synthesize(SynthesisRequest(text=longest, voice=voice))
            return time.monotonic() - started
        finally:
            handle.engine.unload()
    finally:
        service.close()


@pytest.fixture(scope="module")
def short_timeout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp: Path = tmp_path_factory.mktemp("long-text")
    live = start_server(test_settings(tmp, preload=["espeak"], cache_max_items=0,
                                      request_timeout=SHORT_TIMEOUT))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def piper_timeout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, float]]:
    settings = test_settings(tmp_path_factory.mktemp("long-piper"), preload=["piper"],
                             cache_max_items=0, segment_growth=1.0)
    timeout = SEGMENT_MARGIN * segment_seconds(settings, "piper", PIPER_TEXT)
    live = start_server(settings.model_copy(update={"request_timeout": timeout}))
    yield live, timeout
    live.stop()


@pytest.mark.parametrize("route", list(ROUTES))
def test_longest_input_finishes_on_every_route(short_timeout: LiveServer, route: str) -> None:
    assert_whole(ROUTES[route](short_timeout, "espeak"))


@pytest.mark.parametrize("route", ["openai", "synth", "voxmux-ws"])
def test_a_long_text_outlives_the_timeout(piper_timeout: tuple[LiveServer, float],
                                          route: str) -> None:
    server, timeout = piper_timeout
    started = time.monotonic()
    audio = ROUTES[route](server, "piper", PIPER_TEXT)
    elapsed = time.monotonic() - started
    assert_whole(audio, PIPER_TEXT)
    assert elapsed > timeout, (elapsed, timeout)  # the request itself lasted longer
