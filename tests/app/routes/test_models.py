"""Model, voice, admin and health routes against a live server."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.conftest import LiveServer, decode, start_server, test_settings

OPENAI_VOICES = ["alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                 "shimmer", "verse", "marin", "cedar"]


def wait_status(http: httpx.Client, model: str, status: str) -> None:
    deadline = time.monotonic() + 30
    while http.get(f"/v1/models/{model}").json()["status"] != status:
        assert time.monotonic() < deadline, f"{model} never became {status}"
        time.sleep(0.05)


def test_models_list_has_ids_aliases_and_status(server: LiveServer) -> None:
    with server.client() as http:
        body = http.get("/v1/models").json()
    assert body["object"] == "list"
    cards = {m["id"]: m for m in body["data"] if m["alias_of"] is None}
    assert set(cards) == {"kokoro", "piper", "hibari", "espeak"}
    # OpenAI's model names speak English on hibari (README: the measured choice).
    assert cards["hibari"]["aliases"] == ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"]
    assert cards["piper"]["aliases"] == cards["kokoro"]["aliases"] == []
    for card in cards.values():
        assert card["object"] == "model" and card["owned_by"] and card["created"] > 0
        assert card["status"] in {"unloaded", "loading", "ready", "error"}
    assert cards["kokoro"]["status"] == "ready"  # preloaded


def test_model_by_alias(server: LiveServer) -> None:
    with server.client() as http:
        card = http.get("/v1/models/tts-1-hd").json()
        model = http.get("/v1/models/kokoro").json()
    assert (card["id"], card["alias_of"], card["engine"]) == ("tts-1-hd", "hibari", "hibari")
    assert (model["id"], model["alias_of"], model["engine"]) == ("kokoro", None, "kokoro")


def test_voices_per_model(server: LiveServer) -> None:
    with server.client() as http:
        kokoro = http.get("/v1/audio/voices", params={"model": "kokoro"}).json()["data"]
        espeak = http.get("/v1/audio/voices", params={"model": "espeak"}).json()["data"]
        every = http.get("/v1/audio/voices").json()["data"]
    ids = {v["id"] for v in kokoro}
    assert {"jf_alpha", "jf_gongitsune", "jf_nezumi", "jf_tebukuro", "jm_kumo"} <= ids
    alpha = next(v for v in kokoro if v["id"] == "jf_alpha")
    assert (alpha["language"], alpha["gender"]) == ("ja", "female")
    assert len(espeak) > 100 and {"en-us", "cmn"} <= {v["language"] for v in espeak}
    assert {v["model"] for v in every} == {"kokoro", "piper", "hibari", "espeak"}


def test_every_openai_voice_name_speaks_on_every_model(server: LiveServer) -> None:
    with server.client() as http:
        for model in ("tts-1", "piper", "kokoro", "espeak"):
            for voice in OPENAI_VOICES:
                response = http.post("/v1/audio/speech", json={
                    "model": model, "voice": voice, "input": "Hi.", "response_format": "pcm"})
                assert response.status_code == 200, (model, voice, response.text)
                assert len(response.content) > 1000


def test_load_unload_and_switch(server: LiveServer) -> None:
    with server.client() as http:
        loaded = http.post("/v1/models/espeak/load")
        assert loaded.status_code == 200 and loaded.json()["status"] == "ready"
        unloaded = http.post("/v1/models/espeak/unload")
        assert unloaded.json()["status"] == "unloaded"
        switched = http.post("/v1/models/switch", json={"model": "espeak",
                                                        "unload_previous": False})
        assert switched.status_code == 200
        assert switched.json()["model"] == "espeak" and switched.json()["status"] == "ready"
        assert switched.json()["previous_unloaded"] is False
        bad = http.post("/v1/models/switch", json={"model": "nope"})
        assert bad.status_code == 404 and bad.json()["error"]["param"] == "model"


def test_health(server: LiveServer) -> None:
    with server.client() as http:
        body = http.get("/health").json()
    assert body["status"] == "ok" and body["idle"] is False
    assert body["profile"] == "cpu"
    assert body["models"]["kokoro"]["status"] == "ready"
    assert body["models"]["kokoro"]["providers"] == ["CPUExecutionProvider"]
    assert body["models"]["espeak"]["providers"] == []  # no onnxruntime session


def test_a_model_that_fails_to_load_is_isolated(tmp_path: Path) -> None:
    blocker = tmp_path / "cache-is-a-file"
    blocker.write_text("x")
    live = start_server(test_settings(tmp_path, cache_dir=blocker, preload=["kokoro", "piper"]))
    try:
        with live.client() as http:
            kokoro = http.get("/v1/models/kokoro").json()
            assert kokoro["status"] == "error" and kokoro["error"]
            assert http.get("/health").json()["status"] == "degraded"
            failed = http.post("/v1/audio/speech", json={
                "model": "kokoro", "input": "Hello.", "voice": "alloy"})
            assert failed.status_code == 503
            assert failed.json()["error"]["code"] == "model_load_failed"
            ok = http.post("/v1/audio/speech", json={
                "model": "tts-1", "input": "Hello.", "voice": "alloy", "response_format": "wav"})
            assert ok.status_code == 200 and decode(ok.content, "wav").rms > 0.01
    finally:
        live.stop()
