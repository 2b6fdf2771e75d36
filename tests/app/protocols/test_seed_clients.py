"""Clients written for LunaVox, HayaKoe and AngeVoice, the way each server's documentation shows
them, run unchanged against VoxMux and decode the audio they collect."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed

from app.serving.service import SpeechService
from engines.base import Audio, SynthesisRequest
from tests.conftest import Decoded, LiveServer, decode, start_server, test_settings

PIPER_RATE = 22050
KEY = "seed-client-key"
MISSING = "engine; none is installed (use voice=base, or voice=custom with a speaker)"
LUNAVOX_MEM = {"rss_start_bytes", "rss_end_bytes", "rss_peak_bytes", "vram_start_bytes",
               "vram_end_bytes", "vram_peak_bytes", "vram_measured"}


def unique(text: str) -> str:
    """A sentence nobody asked for before, so the audio cache replays nothing."""
    return f"{text} Reference {uuid.uuid4().hex[:6]}."


def ws_url(server: LiveServer, path: str) -> str:
    return server.url.replace("http://", "ws://", 1) + path


def assert_speech(audio: Decoded, text: str) -> None:
    assert len(text) / 25 < audio.duration < len(text) / 6, audio.duration
    assert audio.rms > 0.01


# -- LunaVox: the client loop from its `serve` page -----------------------------------------------


@dataclass
class LunaVoxRun:
    pcm: bytes = b""
    frames: list[bytes] = field(default_factory=list)
    last: dict[str, Any] | None = None
    """The text frame that ended the loop."""
    close_code: int | None = None
    close_reason: str = ""

    def audio(self) -> Decoded:
        assert self.last is not None and "sample_rate" in self.last
        return decode(self.pcm, "pcm", pcm_rate=self.last["sample_rate"])


async def _lunavox(url: str, messages: list[dict[str, Any] | str]) -> LunaVoxRun:
    run = LunaVoxRun()
    try:
        async with websockets.connect(url, proxy=None, open_timeout=30) as ws:
            for message in messages:
                await ws.send(message if isinstance(message, str) else json.dumps(message))
            while True:
                msg = await ws.recv()
                if isinstance(msg, bytes):
                    run.frames.append(msg)
                    run.pcm += msg
                else:
                    run.last = json.loads(msg)
                    break
            await ws.recv()  # the server closes after its one text frame
    except ConnectionClosed as exc:
        run.close_code = exc.rcvd.code if exc.rcvd else None
        run.close_reason = exc.rcvd.reason if exc.rcvd else ""
    return run


def lunavox(server: LiveServer, path: str, *messages: dict[str, Any] | str) -> LunaVoxRun:
    return asyncio.run(_lunavox(ws_url(server, path), list(messages)))


def assert_lunavox_stats(stats: dict[str, Any], pcm: bytes, rate: int) -> None:
    assert stats["t_total_ms"] > 0 and stats["rtf"] > 0
    assert stats["audio_duration_ms"] == pytest.approx(len(pcm) / 2 / rate * 1000, abs=1)
    assert set(stats["mem"]) == LUNAVOX_MEM
    assert stats["mem"]["rss_peak_bytes"] >= stats["mem"]["rss_start_bytes"] > 0
    assert isinstance(stats["mem"]["vram_measured"], bool)


def test_lunavox_stream_base_voice(server: LiveServer) -> None:
    text = unique("Hello from a LunaVox client. It changed nothing at all.")
    run = lunavox(server, "/v1/stream", {"text": text, "voice": "base", "model": "piper"})

    assert run.last is not None and run.last["done"] is True
    assert set(run.last) == {"done", "sample_rate", "stats"}
    assert run.last["sample_rate"] == PIPER_RATE
    assert run.frames and all(len(frame) % 2 == 0 for frame in run.frames)
    assert_speech(run.audio(), text)
    assert_lunavox_stats(run.last["stats"], run.pcm, PIPER_RATE)
    assert run.last["stats"]["ignored"] == []
    assert run.close_code == 1000


def test_lunavox_custom_speaker_names_ignored_sampling_fields(server: LiveServer) -> None:
    text = unique("A custom speaker with sampling fields.")
    run = lunavox(server, "/v1/stream", {
        "text": text, "voice": "custom", "speaker": "en-us+f2", "model": "espeak",
        "temperature": 0.7, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.1, "seed": 7,
        "instruct": "cheerful",
    })
    assert run.last is not None and run.last["done"] is True
    assert run.last["stats"]["ignored"] == [
        "instruct", "temperature", "top_p", "top_k", "repetition_penalty", "seed"]
    assert_speech(run.audio(), text)
    assert run.close_code == 1000


@pytest.mark.parametrize(("request_", "reason"), [
    ({"text": "Clone me.", "voice": "clone", "reference": "me.wav"}, "voice-cloning " + MISSING),
    ({"text": "Design me.", "voice": "design", "instruct": "calm"}, "voice-design " + MISSING),
    ({"text": "Who speaks?", "voice": "custom", "model": "piper"}, "needs 'speaker'"),
    ({"text": "Nobody.", "voice": "custom", "speaker": "nobody", "model": "piper"}, "nobody"),
    ({"text": "Hi.", "model": "no-such-model"}, "no-such-model"),
    ({"text": "Hi.", "model": "piper", "stream": True}, "'stream'"),
    ({"voice": "base", "model": "piper"}, "'input'"),
    ("{not json", "not valid JSON"),
])
def test_lunavox_bad_request_closes_1003_with_a_reason(
    server: LiveServer, request_: dict[str, Any] | str, reason: str
) -> None:
    run = lunavox(server, "/v1/stream", request_)
    assert run.last is None and run.pcm == b""
    assert run.close_code == 1003
    assert reason in run.close_reason


def test_lunavox_failure_after_audio_began_sends_error(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    service: SpeechService = server.app.state.service
    engine = service.registry["espeak"].engine
    real = engine.stream
    calls = 0

    def failing(request: SynthesisRequest) -> Iterator[Audio]:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("injected fault")
        return real(request)

    monkeypatch.setattr(engine, "stream", failing)
    text = unique("The first sentence is spoken in full. The second one fails on purpose. "
                  "The third never comes.")
    run = lunavox(server, "/v1/stream", {"text": text, "model": "espeak"})
    assert run.pcm and decode(run.pcm, "pcm", pcm_rate=22050).rms > 0.01
    assert run.last is not None and "injected fault" in run.last["error"]
    assert run.close_code == 1011


def _fragments(text: str, size: int = 5) -> list[dict[str, Any]]:
    return [{"text": text[i : i + size]} for i in range(0, len(text), size)]


def test_lunavox_text_stream_speaks_every_fragment_in_order(server: LiveServer) -> None:
    tag = uuid.uuid4().hex[:6]
    sentences = [f"Token streams arrive from the model {tag}.", "Each sentence is spoken.",
                 "Then the last words arrive without a stop"]
    text = " ".join(sentences)
    # Every fragment and the end go out before anything is read: reading never waits on audio.
    run = lunavox(server, "/v1/stream/text", {"voice": "base", "model": "piper",
                                              "temperature": 0.7},
                  *_fragments(text), {"end": True})

    assert run.last is not None and run.last["done"] is True
    assert list(run.last) == ["done", "sample_rate", "sentences", "stats"]
    assert run.last["sample_rate"] == PIPER_RATE and run.last["sentences"] == 3
    assert_speech(run.audio(), text)
    assert_lunavox_stats(run.last["stats"], run.pcm, PIPER_RATE)
    assert run.last["stats"]["ignored"] == ["temperature"]
    assert run.close_code == 1000


@pytest.mark.parametrize(("init", "fragment", "reason"), [
    ({"voice": "clone", "model": "piper"}, {"end": True}, "voice-cloning engine"),
    ({"voice": "base", "model": "piper", "text": "Not here."}, {"end": True}, "'text'"),
    ({"voice": "base", "model": "piper"}, "not json", "not valid JSON"),
])
def test_lunavox_text_stream_bad_frames_close_1003(
    server: LiveServer, init: dict[str, Any], fragment: dict[str, Any] | str, reason: str
) -> None:
    run = lunavox(server, "/v1/stream/text", init, fragment)
    assert run.last is None and run.close_code == 1003 and reason in run.close_reason


def test_lunavox_synth_returns_its_stats_shape(server: LiveServer) -> None:
    text = unique("One shot synthesis for LunaVox.")
    with server.client() as http:
        response = http.post("/v1/synth", json={
            "text": text, "voice": "base", "model": "piper", "temperature": 0.7, "top_p": 0.9})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "audio/wav"
    audio = decode(response.content, "wav")
    assert_speech(audio, text)

    luna = json.loads(response.headers["x-lunavox-stats"])
    assert luna["sample_rate"] == PIPER_RATE and luna["mode"] == "base"
    assert luna["n_samples"] == len(audio.samples)
    assert luna["stats"]["ignored"] == ["temperature", "top_p"]
    assert_lunavox_stats(luna["stats"], b"\0\0" * luna["n_samples"], PIPER_RATE)
    assert "t_total_ms" in json.loads(response.headers["x-voxmux-stats"])
    assert "temperature" in response.headers["x-voxmux-warnings"]


def test_lunavox_dashboard_metrics(server: LiveServer) -> None:
    """A LunaVox Grafana dashboard's queries find their series, parsed the way Prometheus does."""
    with server.client() as http:
        done = http.post("/v1/synth", json={"text": unique("Metrics."), "model": "piper"})
        assert done.status_code == 200
        text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("lunavox_pool_size", "lunavox_pool_idle"):
        assert families[name].type == "gauge"
        assert families[name].samples[0].value >= 1  # piper and kokoro are loaded
    requests = families["lunavox_requests"]
    assert requests.type == "counter"
    ok = [s for s in requests.samples if s.name == "lunavox_requests_total"
          and s.labels == {"voice": "en_US-joe-medium", "status": "ok"}]
    assert ok and ok[0].value >= 1
    for name in ("lunavox_request_duration_seconds", "lunavox_rtf"):
        assert families[name].type == "histogram"
        counts = [s for s in families[name].samples if s.name == name + "_count"
                  and s.labels == {"voice": "en_US-joe-medium"}]
        assert counts and counts[0].value >= 1
    assert "voxmux_requests" in families  # beside VoxMux's own, in one registry


@pytest.mark.parametrize(("voice", "mode"), [
    ({"voice": "custom", "speaker": "en_US-joe-medium"}, "custom"),
    ({"voice": "alloy"}, "custom"),
    ({"speaker": "en_US-joe-medium"}, "custom"),
])
def test_lunavox_synth_voice_modes_and_ids(
    server: LiveServer, voice: dict[str, str], mode: str
) -> None:
    with server.client() as http:
        response = http.post("/v1/synth", json={"text": "Modes.", "model": "piper", **voice})
    assert response.status_code == 200, response.text
    assert json.loads(response.headers["x-lunavox-stats"])["mode"] == mode


def test_lunavox_synth_refuses_clone_in_openai_shape(server: LiveServer) -> None:
    with server.client() as http:
        response = http.post("/v1/synth", json={"text": "Hi.", "voice": "clone",
                                                "reference": "ref.wav"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "voice" and "voice-cloning engine" in error["message"]


# -- HayaKoe: curl-style GETs from its FastAPI guide -------------------------------------------


def test_hayakoe_one_shot_wav(server: LiveServer) -> None:
    text = unique("HayaKoe asks for one WAV file.")
    response = httpx.get(server.url + "/api/tts", params={
        "text": text, "speaker_name": "en_US-joe-medium", "model": "piper", "speed": 1.0})
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/wav"
    audio = decode(response.content, "wav")
    assert audio.sample_rate == PIPER_RATE
    assert_speech(audio, text)


@pytest.mark.parametrize("path", ["/api/tts", "/api/tts/stream"])
def test_hayakoe_unknown_speaker_is_400(server: LiveServer, path: str) -> None:
    response = httpx.get(server.url + path, params={
        "text": "Hello.", "speaker_name": "tsukuyomi", "model": "piper"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "voice_not_found" and "tsukuyomi" in error["message"]
    assert response.json()["detail"] == error["message"]  # what HayaKoe's clients read


def test_hayakoe_stream_is_one_continuous_wav(server: LiveServer) -> None:
    text = unique("The stream starts with one header. Then samples follow, segment after "
                  "segment. No second file is glued on. It plays to the end.")
    with httpx.stream("GET", server.url + "/api/tts/stream", params={
            "text": text, "speaker_name": "en_US-joe-medium", "model": "piper"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "audio/wav"
        assert "content-length" not in response.headers
        body = b"".join(response.iter_bytes())
    assert body[:4] == b"RIFF" and body.count(b"RIFF") == 1 and body.count(b"WAVE") == 1
    audio = decode(body, "wav")
    assert audio.sample_rate == PIPER_RATE
    assert audio.duration == pytest.approx((len(body) - 44) / 2 / PIPER_RATE, abs=0.01)
    assert_speech(audio, text)


# -- AngeVoice: its quick checks, and JSON-only WebSocket clients -------------------------------


@pytest.mark.parametrize("field_", ["input", "text"])
def test_angevoice_speech_curl(server: LiveServer, field_: str) -> None:
    text = unique("AngeVoice quick check.")
    response = httpx.post(server.url + "/v1/audio/speech", json={
        "model": "piper", field_: text, "voice": "alloy", "response_format": "wav"}, timeout=60)
    assert response.status_code == 200
    assert_speech(decode(response.content, "wav"), text)


async def _angevoice_json_client(url: str, request: dict[str, Any]) -> tuple[list[str], bytes]:
    kinds: list[str] = []
    audio = b""
    async with websockets.connect(url, proxy=None, open_timeout=30) as ws:
        await ws.send(json.dumps(request))
        async for msg in ws:
            assert isinstance(msg, str), "a JSON-only client cannot take binary frames"
            frame = json.loads(msg)
            kinds.append(frame["type"])
            if frame["type"] == "audio":
                audio += base64.b64decode(frame["audio"])
    return kinds, audio


async def _angevoice_named_client(url: str, request: dict[str, Any]
                                  ) -> tuple[list[dict[str, Any]], bytes]:
    """Reads only AngeVoice's names: `data`, `index`, `segment_index`; `dtype`; the totals."""
    frames: list[dict[str, Any]] = []
    audio = b""
    async with websockets.connect(url, proxy=None, open_timeout=30) as ws:
        await ws.send(json.dumps(request))
        async for msg in ws:
            assert isinstance(msg, str)
            frame = json.loads(msg)
            frames.append(frame)
            if frame["type"] == "audio":
                audio += base64.b64decode(frame["data"])
    return frames, audio


def test_angevoice_field_names(server: LiveServer) -> None:
    text = unique("First sentence of two. And the second one follows it.")
    frames, audio = asyncio.run(_angevoice_named_client(ws_url(server, "/ws/v1/tts"), {
        "model": "piper", "text": text, "voice": "alloy", "binary": False}))
    started, done = frames[0], frames[-1]
    assert started["dtype"] == "int16" and started["recommended_prebuffer_seconds"] > 0
    chunks = [f for f in frames if f["type"] == "audio"]
    assert [f["index"] for f in chunks] == list(range(len(chunks)))
    segments = [f["segment_index"] for f in chunks]
    assert segments == sorted(segments) and segments[0] == 0
    assert max(segments) == done["total_segments"] - 1 >= 1
    assert done["total_audio_chunks"] == len(chunks)
    assert_speech(decode(audio, "pcm", pcm_rate=started["sample_rate"]), text)


def test_angevoice_json_audio_frames(server: LiveServer) -> None:
    text = unique("Audio in JSON frames for an old client.")
    kinds, audio = asyncio.run(_angevoice_json_client(ws_url(server, "/ws/v1/tts"), {
        "model": "piper", "text": text, "voice": "alloy", "binary": False}))
    assert kinds[0] == "started" and kinds[-1] == "done" and "audio" in kinds
    assert_speech(decode(audio, "pcm", pcm_rate=PIPER_RATE), text)


# -- auth on the seed routes, and AngeVoice's model switch -----------------------------------


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp: Path = tmp_path_factory.mktemp("seed-auth")
    # A keepalive far shorter than loading piper: a VoxMux `progress` frame would end a
    # LunaVox client's loop early, so none may reach one.
    live = start_server(test_settings(tmp, api_keys=KEY, auth_scope="all", preload=["espeak"],
                                      ws_keepalive=0.02))
    yield live
    live.stop()


@pytest.mark.parametrize("path", ["/v1/stream", "/v1/stream/text"])
def test_lunavox_routes_need_the_key(guarded: LiveServer, path: str) -> None:
    run = lunavox(guarded, path, {"text": "Hi.", "model": "espeak"})
    assert run.close_code == 1008 and run.pcm == b""


def test_lunavox_stream_with_token_and_no_keepalive_frames(guarded: LiveServer) -> None:
    text = unique("Token in the query string.")
    run = lunavox(guarded, f"/v1/stream?token={KEY}", {"text": text, "model": "piper"})
    assert run.last is not None and run.last["done"] is True
    assert_speech(run.audio(), text)


@pytest.mark.parametrize("path", ["/api/tts/stream", "/api/tts"])
def test_hayakoe_routes_need_the_key(guarded: LiveServer, path: str) -> None:
    params = {"text": unique("Guarded."), "model": "espeak"}
    refused = httpx.get(guarded.url + path, params=params)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert "API key" in refused.json()["detail"]
    allowed = httpx.get(guarded.url + path, params=params,
                        headers={"Authorization": f"Bearer {KEY}"})
    assert allowed.status_code == 200 and decode(allowed.content, "wav").rms > 0.01


def test_angevoice_model_switch_unload_previous(guarded: LiveServer) -> None:
    auth = {"Authorization": f"Bearer {KEY}"}
    with guarded.client(headers=auth) as http:
        def status(model: str) -> str:
            return str(http.get(f"/v1/models/{model}").json()["status"])

        assert http.post("/v1/models/switch", json={"model": "espeak"}).status_code == 200
        kept = http.post("/v1/models/switch", json={"model": "piper", "unload_previous": False})
        assert kept.status_code == 200, kept.text
        assert kept.json()["previous"] == "espeak" and kept.json()["previous_unloaded"] is False
        assert status("piper") == "ready" and status("espeak") == "ready"

        dropped = http.post("/v1/models/switch", json={"model": "espeak"})  # default: unload
        assert dropped.json()["previous"] == "piper" and dropped.json()["previous_unloaded"]
        assert status("espeak") == "ready" and status("piper") == "unloaded"
