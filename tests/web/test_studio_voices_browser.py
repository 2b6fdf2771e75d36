"""Choosing a voice in headless Chromium: a voice's play button, the comparison and the blend
editor, judged by what a person hears: the player gets a source that plays, and that source,
decoded with PyAV, is speech of a plausible length, not silence."""

from __future__ import annotations

import json
import re

from playwright.sync_api import BrowserContext, Locator, Response, expect

from tests.conftest import LiveServer, decode
from tests.web.browser import needs_chromium, open_studio

pytestmark = needs_chromium

JOE = '[data-group="lang-en-us"] button[data-action="preview"][data-model="piper"]'
"""Piper's US English voice: its group holds other models' US English voices too (hibari)."""


def heard(context: BrowserContext, url: str, audio: Locator, fmt: str) -> float:
    """The player's duration, once its source has loaded; its source decodes to speech of that
    length (fetched again with the page's cookies)."""
    duration = float(audio.evaluate("""(audio) => new Promise((resolve, reject) => {
        if (audio.readyState >= 1) return resolve(audio.duration);
        audio.addEventListener('loadedmetadata', () => resolve(audio.duration), {once: true});
        audio.addEventListener('error', () => reject(new Error('audio error')), {once: true});
    })"""))
    src = audio.get_attribute("src")
    assert src
    clip = decode(context.request.get(url + src).body(), fmt)
    assert abs(clip.duration - duration) < 0.3
    assert clip.rms > 0.01
    return duration


def test_play_button_speaks_a_sample_without_a_reload(server: LiveServer,
                                                    context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    samples: list[Response] = []
    page.on("response", lambda r: samples.append(r) if "/studio/preview" in r.url else None)
    page.evaluate("window.__same_page = true")
    player = page.locator("#preview-player")

    page.locator(JOE).click()
    expect(player).to_have_attribute("src", re.compile(r"^/studio/preview\?model=piper&"))
    expect(page.locator("#preview-status")).to_contain_text(
        "Playing a sample of en_US-joe-medium (piper)")
    expect(page.locator(JOE)).to_have_attribute("aria-pressed", "true")
    assert 1.0 < heard(context, server.url, player, "mp3") < 5.0

    page.select_option("#filter-language", "de")
    german = page.locator('[data-group="rule-de"] button[data-action="preview"]')
    german.click()
    expect(player).to_have_attribute("src", "/studio/preview?model=espeak&voice=de")
    expect(page.locator("#preview-status")).to_contain_text("Playing a sample of de (espeak)")
    heard(context, server.url, player, "mp3")
    expect(page.locator("#preview-status")).to_contain_text("Played de (espeak)", timeout=10_000)
    expect(german).to_have_attribute("aria-pressed", "false")

    german.click()  # again: the player already holds it, nothing is asked of the server
    expect(page.locator("#preview-status")).to_contain_text("Playing a sample of de (espeak)")
    asked = [r.url for r in samples]
    assert len(asked) == len(set(asked)), asked
    assert page.evaluate("window.__same_page") is True


def test_a_sample_is_not_rendered_again_for_another_page(server: LiveServer,
                                                        context: BrowserContext) -> None:
    """A second visitor (another page: the player starts empty) hears the sample the first one
    made: the server's audio cache misses no more (or the browser's copy, revalidated with the
    sample's ETag, is played)."""
    def misses() -> int:
        with server.client() as client:
            return int(client.get("/stats").json()["cache"]["misses"])

    counts = []
    for _ in range(2):
        page = open_studio(context, server.url)
        page.locator(JOE).click()
        expect(page.locator("#preview-status")).to_contain_text("Playing a sample")
        page.close()
        counts.append(misses())
    assert counts[1] == counts[0]


def test_sample_and_blend_errors_are_shown_in_words(server: LiveServer,
                                                    context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.select_option("#filter-model", "kokoro")
    page.locator('#blend-weight-1').fill("0")
    page.locator('#blend-weight-2').fill("0")
    expect(page.locator("#blend-mix .error")).to_have_text(
        "Give at least one voice a weight above zero.")
    page.route("**/studio/preview?*", lambda route: route.fulfill(
        status=503, json={"error": {"message": "The model is still loading; retry shortly.",
                                    "type": "server_error", "param": None, "code": None}}))
    page.locator('[data-group="lang-ja"] button[data-action="preview"]').first.click()
    expect(page.locator("#preview-error")).to_have_text(
        "The model is still loading; retry shortly.")
    expect(page.locator('button[data-action="preview"][aria-pressed="true"]')).to_have_count(0)


def test_compare_voices_of_two_models_side_by_side(server: LiveServer,
                                                  context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.fill("#text", "Both voices read this line for you.")
    page.select_option("#format", "wav")
    page.fill("#voice-search", "joe")
    expect(page.locator("#voice-count")).to_have_text(re.compile(r"^1 of "))
    page.click('[data-group="lang-en-us"] button[data-action="compare"]')
    page.fill("#voice-search", "English (Great Britain)")
    expect(page.locator("#voice-count")).to_have_text(re.compile(r"^1 of "))
    page.click('[data-group="rule-en-gb"] button[data-action="compare"]')
    chips = page.locator("#compare .chip")
    expect(chips).to_have_count(2)
    expect(page.locator('[data-group="rule-en-gb"] button[data-action="compare"]')
           ).to_have_attribute("aria-pressed", "true")
    page.click("#compare-run")

    contenders = page.locator(".contender")
    expect(contenders).to_have_count(2)
    expect(contenders.nth(0)).to_have_attribute("data-key", "piper:en_US-joe-medium")
    expect(contenders.nth(1)).to_have_attribute("data-key", "espeak:en-gb")
    expect(page.locator("#compared-text")).to_contain_text("Both voices read this line")
    lengths = [heard(context, server.url, contenders.nth(i).locator("audio"), "wav")
               for i in range(2)]
    assert all(1.0 < s < 6.0 for s in lengths)
    for i in range(2):
        expect(contenders.nth(i).locator("dt", has_text="RTF")).to_be_visible()
        expect(contenders.nth(i).locator("dt", has_text="Cache")).to_be_visible()

    page.reload()  # the picks are kept; removing one leaves too few to compare
    expect(chips).to_have_count(2)
    page.click("#unpick-2")
    expect(chips).to_have_count(1)
    expect(page.locator("#compare-run")).to_be_disabled()
    assert json.loads(page.evaluate("localStorage.getItem('voxmux.compare')")) == [
        "piper:en_US-joe-medium"]


def test_compare_takes_four_voices_at_most(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.fill("#voice-search", "English")
    expect(page.locator("#neural-count")).to_have_text("0 neural")
    buttons = page.locator('[data-group^="rule-en"] button[data-action="compare"]')
    for i in range(5):
        buttons.nth(i).click()
        expect(page.locator(".htmx-request")).to_have_count(0)
    expect(page.locator("#compare .chip")).to_have_count(4)
    expect(page.locator("#compare-count")).to_contain_text("4 voices at most")


def test_blend_editor_writes_a_voice_string_that_speaks(server: LiveServer,
                                                        context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    spec = page.locator("#blend-spec")
    expect(spec).to_have_text("jf_alpha(1)+jf_gongitsune(1)")
    page.select_option("#blend-voice-2", "jm_kumo")
    page.locator("#blend-weight-1").fill("6")
    page.locator("#blend-weight-2").fill("3")
    expect(spec).to_have_text("jf_alpha(2)+jm_kumo(1)")
    expect(page.locator("#blend-shares")).to_have_text("jf_alpha 67 % · jm_kumo 33 %")
    page.select_option("#blend-voice-3", "jf_nezumi")
    page.locator("#blend-weight-3").fill("3")
    expect(spec).to_have_text("jf_alpha(2)+jm_kumo(1)+jf_nezumi(1)")

    page.click("#blend-play")  # its sample: the blend's first voice speaks Japanese
    player = page.locator("#preview-player")
    expect(player).to_have_attribute(
        "src", "/studio/preview?model=kokoro&voice=jf_alpha%282%29%2Bjm_kumo%281%29%2B"
               "jf_nezumi%281%29")
    expect(page.locator("#preview-status")).to_contain_text("Playing a sample of jf_alpha(2)")
    heard(context, server.url, player, "mp3")

    page.click("#blend-use")
    expect(page.locator("#model")).to_have_value("kokoro")
    expect(page.locator("#voice")).to_have_value("jf_alpha(2)+jm_kumo(1)+jf_nezumi(1)")
    page.fill("#text", "こんにちは。")
    page.click("#generate")
    expect(page.locator("#player")).to_be_attached()
    heard(context, server.url, page.locator("#player"), "mp3")

    page.click("#blend-compare")
    page.locator('[data-group="lang-ja"] li[data-key="kokoro:jm_kumo"] '
                 'button[data-action="compare"]').click()
    expect(page.locator("#compare .chip")).to_have_count(2)
    page.click("#compare-run")
    contenders = page.locator(".contender")
    expect(contenders).to_have_count(2)
    expect(contenders.nth(0)).to_have_attribute(
        "data-key", "kokoro:jf_alpha(2)+jm_kumo(1)+jf_nezumi(1)")
    for i in range(2):
        heard(context, server.url, contenders.nth(i).locator("audio"), "mp3")
