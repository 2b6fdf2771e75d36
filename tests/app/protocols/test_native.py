"""`POST /v1/synth` (WAV + stats header) and the legacy `GET /api/tts` one-shot route."""

from __future__ import annotations

import json
import random
import threading

import pytest

from app.audio.encoders import encode_whole
from tests.conftest import LiveServer, decode

TEXT = "Native synthesis returns one whole file. Its statistics ride in a header."


def unique(text: str = TEXT) -> str:
    return f"{text} Take {random.randrange(10**6)}."


def test_synth_returns_wav_with_stats(server: LiveServer) -> None:
    text = unique()
    with server.client() as http:
        response = http.post("/v1/synth", json={"model": "piper", "input": text,
                                                "voice": "alloy"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/wav"
    assert int(response.headers["content-length"]) == len(response.content)
    audio = decode(response.content, "wav")
    assert audio.sample_rate == 22050 == int(response.headers["x-sample-rate"])
    assert len(text) / 25 < audio.duration < len(text) / 6 and audio.rms > 0.01
    stats = json.loads(response.headers["x-voxmux-stats"])
    assert stats["cache"] == "miss" == response.headers["x-voxmux-cache"]
    assert stats["segments"] == int(response.headers["x-voxmux-segments"]) == 1  # one file: packed
    assert 0 < stats["ttfb_ms"] <= stats["t_total_ms"]
    assert abs(stats["audio_duration_ms"] / 1000 - audio.duration) < 0.01
    assert stats["rtf"] == pytest.approx(stats["t_total_ms"] / stats["audio_duration_ms"],
                                         rel=0.01)
    mem = stats["mem"]
    assert mem["rss_start"] > 10 << 20 and mem["rss_peak"] >= mem["rss_end"] > 0
    if not mem["vram_measured"]:
        assert mem["vram_start"] is mem["vram_end"] is mem["vram_peak"] is None


def test_synth_uses_the_default_model_and_takes_text_as_alias(server: LiveServer) -> None:
    with server.client() as http:
        response = http.post("/v1/synth", json={"text": unique("Hi.")})
    default = server.app.state.settings.default_model
    assert response.status_code == 200
    assert response.headers["x-voxmux-model"] == server.app.state.service.registry.resolve(
        default).id


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"model": "nope", "input": "Hi there."}, 404, "model"),
    ({"model": "tts-1", "input": "Hi.", "response_format": "mp3"}, 400, "response_format"),
    ({"model": "tts-1", "input": "Hi.", "stream_format": "sse"}, 400, "stream_format"),
    ({"model": "tts-1", "input": "!!!"}, 400, "input"),
    ({"model": "tts-1", "input": "Hi.", "speed": 9}, 400, "speed"),
    ({"model": "tts-1", "input": "Hi.", "voice": "nobody"}, 400, "voice"),
])
def test_synth_errors_are_openai_shaped(server: LiveServer, body: dict[str, object],
                                        status: int, param: str) -> None:
    with server.client() as http:
        response = http.post("/v1/synth", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["message"] and error["type"]


def test_legacy_route_defaults_to_wav_for_audio_tags(server: LiveServer) -> None:
    text = unique("The legacy route answers plain query strings.")
    with server.client() as http:
        response = http.get("/api/tts", params={"text": text, "model": "espeak"})
    assert response.status_code == 200
    assert response.headers["content-type"] == "audio/wav"
    assert int(response.headers["content-length"]) == len(response.content)
    audio = decode(response.content, "wav")
    assert audio.sample_rate == 22050 and audio.rms > 0.01
    assert len(text) / 25 < audio.duration < len(text) / 6


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "pcm"])
def test_legacy_route_formats_voice_and_speed(server: LiveServer, fmt: str) -> None:
    text = unique("Speed and voice come from the query string too.")
    with server.client() as http:
        normal = http.get("/api/tts", params={"text": text, "model": "piper", "voice": "alloy",
                                              "format": fmt})
        fast = http.get("/api/tts", params={"text": text, "model": "piper", "voice": "alloy",
                                            "format": fmt, "speed": 2})
    assert normal.status_code == fast.status_code == 200
    rate = int(normal.headers["x-sample-rate"])
    assert rate == (48000 if fmt == "opus" else 22050)
    slow_audio = decode(normal.content, fmt, pcm_rate=rate)
    fast_audio = decode(fast.content, fmt, pcm_rate=rate)
    assert slow_audio.sample_rate == rate and slow_audio.rms > 0.01
    assert fast_audio.duration < slow_audio.duration * 0.7


@pytest.mark.parametrize(("params", "param"), [
    ({"text": "Hi.", "format": "ogg"}, "format"),
    ({"text": "Hi.", "speed": "fast"}, "speed"),
    ({"model": "tts-1"}, "text"),
])
def test_legacy_route_rejects_bad_queries(server: LiveServer, params: dict[str, str],
                                          param: str) -> None:
    with server.client() as http:
        response = http.get("/api/tts", params=params)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == param


def test_one_shot_encoding_runs_off_the_event_loop(
        server: LiveServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole clip's mp3 encoding must not stall the streams the event loop is serving."""
    from app.protocols import native

    threads: list[int] = []

    def recording(*args: object) -> bytes:
        threads.append(threading.get_ident())
        return encode_whole(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(native, "encode_whole", recording)
    with server.client() as http:
        reply = http.get("/api/tts", params={"text": unique(), "model": "espeak",
                                             "format": "mp3"})
    assert reply.status_code == 200 and decode(reply.content, "mp3").duration > 0.5
    assert threads and server.thread.ident not in threads
