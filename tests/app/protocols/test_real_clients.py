"""What clients nobody here wrote do with VoxMux (pipecat, LiveKit, openai-agents, Open WebUI, the
`openai` SDK): they assume OpenAI's definitions rather than read VoxMux's headers."""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path

import httpx
import openai
import pytest

from app.resources import CONFIG
from app.serving.catalogue import Catalogue
from tests.conftest import LiveServer, decode, start_server, test_settings

TEXT = "The quick brown fox jumps over the lazy dog. It was a sunny day in the park."


def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


# -- pcm is 24 kHz, as OpenAI defines it ---------------------------------------------------------


@pytest.mark.parametrize("model", ["tts-1", "piper", "kokoro", "espeak"])
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
            "model": "piper", "voice": "alloy", "input": TEXT, "response_format": "wav"})
        sse = http.post("/v1/audio/speech", json={
            "model": "piper", "voice": "alloy", "input": TEXT, "response_format": "pcm",
            "stream_format": "sse"})
    assert sse.headers["x-sample-rate"] == "24000"
    events = [json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events
                   if e["type"] == "speech.audio.delta")
    assert decode(pcm, "pcm", pcm_rate=24000).duration == pytest.approx(
        decode(wav.content, "wav").duration, abs=0.005)


def test_native_routes_keep_the_engine_rate(server: LiveServer) -> None:
    with server.client() as http:
        legacy = http.get("/api/tts", params={"text": "Hello there.", "model": "piper",
                                              "format": "pcm"})
    assert legacy.headers["x-sample-rate"] == "22050"
    assert legacy.headers["content-type"] == "audio/pcm;rate=22050"


# -- models and voices as OpenAI clients and Open WebUI read them --------------------------------


def test_sdk_lists_and_retrieves_every_alias(server: LiveServer) -> None:
    client = sdk(server)
    listed = {model.id: model for model in client.models.list()}
    assert {"kokoro", "piper", "espeak", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(listed)
    assert (listed["tts-1"].model_extra or {})["alias_of"] == "hibari"
    assert (listed["gpt-4o-mini-tts"].model_extra or {})["alias_of"] == "hibari"
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


# -- voices: OpenAI's 400, the operator's aliases and policy -------------------------------------


def test_unknown_voice_is_openais_bad_request(server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk(server).audio.speech.create(model="tts-1", voice="nobody", input="Hello.")
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["type"], error["param"], error["code"]) == (
        "invalid_request_error", "voice", "voice_not_found")
    assert "nobody" in error["message"] and "[voice_aliases]" in error["message"]


def seed_catalogue(tmp: Path) -> Path:
    """The shipped catalogue with its commented seed lines switched on, as the README says."""
    text = (CONFIG / "models.toml").read_text(encoding="utf-8")
    text = text.replace('# tsukuyomi = "jf_alpha"', 'tsukuyomi = "jf_alpha"')
    text = text.replace('# zm_010 = "jm_kumo"', 'zm_010 = "jm_kumo"')
    path = tmp / "models.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_catalogue_voice_aliases_reach_every_model(tmp_path: Path) -> None:
    path = seed_catalogue(tmp_path)
    path.write_text(path.read_text().replace(
        'zm_010 = "jm_kumo"', 'zm_010 = "jm_kumo"\nnarrator = "fable"'))
    catalogue = Catalogue.load(path)
    assert catalogue.voice_aliases["tsukuyomi"] == "jf_alpha"
    kokoro, espeak = catalogue.models["kokoro"], catalogue.models["espeak"]
    assert kokoro.voice_map["tsukuyomi"] == "jf_alpha"
    # an alias to an OpenAI name goes through each model's own table
    assert kokoro.voice_map["narrator"] == kokoro.voice_map["fable"] == "jf_tebukuro"
    assert espeak.voice_map["narrator"] == "en-gb+m2"


def test_seed_examples_speak_with_the_catalogue_lines(tmp_path: Path) -> None:
    """HayaKoe's `speaker_name=tsukuyomi` and AngeVoice's `zm_010`, with the README's two lines;
    and `VOXMUX_UNKNOWN_VOICE=default` speaks an unmapped name with the default voice."""
    live = start_server(test_settings(tmp_path, catalogue=seed_catalogue(tmp_path),
                                      preload=[], unknown_voice="default"))
    try:
        health = httpx.get(live.url + "/health").json()  # nothing loaded: still ok
        assert (health["status"], health["idle"]) == ("ok", True)
        hayakoe = httpx.get(live.url + "/api/tts", timeout=120,
                            params={"text": "こんにちは", "speaker_name": "tsukuyomi"})
        with live.client() as http:
            angevoice = http.post("/v1/audio/speech", json={
                "model": "kokoro", "input": "你好世界", "voice": "zm_010",
                "response_format": "wav"})
            unmapped = http.post("/v1/audio/speech", json={
                "model": "tts-1", "input": "Hello there.", "voice": "nobody",
                "response_format": "wav"})
    finally:
        live.stop()
    assert hayakoe.status_code == 200 and hayakoe.headers["x-voxmux-voice"] == "jf_alpha"
    assert decode(hayakoe.content, "wav").rms > 0.01
    assert angevoice.status_code == 200 and angevoice.headers["x-voxmux-voice"] == "jm_kumo"
    assert decode(angevoice.content, "wav").rms > 0.01
    assert unmapped.status_code == 200
    assert unmapped.headers["x-voxmux-voice"] == "heart"  # tts-1 is hibari
    assert "voice 'nobody'" in unmapped.headers["x-voxmux-warnings"]
    assert decode(unmapped.content, "wav").rms > 0.01


# -- speed: the duration ratio asked for, on every model -----------------------------------------

SPEEDS = (0.25, 0.5, 0.8, 1.5, 2.0, 3.0, 4.0)
SPEED_TEXTS = (
    "The quick brown fox jumps over the lazy dog. It was a sunny day in the park, and everyone "
    "was happy to be outside.",
    "A small boat drifted across the quiet lake while the sun went down behind the hills.",
    "Please remember to bring your notes, a pencil and something to drink for the afternoon.",
)


@pytest.mark.parametrize("model", ["piper", "kokoro", "espeak"])
def test_speed_gives_the_asked_duration_ratio(server: LiveServer, model: str) -> None:
    """Audio at speed s lasts 1/s of the audio at speed 1, within 5%, over 0.25-4.0.

    Piper samples its durations (`noise_w`): one render of a sentence is ~1% longer or shorter
    than the next (measured: cv 1.1-1.4%), so its ratio is read over three texts; the other
    engines are deterministic and read one (Kokoro, the dearest, its first sentence)."""
    texts = {"piper": SPEED_TEXTS, "kokoro": (SPEED_TEXTS[0].split(". ")[0] + ".",)}.get(
        model, SPEED_TEXTS[:1])
    # Kokoro's tempo is the time-stretch alone (tests/app/audio/test_dsp.py measures its length
    # at every factor): the two ends of the range here. Piper's native range is measured
    # closely in tests/engines: four speeds across the range, each a whole render.
    speeds = {"espeak": SPEEDS, "kokoro": (0.25, 4.0)}.get(model, (0.25, 0.8, 2.0, 4.0))

    def seconds(speed: float) -> float:
        total = 0.0
        with server.client() as http:
            for text in texts:
                response = http.post("/v1/audio/speech", json={
                    "model": model, "input": text, "voice": "alloy", "speed": speed,
                    "response_format": "wav"})
                assert response.status_code == 200, response.text
                total += decode(response.content, "wav").duration
        return total

    normal = seconds(1.0)
    ratios = {speed: normal / seconds(speed) for speed in speeds}
    off = {speed: round(ratio / speed - 1, 3) for speed, ratio in ratios.items()}
    assert all(abs(error) <= 0.05 for error in off.values()), off


# -- HTTP/1.0 clients ------------------------------------------------------------------------------


def http10(server: LiveServer, request: bytes) -> tuple[str, dict[str, str], bytes]:
    """Send `request` as an HTTP/1.0 client does and read until the server closes."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=120) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


def test_http10_clients_get_a_body_they_can_read(server: LiveServer) -> None:
    payload = json.dumps({"model": "tts-1", "input": TEXT, "voice": "alloy",
                          "response_format": "wav"}).encode()
    status, headers, body = http10(server, b"POST /v1/audio/speech HTTP/1.0\r\n"
                                   b"Content-Type: application/json\r\n"
                                   b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n"
                                   + payload)
    assert status.split()[1] == "200"
    assert "transfer-encoding" not in headers
    assert int(headers["content-length"]) == len(body)
    assert decode(body, "wav").rms > 0.01
    status, headers, body = http10(
        server, b"GET /api/tts/stream?model=tts-1&text=Hello%20there. HTTP/1.0\r\n\r\n")
    assert status.split()[1] == "200" and "transfer-encoding" not in headers
    assert int(headers["content-length"]) == len(body) and decode(body, "wav").rms > 0.01
