"""What the Studio's browser tests share: Debian's chromium (never a downloaded browser), how it
is started, and the page-side recorders of Content-Security-Policy violations and of the audio the
page hands to Web Audio. The fixtures that use them are in `conftest.py`."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect

CHROMIUM = Path("/usr/bin/chromium")

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium; "
           ".ci/run installs it)",
)

ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
]
TIMEOUT_MS = 30_000
# Assertions wait as long as actions: CI machines are shared and a poll can take seconds.
expect.set_options(timeout=TIMEOUT_MS)

# Counts the samples the page hands to Web Audio, so a test can tell audio was really scheduled.
COUNT_SCHEDULED = """
window.__scheduled = {samples: 0, rate: 0, buffers: 0};
const createBuffer = AudioContext.prototype.createBuffer;
AudioContext.prototype.createBuffer = function (channels, length, rate) {
  window.__scheduled.samples += length;
  window.__scheduled.rate = rate;
  window.__scheduled.buffers += 1;
  return createBuffer.call(this, channels, length, rate);
};
"""

# Every Content-Security-Policy violation on a page, as the browser reports it to the page.
RECORD_CSP_VIOLATIONS = """
window.__csp = [];
document.addEventListener('securitypolicyviolation', (e) => window.__csp.push(
  `${e.effectiveDirective} blocked ${e.blockedURI || 'inline'} (${e.sourceFile}:${e.lineNumber})`));
"""


def csp_violations(ctx: BrowserContext, console: list[str]) -> list[str]:
    found = [m for m in console if "Content Security Policy" in m]
    for page in ctx.pages:
        if not page.is_closed():
            found += page.evaluate("window.__csp || []")
    return found


def open_studio(context: BrowserContext, url: str) -> Page:
    page = context.new_page()
    page.goto(url + "/")
    page.wait_for_function("() => window.htmx && window.Studio")
    return page
