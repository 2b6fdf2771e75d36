"""Screenshots of the Studio for the README: light and dark, desktop (1280x900) and phone (390x844),
and the voice chooser (a blend being made, three voices compared, a sample playing).

Starts `voxmux serve` on a free port, makes one clip so the player and stats have something to
show, and drives Debian's chromium (never a downloaded browser):

    .venv/bin/python -m bench.screenshots            # writes docs/studio-*.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from playwright.sync_api import Browser, Page, expect, sync_playwright

from bench.common import ROOT, voxmux_server

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SIZES = {"": (1280, 900), "-phone": (390, 844)}
FAVOURITES = ["kokoro:jf_alpha", "piper:en_US-joe-medium"]
RECENT = ["kokoro:jf_alpha", "espeak:en-us", "piper:en_US-joe-medium"]
TEXT = "The morning train left the station exactly on time. Passengers read in silence."
BLEND = "jf_alpha(2)+jm_kumo(1)"
COMPARED = ["piper:en_US-joe-medium", f"kokoro:{BLEND}", "espeak:en-gb"]


def prepare(url: str, browser: Browser) -> None:
    """One generate, so the stats, request table and player are not empty."""
    page = browser.new_page()
    page.goto(url)
    page.select_option("#model", "piper")
    page.fill("#text", TEXT)
    page.click("#generate")
    page.wait_for_selector("#player")
    page.close()


def shoot(url: str, browser: Browser, theme: str, suffix: str, out: Path) -> Path:
    width, height = SIZES[suffix]
    context = browser.new_context(viewport={"width": width, "height": height},
                                  device_scale_factor=1, is_mobile=bool(suffix))
    state = {"voxmux.theme": theme, "voxmux.favourites": json.dumps(FAVOURITES),
             "voxmux.recent": json.dumps(RECENT)}
    context.add_init_script(
        f"for (const [k, v] of Object.entries({json.dumps(state)})) localStorage.setItem(k, v);"
    )
    page: Page = context.new_page()
    page.goto(url)
    page.fill("#text", TEXT)
    page.select_option("#model", "piper")
    page.click("#generate")
    page.wait_for_selector("#player")
    page.wait_for_selector('[data-group="favourites"] li')
    page.wait_for_timeout(300)  # let the first polls settle
    path = out / f"studio{suffix}-{theme}.png"
    page.screenshot(path=str(path), full_page=True)
    context.close()
    return path


def shoot_voices(url: str, browser: Browser, theme: str, out: Path) -> Path:
    """The blend editor and a comparison of three voices, one of them the blend, while a voice's
    sample plays: the part of the page below the Speak and Models panels."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
    state = {"voxmux.theme": theme, "voxmux.compare": json.dumps(COMPARED)}
    context.add_init_script(
        f"for (const [k, v] of Object.entries({json.dumps(state)})) localStorage.setItem(k, v);"
    )
    page: Page = context.new_page()
    page.goto(url)
    page.wait_for_function("() => window.htmx && window.Studio")
    # Loaded first, so that the comparison shows Kokoro's speed and not its load time.
    assert context.request.post(f"{url}/v1/models/kokoro/load").ok
    page.fill("#text", TEXT)
    page.select_option("#blend-voice-2", "jm_kumo")
    page.locator("#blend-weight-1").fill("6")
    page.locator("#blend-weight-2").fill("3")
    expect(page.locator("#blend-spec")).to_have_text(BLEND)
    page.wait_for_selector("#compare .chip >> nth=2")
    page.click("#compare-run")
    page.wait_for_selector(".contender >> nth=2")
    page.click('[data-group="lang-en-us"] button[data-action="preview"]')
    expect(page.locator("#preview-status")).to_contain_text("Playing")
    page.wait_for_timeout(300)
    top = page.locator(".blend").bounding_box()
    bottom = page.locator(".compare").bounding_box()
    assert top and bottom
    scrolled = float(page.evaluate("window.scrollY"))  # boxes are in the viewport's coordinates
    clip = {"x": 0, "y": top["y"] + scrolled - 16, "width": 1280,
            "height": bottom["y"] + bottom["height"] - top["y"] + 32}
    path = out / f"studio-voices-{theme}.png"
    page.screenshot(path=str(path), full_page=True, clip=clip)
    context.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {"VOXMUX_PRELOAD": "piper", "VOXMUX_CACHE_DIR": str(ROOT / "var" / "test-cache")}
    with voxmux_server(env) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            prepare(url, browser)
            for suffix in SIZES:
                for theme in ("light", "dark"):
                    print(shoot(url, browser, theme, suffix, args.out))
            for theme in ("light", "dark"):
                print(shoot_voices(url, browser, theme, args.out))
        finally:
            browser.close()


if __name__ == "__main__":
    main()
