"""The Studio in headless Chromium (Debian's `/usr/bin/chromium`; no browser is ever downloaded).

Each test opens a fresh browser context (empty localStorage and cookies) and does what a person
would: type, press Generate or Stream, star a voice, switch a model, sign in.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, expect

from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.web.browser import RECORD_CSP_VIOLATIONS, csp_violations, needs_chromium, open_studio

pytestmark = needs_chromium

KEY = "studio-browser-key"


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """Models switched here do not disturb the shared server."""
    live = start_server(test_settings(tmp_path_factory.mktemp("studio-own"), preload=["espeak"]))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("studio-keyed"), preload=["espeak"],
                                      api_keys=[KEY], auth_scope="all"))
    yield live
    live.stop()


def test_generate_plays_decodable_audio(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.select_option("#model", "piper")
    page.fill("#text", "Every voice gets a fair hearing in the studio.")
    page.click("#generate")
    player = page.locator("#player")
    expect(player).to_be_attached()
    duration = page.evaluate("""() => new Promise((resolve, reject) => {
        const audio = document.querySelector('#player');
        const done = () => resolve(audio.duration);
        if (audio.readyState >= 1) return done();
        audio.addEventListener('loadedmetadata', done, {once: true});
        audio.addEventListener('error', () => reject(new Error('audio error ' +
            (audio.error && audio.error.code))), {once: true});
    })""")
    assert 1.0 < duration < 8.0
    src = player.get_attribute("src")
    assert src
    body = context.request.get(server.url + src).body()
    clip = decode(body, "mp3")
    assert clip.sample_rate == 22050
    assert abs(clip.duration - duration) < 0.3
    assert clip.rms > 0.01
    expect(page.locator("#download")).to_have_attribute("download", re.compile(r"\.mp3$"))
    expect(page.locator("#request-stats")).to_contain_text("RTF")
    # The voice used is remembered in "Last used".
    expect(page.locator('[data-group="recent"] li[data-key="piper:en_US-joe-medium"]')
           ).to_be_visible()


def test_the_word_being_heard_is_highlighted_and_the_srt_offered(
        server: LiveServer, context: BrowserContext) -> None:
    import urllib.parse

    import srt

    text = "Every voice gets a fair hearing in the studio."
    page = open_studio(context, server.url)
    page.select_option("#model", "piper")
    page.fill("#text", text)
    page.click("#generate")
    words = page.locator("#transcript .w")
    expect(words).to_have_count(9)
    assert page.locator("#transcript").inner_text().strip() == text
    # Play from just inside the fifth word: that word, and only it, lights up.
    fifth = float(words.nth(4).get_attribute("data-start") or 0)
    page.evaluate("""(t) => { const a = document.querySelector('#player');
        a.muted = true; a.currentTime = t; return a.play(); }""", fifth + 0.01)
    expect(page.locator("#transcript .w.speaking")).to_have_count(1)
    lit = page.evaluate("""() => [...document.querySelectorAll('#transcript .w')]
        .map((w, i) => [i, w.classList.contains('speaking')])""")
    assert next(i for i, on in lit if on) >= 4
    link = page.locator("#download-srt")
    expect(link).to_have_attribute("download", re.compile(r"\.srt$"))
    href = link.get_attribute("href") or ""
    cues = list(srt.parse(urllib.parse.unquote(href.split(",", 1)[1])))
    assert " ".join(c.content for c in cues) == text


def test_stream_highlights_words_as_they_are_heard(server: LiveServer,
                                                  context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.select_option("#model", "piper")
    text = "Streaming starts at once. The second sentence follows while the first one plays."
    page.fill("#text", text)
    page.click("#stream")
    expect(page.locator("#stream-words .w")).to_have_count(13, timeout=20_000)
    expect(page.locator("#stream-words .w.speaking")).to_have_count(1, timeout=10_000)
    expect(page.locator("#stream-state")).to_have_text("done", timeout=20_000)
    assert page.locator("#stream-words").inner_text().strip() == text


def test_keyboard_generate_with_ctrl_enter(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.select_option("#model", "espeak")
    page.select_option("#format", "wav")
    page.focus("#text")
    page.keyboard.type(" Typed by keyboard.")
    page.keyboard.press("Control+Enter")
    expect(page.locator("#player")).to_have_attribute("src", re.compile(r"^/studio/audio/"))
    expect(page.locator("#download")).to_have_attribute("download", re.compile(r"\.wav$"))


def test_stream_reports_time_to_first_audio(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.select_option("#model", "piper")
    text = "Streaming starts at once. A second sentence follows."
    page.fill("#text", text)
    page.click("#stream")
    ttfa = page.locator("#ttfa")
    expect(ttfa).to_have_attribute("data-ms", re.compile(r"^\d+$"))
    assert int(ttfa.get_attribute("data-ms") or 0) > 0
    expect(ttfa).to_have_text(re.compile(r"^\d+ ms$"))
    planned = len(server.segments("piper", text))
    assert planned >= 2
    expect(page.locator("#stream-detail")).to_contain_text(f"{planned} segments")
    scheduled = page.evaluate("window.__scheduled")
    detail = page.locator("#stream-detail").inner_text()
    audio_s = float(re.search(r"([\d.]+) s of audio", detail)[1])  # type: ignore[index]
    assert scheduled["rate"] == 22050
    assert abs(scheduled["samples"] / scheduled["rate"] - audio_s) < 0.05
    expect(page.locator("#stream-state")).to_have_text("done", timeout=20_000)
    expect(page.locator("#stream-error")).to_be_hidden()


def test_stream_can_be_stopped(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.select_option("#model", "piper")
    page.fill("#text", " ".join(["A long passage keeps the stream busy for a while."] * 12))
    page.click("#stream")
    expect(page.locator("#ttfa")).to_have_attribute("data-ms", re.compile(r"^\d+$"))
    page.click("#stop")
    expect(page.locator("#stream-state")).to_have_text(re.compile("stopped|cancelled"))
    expect(page.locator("#stream")).to_be_enabled()


def test_switch_model(own_server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, own_server.url)
    piper = page.locator("#status-piper")
    espeak = page.locator("#status-espeak")
    expect(piper).to_have_text("unloaded")
    expect(espeak).to_have_text("ready")
    page.click("#switch-piper")
    expect(piper).to_have_text("ready")
    expect(page.locator('li.model[data-model="piper"] .current')).to_be_visible()
    page.click("#switch-espeak")
    expect(espeak).to_have_text("ready")
    expect(piper).to_have_text("unloaded")  # the previous model is unloaded by the switch
    page.click("#unload-espeak")
    expect(espeak).to_have_text("unloaded")
    page.click("#load-espeak")
    expect(espeak).to_have_text("ready")
    assert own_server.app.state.service.registry.status()["espeak"].status == "ready"


def test_status_updates_without_a_click(own_server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, own_server.url)
    kokoro = page.locator("#status-kokoro")
    expect(kokoro).to_have_text("unloaded")
    with own_server.client() as client:  # someone else loads a model through the API
        assert client.post("/v1/models/kokoro/load").status_code == 200
    expect(kokoro).to_have_text("ready", timeout=10_000)
    with own_server.client() as client:
        client.post("/v1/models/kokoro/unload")


def test_favourite_survives_reload(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.select_option("#filter-model", "kokoro")
    star = page.locator('[data-group^="lang-"] button[data-key="kokoro:jf_nezumi"]')
    expect(star).to_have_attribute("aria-pressed", "false")
    star.focus()
    page.keyboard.press("Enter")
    favourite = page.locator('[data-group="favourites"] li[data-key="kokoro:jf_nezumi"]')
    expect(favourite).to_be_visible()
    expect(star).to_have_attribute("aria-pressed", "true")
    expect(star).to_be_focused()  # the re-rendered list gives focus back to the same star
    page.reload()
    expect(favourite).to_be_visible()
    expect(favourite.locator("button.fav")).to_have_attribute("aria-pressed", "true")
    stored = page.evaluate("localStorage.getItem('voxmux.favourites')")
    assert json.loads(stored) == ["kokoro:jf_nezumi"]
    favourite.locator("button.fav").click()  # and un-starring it empties the group
    expect(favourite).to_have_count(0)


def test_voice_filters_count_and_use(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.select_option("#filter-model", "kokoro")
    page.select_option("#filter-gender", "female")
    expect(page.locator("#voice-count")).to_have_text(re.compile(r"^4 of \d+ voices match$"))
    expect(page.locator('[data-group="lang-ja"] .count')).to_have_text("4")
    page.select_option("#filter-model", "")
    page.select_option("#filter-gender", "")
    page.fill("#voice-search", "joe")
    expect(page.locator("#voice-count")).to_have_text(re.compile(r"^1 of \d+ voices match$"))
    # The search is debounced: a list swapped in after the click would take the button away.
    expect(page.locator(".htmx-request, .htmx-settling")).to_have_count(0)
    page.click('button[data-action="use"][data-voice="en_US-joe-medium"]')
    expect(page.locator("#model")).to_have_value("piper")
    expect(page.locator("#voice")).to_have_value("en_US-joe-medium")


def test_theme_toggle_persists(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    html = page.locator("html")
    expect(html).to_have_attribute("data-theme", "light")
    light_bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.click("#theme-toggle")
    expect(html).to_have_attribute("data-theme", "dark")
    expect(page.locator("#theme-toggle")).to_have_attribute("aria-pressed", "true")
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != light_bg
    page.reload()
    expect(html).to_have_attribute("data-theme", "dark")
    page.click("#theme-toggle")
    page.reload()
    expect(html).to_have_attribute("data-theme", "light")


def test_key_flow_with_auth_on(keyed_server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, keyed_server.url)
    expect(page.locator("#voice-list .auth-hint")).to_be_visible()
    expect(page.locator("#stats .auth-hint")).to_contain_text("Sign in")
    page.select_option("#model", "espeak")
    page.click("#generate")
    expect(page.locator("#result .auth-hint")).to_contain_text("Sign in with an API key")
    page.click("#stream")
    expect(page.locator("#stream-error")).to_contain_text("Sign in with an API key")

    page.fill("#api-key", "wrong-key")
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#auth-error")).to_contain_text("Incorrect API key")
    expect(page.locator("#api-key")).to_have_value("")

    page.fill("#api-key", KEY)
    page.click("#sign-in button[type=submit]")
    expect(page.locator("#auth-state")).to_have_text("Signed in")
    expect(page.locator("#stats .auth-hint")).to_have_count(0)
    expect(page.locator("#stat-total")).to_have_text(re.compile(r"^\d+$"))
    page.select_option("#model", "espeak")
    page.click("#generate")
    expect(page.locator("#player")).to_be_attached()
    page.click("#stream")
    expect(page.locator("#ttfa")).to_have_attribute("data-ms", re.compile(r"^\d+$"))

    assert "voxmux_session" not in page.evaluate("document.cookie")
    cookie = next(c for c in context.cookies() if c["name"] == "voxmux_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    storage = page.evaluate("JSON.stringify([localStorage, sessionStorage])")
    assert KEY not in storage
    assert KEY not in page.content()

    page.click("#sign-out")
    expect(page.locator("#api-key")).to_be_visible()
    expect(page.locator("#stats .auth-hint")).to_be_visible()


def test_errors_are_shown_in_words(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.select_option("#model", "piper")
    page.fill("#voice", "no-such-voice")
    page.click("#generate")
    expect(page.locator("#result .error")).to_contain_text(
        "Piper has no usable voice 'no-such-voice'")
    page.click("#stream")
    expect(page.locator("#stream-error")).to_contain_text("no-such-voice")

    page.fill("#voice", "")
    page.fill("#text", "x" * 4100)
    expect(page.locator("#char-count")).to_have_class(re.compile(r"\bover\b"))
    expect(page.locator("#char-used")).to_have_text("4,100")
    page.click("#generate")
    expect(page.locator("#result .error")).to_contain_text("the limit is 4096")


def test_unexpected_answers_are_shown_in_words(server: LiveServer,
                                               context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    page.route("**/studio/generate", lambda route: route.fulfill(
        status=503, json={"error": {"message": "The model is still loading; retry shortly.",
                                    "type": "server_error", "param": None, "code": None}}))
    page.click("#generate")
    error = page.locator("#result .error")
    expect(error).to_have_text("The model is still loading; retry shortly.")
    page.unroute("**/studio/generate")
    page.route("**/studio/generate", lambda route: route.abort())
    page.click("#generate")
    expect(error).to_have_text("The server could not be reached; is it running?")


def test_every_control_is_labelled(server: LiveServer, context: BrowserContext) -> None:
    page = open_studio(context, server.url)
    expect(page.locator('#voice-list li.voice').first).to_be_attached()
    unlabelled = page.evaluate("""() => [...document.querySelectorAll(
        'input, select, textarea, button')].filter(el => {
          if (el.type === 'hidden') return false;
          if (el.tagName === 'BUTTON') return !(el.getAttribute('aria-label') ||
                                                el.textContent.trim());
          return !(el.labels && el.labels.length) && !el.getAttribute('aria-label');
        }).map(el => el.outerHTML.slice(0, 80))""")
    assert unlabelled == []
    duplicate_ids = page.evaluate("""() => {
        const ids = [...document.querySelectorAll('[id]')].map(el => el.id);
        return ids.filter((id, i) => ids.indexOf(id) !== i);
    }""")
    assert duplicate_ids == []


def test_usable_at_phone_width(server: LiveServer, browser: Browser) -> None:
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
    try:
        page = open_studio(ctx, server.url)
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        for control in ("#text", "#model", "#voice", "#generate", "#stream", "#voice-search",
                        "#job-text", "#job-file", "#job-start"):
            box = page.locator(control).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, control
        page.select_option("#model", "espeak")
        page.click("#generate")
        expect(page.locator("#player")).to_be_attached()
    finally:
        ctx.close()


def test_the_policy_refuses_what_the_studio_never_does(server: LiveServer,
                                                      browser: Browser) -> None:
    """The violation check of `context` can fail: an injected inline script is refused, and
    reported both ways it looks."""
    ctx = browser.new_context()
    try:
        ctx.add_init_script(RECORD_CSP_VIOLATIONS)
        console: list[str] = []
        ctx.on("console", lambda message: console.append(message.text))
        page = open_studio(ctx, server.url)
        page.evaluate("""() => {
            const script = document.createElement('script');
            script.textContent = 'window.__injected = true';
            document.head.appendChild(script);
        }""")
        page.wait_for_function("() => window.__csp.length > 0")
        assert page.evaluate("window.__injected") is None
        violations = csp_violations(ctx, console)
        assert any("script-src" in v for v in violations), violations
        assert any("Content Security Policy" in m for m in console), console
    finally:
        ctx.close()


def test_the_studio_cannot_be_framed(server: LiveServer, browser: Browser) -> None:
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        page.goto(server.url + "/static/studio.css")  # a page of the server's own origin, even
        with page.expect_console_message(lambda m: "frame-ancestors 'none'" in m.text):
            page.evaluate(f"""() => {{
                const frame = document.createElement('iframe');
                frame.src = {json.dumps(server.url + "/")};
                document.body.appendChild(frame);
            }}""")
        framed = next(f for f in page.frames if f is not page.main_frame)
        assert framed.evaluate("() => typeof window.Studio") == "undefined"
    finally:
        ctx.close()
