"""The Studio's pronunciation editor, as a person uses it: a made-up word heard as it is read now
and with a reading (Whisper hears the difference), the reading saved and then read by the API's
keyless requests, removed again; in Chromium too. Its own server: what it saves is the keyless
owner's lexicon, which every keyless request of a shared server would read."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import BrowserContext, expect

from engines.espeak_lib import espeak
from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.hearing import hear, normalize
from tests.web.browser import needs_chromium, open_studio

HX = {"HX-Request": "true"}
WORD = "Blorvek"
MEANT = "chocolate"
IPA = f"/{espeak().phonemize(MEANT, 'en-us')}/"


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("studio-lexicon")
    server = start_server(test_settings(tmp, preload=[], idle_ttl=-1,
                                        lexicons_dir=tmp / "lexicons"))
    yield server
    server.stop()


def _heard(live: LiveServer, src: str) -> list[str]:
    with live.client() as client:
        clip = decode(client.get(src).content, "mp3")
    assert clip.rms > 0.01
    return normalize(hear(clip.samples, clip.sample_rate).text)


def _sources(html: str) -> dict[str, str]:
    return dict(re.findall(r'<audio id="trial-(now|after)"[^>]*src="([^"]+)"', html))


def test_a_reading_is_heard_before_and_after_then_saved_used_and_removed(
        live: LiveServer) -> None:
    sentence = f"I would like {WORD} cake."
    with live.client() as client:
        tried = client.post("/studio/lexicon/try", headers=HX, data={
            "word": WORD, "reading": IPA, "text": sentence, "model": "piper"})
    assert tried.status_code == 200, tried.text
    sources = _sources(tried.text)
    assert set(sources) == {"now", "after"}, tried.text
    assert MEANT not in _heard(live, sources["now"])
    assert MEANT in _heard(live, sources["after"])

    with live.client() as client:
        saved = client.post("/studio/lexicon/save", headers=HX, data={
            "word": WORD, "reading": IPA, "language": "en"})
        listed = client.get("/v1/audio/lexicons").json()["data"]
        speech = client.post("/v1/audio/speech", json={
            "model": "piper", "input": sentence, "response_format": "wav"})
    assert saved.status_code == 200 and f'data-word="{WORD}"' in saved.text
    assert [(lex["name"], lex["entries"]) for lex in listed] == [("studio", {WORD: IPA})]
    audio = decode(speech.content, "wav")
    assert MEANT in normalize(hear(audio.samples, audio.sample_rate).text)

    with live.client() as client:
        removed = client.post("/studio/lexicon/remove", headers=HX, data={
            "word": WORD, "name": "studio"})
        assert client.get("/v1/audio/lexicons").json()["data"] == []
    assert removed.status_code == 200 and "No readings saved yet" in removed.text


@pytest.mark.parametrize(("form", "message"), [
    ({"word": WORD, "reading": IPA, "text": "No such word here.", "model": "piper"},
     "does not contain the word"),
    ({"word": WORD, "reading": "[x](/y/)", "model": "piper"}, "brackets or markup"),
    ({"word": WORD, "reading": IPA, "model": "nope"}, "does not exist"),
])
def test_a_reading_that_cannot_be_tried_says_why(live: LiveServer, form: dict[str, str],
                                                 message: str) -> None:
    with live.client() as client:
        tried = client.post("/studio/lexicon/try", headers=HX, data=form)
        saved = client.post("/studio/lexicon/save", headers=HX, data=form)
    assert tried.status_code in (400, 404) and message in tried.text, tried.text
    assert 'role="alert"' in tried.text
    if "brackets" in message:
        assert saved.status_code == 400 and message in saved.text


@needs_chromium
def test_the_pronunciation_panel_in_a_browser(live: LiveServer,
                                              context: BrowserContext) -> None:
    page = open_studio(context, live.url)
    page.fill("#lexicon-word", WORD)
    page.fill("#lexicon-reading", IPA)
    page.select_option("#lexicon-model", "hibari")
    page.click("#lexicon-try")
    for which in ("now", "after"):
        player = page.locator(f"#trial-{which}")
        expect(player).to_have_attribute("src", re.compile(r"^/studio/audio/"))
        duration = float(player.evaluate("""(audio) => new Promise((resolve, reject) => {
            if (audio.readyState >= 1) return resolve(audio.duration);
            audio.addEventListener('loadedmetadata', () => resolve(audio.duration),
                                   {once: true});
            audio.addEventListener('error', () => reject(new Error('audio error')),
                                   {once: true});
        })"""))
        assert 0.2 < duration < 4.0
    page.click("#lexicon-save")
    expect(page.locator(f'#lexicons tr[data-word="{WORD}"]')).to_be_visible()
    expect(page.locator("#lexicon-notice")).to_contain_text(f"Saved: {WORD}")
    page.locator(f'#lexicons tr[data-word="{WORD}"] button').click()
    expect(page.locator("#lexicon-empty")).to_be_visible()
