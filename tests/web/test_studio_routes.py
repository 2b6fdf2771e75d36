"""The Studio over plain HTTP: page, fragments (the same markup as its blocks), generate."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from app.routes.studio import HTMX
from tests.conftest import LiveServer, decode, start_server, test_settings

HX = {"HX-Request": "true"}


def _audio_src(html: str) -> str:
    match = re.search(r'<audio id="player"[^>]*src="([^"]+)"', html)
    assert match, html
    return match[1]


def test_page_renders_every_panel(server: LiveServer) -> None:
    with server.client() as client:
        page = client.get("/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    html = page.text
    for marker in ('id="compose"', 'id="voice-list"', 'id="models"', 'id="stats"',
                   'id="requests"', f'src="/static/{HTMX}"', 'data-limit="4096"'):
        assert marker in html, marker
    for model in ("kokoro", "piper", "espeak"):
        assert f'data-model="{model}"' in html


def test_static_files_are_served(server: LiveServer) -> None:
    with server.client() as client:
        htmx = client.get(f"/static/{HTMX}")
        script = client.get("/static/studio.js")
        css = client.get("/static/studio.css")
    assert htmx.status_code == 200 and "htmx" in htmx.text[:2000]
    assert script.status_code == 200 and "WebSocket" in script.text
    assert css.status_code == 200 and "data-theme" in css.text


@pytest.mark.parametrize("block", ["auth", "models", "voices", "requests", "compare", "blend",
                                   "blend_mix", "lexicons"])
def test_fragment_is_the_page_block(server: LiveServer, block: str) -> None:
    with server.client() as client:
        fragment = client.get(f"/studio/fragments/{block}")
        page = client.get("/")
    assert fragment.status_code == 200
    assert fragment.text.strip()
    assert fragment.text in page.text


def test_stats_fragment_has_every_card(server: LiveServer) -> None:
    with server.client() as client:
        html = client.get("/studio/fragments/stats").text
    for card in ("Requests", "Latency", "Real-time factor", "Cache", "Memory", "Loaded models"):
        assert f">{card}</summary>" in html, card
    assert "auth-hint" not in html
    assert re.search(r"<strong>kokoro</strong>.*· runs on CPU</span>", html)


def test_unknown_fragment_is_404(server: LiveServer) -> None:
    with server.client() as client:
        assert client.get("/studio/fragments/result").status_code == 404
        assert client.get("/studio/fragments/nope").status_code == 404


def test_generate_returns_playable_audio(server: LiveServer) -> None:
    with server.client() as client:
        result = client.post("/studio/generate", headers=HX, data={
            "model": "piper", "text": "The studio plays this sentence back.", "format": "mp3",
            "speed": "1.0",
        })
        assert result.status_code == 200, result.text
        src = _audio_src(result.text)
        audio = client.get(src)
        partial = client.get(src, headers={"Range": "bytes=0-99"})
    assert audio.headers["content-type"] == "audio/mpeg"
    clip = decode(audio.content, "mp3")
    assert clip.sample_rate == 22050
    assert 1.0 < clip.duration < 6.0
    assert clip.rms > 0.01
    assert 'download="voxmux-piper-en_US-joe-medium.mp3"' in result.text
    for fact in ("Total", "First audio", "Audio", "RTF", "Segments", "Cache"):
        assert f"<dt>{fact}</dt>" in result.text
    assert partial.status_code == 206
    assert partial.content == audio.content[:100]
    assert partial.headers["content-range"] == f"bytes 0-99/{len(audio.content)}"


def test_generate_speed_and_wav(server: LiveServer) -> None:
    text = "Faster speech is shorter."
    durations = []
    with server.client() as client:
        for speed in ("1.0", "2.0"):
            result = client.post("/studio/generate", headers=HX, data={
                "model": "espeak", "text": text, "format": "wav", "speed": speed})
            clip = decode(client.get(_audio_src(result.text)).content, "wav")
            durations.append(clip.duration)
    assert durations[1] < durations[0] * 0.75


def test_generate_packs_a_whole_clip_into_few_engine_calls(server: LiveServer) -> None:
    """The Studio plays a clip once it is whole, so it keeps no short first segment: five
    sentences (about 260 characters, Piper's limit is 400) are one engine call."""
    text = ("The morning train left the station exactly on time. Passengers read their papers "
            "in comfortable silence. Outside, the wide fields were covered in a thin frost. A "
            "conductor walked slowly down the narrow aisle. He checked every ticket with care.")
    with server.client() as client:
        result = client.post("/studio/generate", headers=HX, data={
            "model": "piper", "text": text, "format": "wav", "speed": "1.0"})
        assert result.status_code == 200, result.text
        clip = decode(client.get(_audio_src(result.text)).content, "wav")
    assert "<dt>Segments</dt><dd>1</dd>" in result.text
    assert len(text) / 25 < clip.duration < len(text) / 6 and clip.rms > 0.01


@pytest.mark.parametrize(("form", "status", "message"), [
    ({"voice": "no-such-voice"}, 400, "no-such-voice"),
    ({"text": "x" * 4100}, 400, "the limit is 4096"),
    ({"model": "tts-9"}, 404, "The model &#39;tts-9&#39; does not exist"),
    ({"format": "pcm"}, 400, "is not one of them"),
])
def test_generate_errors_are_shown_in_words(server: LiveServer, form: dict[str, str],
                                            status: int, message: str) -> None:
    data = {"model": "piper", "text": "Hello.", "format": "mp3"} | form
    with server.client() as client:
        result = client.post("/studio/generate", headers=HX, data=data)
    assert result.status_code == status
    assert 'class="error"' in result.text
    assert message in result.text
    assert "<audio" not in result.text


def test_post_without_htmx_header_is_refused(server: LiveServer) -> None:
    with server.client() as client:
        result = client.post("/studio/generate", data={"model": "piper", "text": "Hello."})
    assert result.status_code == 400
    assert "Studio page" in result.json()["error"]["message"]


def test_gone_clip_is_404(server: LiveServer) -> None:
    with server.client() as client:
        assert client.get("/studio/audio/not-a-clip").status_code == 404


def test_voice_filters_and_groups(server: LiveServer) -> None:
    with server.client() as client:
        male = client.get("/studio/fragments/voices",
                          params={"model": "kokoro", "gender": "male"}).text
        english = client.get("/studio/fragments/voices", params={"language": "en"}).text
        search = client.get("/studio/fragments/voices", params={"q": "joe"}).text
        pinned = client.get("/studio/fragments/voices", params={
            "fav": "kokoro:jf_nezumi", "recent": "piper:en_US-joe-medium,kokoro:jf_alpha(1)"}).text
    assert re.findall(r'<li class="voice" data-key="([^"]+)"', male) == ["kokoro:jm_kumo"]
    assert re.search(r"\b1 of \d+ voices match", male)
    english_keys = re.findall(r'<li class="voice" data-key="([^"]+)"', english)
    assert "piper:en_US-joe-medium" in english_keys and "espeak:en-gb" in english_keys
    assert not any(key.startswith("kokoro:") for key in english_keys)
    assert re.findall(r'<li class="voice" data-key="([^"]+)"', search) == [
        "piper:en_US-joe-medium"]
    favourites = pinned.split('data-group="favourites"')[1].split("</details>")[0]
    recent = pinned.split('data-group="recent"')[1].split("</details>")[0]
    assert 'data-key="kokoro:jf_nezumi"' in favourites and 'aria-pressed="true"' in favourites
    assert 'data-key="piper:en_US-joe-medium"' in recent
    assert 'data-key="kokoro:jf_alpha(1)"' in recent  # a blend still shows in the last used


def test_model_actions_rerender_the_panel(server: LiveServer) -> None:
    with server.client() as client:
        loaded = client.post("/studio/models/espeak/load", headers=HX)
        unknown = client.post("/studio/models/nope/load", headers=HX)
    assert loaded.status_code == 200
    assert re.search(r'id="status-espeak">ready<', loaded.text)
    card = re.compile(r'id="status-(\w+)">.*?<p class="hint">(\d+ voices .*?)</p>', re.S)
    cards = {m[1]: m[2] for m in card.finditer(loaded.text)}
    assert '<span class="runs-on">runs on CPU</span>' in cards["kokoro"]  # its session's
    assert "runs on" not in cards["espeak"]  # eSpeak NG runs on no provider
    assert unknown.status_code == 404
    assert "The model &#39;nope&#39; does not exist" in unknown.text


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("studio-keyed"), preload=["espeak"],
                                      api_keys=["studio-route-key"], auth_scope="all"))
    yield live
    live.stop()


def test_auth_hints_until_signed_in(keyed: LiveServer) -> None:
    with keyed.client() as client:
        page = client.get("/").text
        stats = client.get("/studio/fragments/stats").text
        refused = client.post("/studio/generate", headers=HX,
                              data={"model": "espeak", "text": "Hello."})
        action = client.post("/studio/models/espeak/unload", headers=HX)
        assert 'id="api-key"' in page and "name=" not in page.split('id="api-key"')[1][:80]
        assert "Sign in with an API key to see server stats." in stats
        assert refused.status_code == 401 and "Sign in with an API key" in refused.text
        assert action.status_code == 401 and "Sign in with an API key" in action.text

        assert client.post("/v1/auth/session", json={"key": "studio-route-key"}).status_code == 200
        signed_in = client.get("/").text
        made = client.post("/studio/generate", headers=HX | {"Origin": keyed.url},
                           data={"model": "espeak", "text": "Hello.", "format": "wav"})
        audio = client.get(_audio_src(made.text))
    assert "Signed in" in signed_in and 'id="api-key"' not in signed_in
    assert "studio-route-key" not in signed_in
    assert decode(audio.content, "wav").duration > 0.2
    with httpx.Client(base_url=keyed.url) as stranger:  # the clip needs the session too
        assert stranger.get(_audio_src(made.text)).status_code == 404

