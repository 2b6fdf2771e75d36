"""OpenAI's model names speak the language they are given, as OpenAI's own models do: Japanese
by Kokoro, English by hibari, the rest by eSpeak NG (config/models.toml `[openai.languages]`),
through the `openai` SDK unchanged; a voice id only one model has is spoken by that model; a
model asked for by its own id refuses a script it cannot read, naming one that can."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.hearing import hear, normalize


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(test_settings(tmp_path_factory.mktemp("languages"), preload=[],
                                        idle_ttl=-1, cache_max_items=0))
    yield server
    server.stop()


def _sdk(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("name", ["tts-1", "tts-1-hd"])
@pytest.mark.parametrize(("text", "model"), [
    ("はい、そうです。今日はいい天気ですね。", "kokoro"),
    ("The kitchen lights are now off.", "hibari"),
    ("Bonjour, comment allez-vous aujourd'hui ?", "espeak"),
], ids=["japanese", "english", "french"])
def test_the_sdk_speaks_each_language_on_openais_names(live: LiveServer, name: str, text: str,
                                                       model: str) -> None:
    response = _sdk(live).audio.speech.with_raw_response.create(
        model=name, voice="alloy", input=text, response_format="wav")
    assert response.headers["x-voxmux-model"] == model
    audio = decode(response.content, "wav")
    assert audio.rms > 0.01 and 0.8 < audio.duration < 12
    if model == "hibari":
        heard = normalize(hear(audio.samples, audio.sample_rate).text)
        assert {"kitchen", "lights", "off"} <= set(heard), heard


def test_a_voice_only_one_model_has_is_spoken_by_it(live: LiveServer) -> None:
    """LiveKit's OpenAI plugin with `TTS(model="tts-1-hd", voice="jf_alpha")`: Kokoro's voice."""
    sdk = _sdk(live)
    for text in ("はい。", "Hello there."):
        response = sdk.audio.speech.with_raw_response.create(
            model="tts-1-hd", voice="jf_alpha", input=text, response_format="wav")
        assert (response.headers["x-voxmux-model"],
                response.headers["x-voxmux-voice"]) == ("kokoro", "jf_alpha")
    joe = sdk.audio.speech.with_raw_response.create(
        model="tts-1", voice="en_US-joe-medium", input="Hello there.", response_format="wav")
    assert joe.headers["x-voxmux-model"] == "piper"


def test_a_model_named_by_its_id_refuses_a_script_it_cannot_read(live: LiveServer) -> None:
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={"model": "hibari", "input": "はい。"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "unsupported_language" and error["param"] == "input"
    assert "kokoro" in error["message"] and "en" in error["message"]


def test_an_ssml_lang_stretch_is_read_by_that_languages_model(tmp_path: Path) -> None:
    from app.main import create_app

    service = create_app(test_settings(tmp_path, preload=[])).state.service
    ssml = ('<speak>Good morning. <lang xml:lang="ja">おはようございます。</lang> '
            '<lang xml:lang="fr">Bonjour à tous.</lang></speak>')
    try:
        plan = asyncio.run(service.plan(model="tts-1", text=ssml, voice="nova"))
    finally:
        service.close()
    assert plan.model_id == "hibari"
    readers = {(s.handle.id, s.voice, s.language) for s in plan.speakers.values()}
    assert readers == {("kokoro", "jf_alpha", None), ("espeak", "en-us+f4", "fr")}
