"""Browser fixtures for the Studio's tests: one chromium per module, a fresh context per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, BrowserContext, sync_playwright

from tests.web.browser import (
    ARGS,
    CHROMIUM,
    COUNT_SCHEDULED,
    RECORD_CSP_VIOLATIONS,
    TIMEOUT_MS,
    csp_violations,
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """A fresh context; when the test is done, no page of it has broken the Studio's CSP."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    ctx.set_default_timeout(TIMEOUT_MS)
    ctx.add_init_script(COUNT_SCHEDULED)
    ctx.add_init_script(RECORD_CSP_VIOLATIONS)
    console: list[str] = []
    ctx.on("console", lambda message: console.append(message.text))
    yield ctx
    violations = csp_violations(ctx, console)
    ctx.close()
    assert violations == []
