"""`POST /v1/audio/speech` through the `openai` SDK against a live server with real engines."""

from __future__ import annotations

import openai
import pytest

from app.protocols.openai import WARNINGS_HEADER_CHARS, warnings_header
from tests.conftest import LiveServer, decode

TEXT = "The quick brown fox jumps over the lazy dog. It was a sunny day in the park."
RATES = {"tts-1": 24000, "piper": 22050, "kokoro": 24000, "espeak": 22050}
"""`tts-1` is hibari (README: the measured choice); the others by their own ids."""
FORMATS = ["mp3", "opus", "aac", "flac", "wav", "pcm"]


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def plausible_seconds(text: str) -> tuple[float, float]:
    """Spoken English runs between about 6 and 25 characters a second."""
    return len(text) / 25, len(text) / 6


@pytest.mark.parametrize("model", list(RATES))
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_decodes_to_speech(server: LiveServer, model: str, fmt: str) -> None:
    response = sdk(server).audio.speech.with_raw_response.create(
        model=model, voice="alloy", input=TEXT, response_format=fmt  # type: ignore[arg-type]
    )
    body = response.content
    assert response.headers["x-request-id"]
    rate = int(response.headers["x-sample-rate"])
    audio = decode(body, fmt, pcm_rate=rate)
    expected_rate = {"opus": 48000, "pcm": 24000}.get(fmt, RATES[model])
    assert audio.sample_rate == expected_rate == rate
    low, high = plausible_seconds(TEXT)
    assert low < audio.duration < high, audio.duration
    assert audio.rms > 0.01


def test_speed_changes_duration_on_every_model(server: LiveServer) -> None:
    client = sdk(server)
    for model in RATES:
        durations = {}
        for speed in (0.25, 1.0, 4.0):
            body = client.audio.speech.create(
                model=model, voice="alloy", input=TEXT, response_format="wav", speed=speed
            ).read()
            durations[speed] = decode(body, "wav").duration
        assert durations[0.25] > 2.5 * durations[1.0], (model, durations)
        assert durations[4.0] < durations[1.0] / 2.5, (model, durations)


def test_voice_object_and_blend(server: LiveServer) -> None:
    with server.client() as http:
        plain = http.post("/v1/audio/speech", json={
            "model": "kokoro", "input": "Hello there.", "voice": {"id": "jf_alpha"},
            "response_format": "wav"})
        blend = http.post("/v1/audio/speech", json={
            "model": "kokoro", "input": "Hello there.", "voice": "jf_alpha(2)+jm_kumo(1)",
            "response_format": "wav"})
    assert plain.status_code == blend.status_code == 200
    assert plain.headers["x-voxmux-voice"] == "jf_alpha"
    assert decode(blend.content, "wav").rms > 0.01
    assert plain.content != blend.content


def test_instructions_are_named_as_ignored(server: LiveServer) -> None:
    with server.client() as http:
        response = http.post("/v1/audio/speech", json={
            "model": "tts-1", "input": "Hello.", "voice": "alloy", "instructions": "whisper",
            "response_format": "pcm"})
    assert response.status_code == 200
    assert "instructions ignored" in response.headers["x-voxmux-warnings"]


def test_longest_input_is_spoken_whole(server: LiveServer) -> None:
    """Through the SDK, as flac: half the text gives half the audio. On eSpeak NG, the fast
    engine; Piper and Kokoro speak long texts in tests/app/serving/test_long_text.py."""
    sentence = "Every sentence of this long text must be spoken, and none may be cut. "
    limit = server.app.state.settings.max_input_chars
    full = (sentence * (limit // len(sentence) + 1))[:limit]
    half = full[: limit // 2]
    client = sdk(server)
    durations = [
        decode(client.audio.speech.create(model="espeak", voice="alloy", input=text,
                                          response_format="flac").read(), "flac").duration
        for text in (half, full)
    ]
    assert 1.8 < durations[1] / durations[0] < 2.2, durations
    low, high = plausible_seconds(full)
    assert low < durations[1] < high


def test_request_id_is_kept_when_well_formed(server: LiveServer) -> None:
    with server.client() as http:
        kept = http.get("/v1/models", headers={"X-Request-ID": "client-abc-123"})
        replaced = http.get("/v1/models", headers={"X-Request-ID": "bad id!"})
    assert kept.headers["x-request-id"] == "client-abc-123"
    assert replaced.headers["x-request-id"] not in ("bad id!", "")


def test_the_warnings_header_is_one_safe_line() -> None:
    """Warnings can quote what a client sent: each once, no control character (uvicorn refuses
    the header and drops the connection), Latin-1, and bounded (proxies refuse 8 KB headers)."""
    header = warnings_header(["a\nX-Injected: 1", "a\nX-Injected: 1", "caf\u00e9 \u65e5", "b"])
    assert header == "a X-Injected: 1; caf\u00e9 \\u65e5; b"
    long = warnings_header([f"warning {i}" for i in range(2000)])
    assert len(long) == WARNINGS_HEADER_CHARS and long.endswith("...")
