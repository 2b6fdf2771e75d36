"""What clients nobody here wrote do with VoxMux (pipecat, LiveKit, openai-agents, Open WebUI, the
`openai` SDK): they assume OpenAI's definitions rather than read VoxMux's headers."""

from __future__ import annotations

import base64
import json

import openai
import pytest

from tests.conftest import LiveServer, decode

TEXT = "The quick brown fox jumps over the lazy dog. It was a sunny day in the park."


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


# -- pcm is 24 kHz, as OpenAI defines it ---------------------------------------------------------


@pytest.mark.parametrize("model", ["tts-1", "tts-1-hd", "espeak"])
def test_pcm_played_at_24khz_lasts_as_long_as_the_wav(server: LiveServer, model: str) -> None:
    """A voice agent plays `pcm` at 24 kHz without reading a header: the speech must last as long
    (and so sound at the pitch) of the same request's wav, which states its own rate."""
    client = sdk(server)
    with client.audio.speech.with_streaming_response.create(
        model=model, voice="alloy", input=TEXT, response_format="pcm"
    ) as response:
        pcm = response.read()
        assert response.headers["content-type"] == "audio/pcm;rate=24000"
        assert response.headers["x-sample-rate"] == "24000"
    wav = decode(client.audio.speech.create(model=model, voice="alloy", input=TEXT,
                                            response_format="wav").read(), "wav")
    heard = decode(pcm, "pcm", pcm_rate=24000)
    assert heard.duration == pytest.approx(wav.duration, abs=0.005)
    assert heard.rms == pytest.approx(wav.rms, rel=0.05)


def test_sse_pcm_deltas_are_24khz_too(server: LiveServer) -> None:
    with server.client() as http:
        wav = http.post("/v1/audio/speech", json={
            "model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "wav"})
        sse = http.post("/v1/audio/speech", json={
            "model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm",
            "stream_format": "sse"})
    assert sse.headers["x-sample-rate"] == "24000"
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events
                   if e["type"] == "speech.audio.delta")
    assert decode(pcm, "pcm", pcm_rate=24000).duration == pytest.approx(
        decode(wav.content, "wav").duration, abs=0.005)


def test_native_routes_keep_the_engine_rate(server: LiveServer) -> None:
    with server.client() as http:
        legacy = http.get("/api/tts", params={"text": "Hello there.", "model": "tts-1",
                                              "format": "pcm"})
    assert legacy.headers["x-sample-rate"] == "22050"
    assert legacy.headers["content-type"] == "audio/pcm;rate=22050"


# -- models and voices as OpenAI clients and Open WebUI read them --------------------------------


def test_sdk_lists_and_retrieves_every_alias(server: LiveServer) -> None:
    client = sdk(server)
    listed = {model.id: model for model in client.models.list()}
    assert {"kokoro", "piper", "espeak", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(listed)
    assert (listed["tts-1"].model_extra or {})["alias_of"] == "piper"
    assert (listed["gpt-4o-mini-tts"].model_extra or {})["alias_of"] == "kokoro"
    assert client.models.retrieve("tts-1").id == "tts-1"
    assert client.models.retrieve("piper").id == "piper"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("tts-9")


def test_open_webui_reads_voices_and_models(server: LiveServer) -> None:
    """Open WebUI's OpenAI TTS code: `{v["id"]: v["name"] for v in GET /audio/voices ["voices"]}`
    (no model parameter) and `GET /audio/models` ["models"] for its pickers."""
    with server.client() as http:
        body = http.get("/v1/audio/voices").json()
        models = http.get("/v1/audio/models").json()
    picker = {voice["id"]: voice["name"] for voice in body["voices"]}
    assert {"jf_alpha", "en_US-joe-medium", "en-us"} <= set(picker)
    assert body["voices"] == body["data"]
    assert {"tts-1", "tts-1-hd", "kokoro"} <= {m["id"] for m in models["models"]}
