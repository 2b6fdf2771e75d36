"""Security headers on every response; a Studio page with nothing inline for the CSP to allow."""

from __future__ import annotations

import re

import pytest

from app.resources import STATIC, TEMPLATES
from app.routes.studio import HTMX
from tests.conftest import LiveServer

HTML_AND_STATIC = ["/", "/studio/fragments/models", f"/static/{HTMX}", "/static/studio.js",
                   "/static/theme.js", "/static/studio.css"]
OTHERS = ["/v1/models", "/health", "/no/such/page", "/api/tts?model=espeak&text=Hi.&format=wav"]


def directives(policy: str) -> dict[str, list[str]]:
    parts = (d.split() for d in policy.split(";") if d.strip())
    return {name: values for name, *values in parts}


@pytest.mark.parametrize("path", HTML_AND_STATIC + OTHERS)
def test_every_response_refuses_framing_and_sniffing(server: LiveServer, path: str) -> None:
    with server.client() as client:
        response = client.get(path)
    assert response.status_code in (200, 404)
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "same-origin"
    policy = directives(response.headers["content-security-policy"])
    assert policy["frame-ancestors"] == ["'none'"]


@pytest.mark.parametrize("path", HTML_AND_STATIC)
def test_html_and_static_get_a_policy_of_own_files_only(server: LiveServer, path: str) -> None:
    with server.client() as client:
        response = client.get(path)
    assert response.status_code == 200
    policy = directives(response.headers["content-security-policy"])
    for directive in ("default-src", "script-src", "style-src", "connect-src", "media-src",
                      "img-src", "form-action"):
        assert policy[directive] == ["'self'"], directive
    assert policy["object-src"] == policy["base-uri"] == ["'none'"]


def test_the_studio_has_nothing_inline() -> None:
    """What the policy would refuse: inline scripts, styles, handlers, and htmx's eval and
    injected indicator style (`js:` values, `hx-on`, trigger filters)."""
    page = (TEMPLATES / "studio.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", page)
    assert "<style" not in page
    assert not re.search(r"\s(on[a-z]+|style|hx-on[:a-z-]*)\s*=", page)
    assert not re.search(r'hx-(vals|vars|headers)="js:', page)
    assert not re.search(r'hx-trigger="[^"]*\[', page)
    config = re.search(r"<meta name=\"htmx-config\" content='([^']*)'>", page)
    assert config and '"allowEval": false' in config[1]
    assert '"includeIndicatorStyles": false' in config[1]
    script = (STATIC / "studio.js").read_text() + (STATIC / "theme.js").read_text()
    assert not re.search(r"\beval\(|new Function\(|\.setAttribute\(\s*[\"']style", script)
