"""Fuzzing every JSON route of the OpenAPI schema: never a 5xx, every 4xx in OpenAI's shape.

Bounded: a few examples per operation, no shrinking, no example database, derandomized. The
server speaks eSpeak by default and takes at most 120 characters; hooks steer some generated
`model` values to real models, so generated requests that happen to be valid are synthesized by
real engines (briefly). The Studio's HTML routes are not in the schema.

After the fuzzing, inputs the generator never produces (lone surrogates from JSON escapes, digits
of other scripts, malformed cookies) are sent explicitly: each of them once broke the server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error

from app.http.auth import COOKIE
from app.main import create_app
from app.settings import Settings
from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.reliability.checks import IDLE, assert_openai_error, idle_state, wait_until

CONFIG = schemathesis.Config.from_dict({
    "generation": {"deterministic": True, "database": "none", "no-shrink": True},
    "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
})
REAL_MODELS = ("espeak", "piper", "kokoro", "tts-1")

MAX_INPUT_CHARS = 120
# The schema comes from an app built here (building one loads no model) with the live server's
# limits; requests go to the live server below, which serves the same routes.
schema = schemathesis.openapi.from_dict(
    create_app(Settings(preload=[], max_input_chars=MAX_INPUT_CHARS)).openapi(), config=CONFIG
)


@schema.hook
def flatmap_body(ctx: Any, body: Any) -> st.SearchStrategy[Any]:
    """Random `model` strings all fail the first check: steer some to real models."""
    if isinstance(body, dict) and isinstance(body.get("model"), str):
        return st.sampled_from([body, *({**body, "model": m} for m in REAL_MODELS)])
    return st.just(body)


@schema.hook
def flatmap_path_parameters(ctx: Any, parameters: Any) -> st.SearchStrategy[Any]:
    if isinstance(parameters, dict) and "model_id" in parameters:
        return st.sampled_from(
            [parameters, *({**parameters, "model_id": m} for m in REAL_MODELS)]
        )
    return st.just(parameters)


@schema.hook
def flatmap_query(ctx: Any, query: Any) -> st.SearchStrategy[Any]:
    if isinstance(query, dict) and "text" in query:
        return st.sampled_from([query, *({**query, "model": m} for m in REAL_MODELS)])
    return st.just(query)


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = test_settings(
        tmp_path_factory.mktemp("fuzz"), preload=["espeak"], default_model="espeak",
        max_input_chars=MAX_INPUT_CHARS, request_timeout=30,
    )
    live = start_server(settings)
    yield live
    live.stop()


def openai_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    """Every 4xx body is `{"error": {"message", "type", "param", "code"}}`."""
    if 400 <= response.status_code < 500:
        assert "application/json" in response.headers.get("content-type", [""])[0]
        assert_openai_error(response.json(), status=response.status_code)
    return None


@schema.parametrize()
@hypothesis.settings(
    max_examples=20, deadline=None, derandomize=True, database=None,
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
    suppress_health_check=list(hypothesis.HealthCheck),
)
def test_api_fuzz(case: Any, fuzzed_server: LiveServer) -> None:
    case.call_and_validate(
        base_url=fuzzed_server.url, checks=[not_a_server_error, openai_error_shape], timeout=60
    )


def test_fuzzing_left_nothing_running(fuzzed_server: LiveServer) -> None:
    assert wait_until(lambda: idle_state(fuzzed_server), IDLE) == IDLE
    with fuzzed_server.client() as client:
        response = client.get("/api/tts", params={"text": "Still speaking after the fuzz."})
    assert response.status_code == 200


# -- inputs outside what the generator produces --------------------------------------------------

SURROGATE = "\\ud800"
"""A JSON escape for a lone surrogate: valid JSON, but no UTF-8 encoder accepts the string."""


@pytest.mark.parametrize(("route", "body"), [
    ("/v1/audio/speech", f'{{"model": "espeak", "input": "hello {SURROGATE} world"}}'),
    ("/v1/audio/speech", f'{{"model": "espeak", "input": "hello", "voice": "{SURROGATE}"}}'),
    ("/v1/audio/speech", f'{{"model": "espeak", "input": "hi", "language": "{SURROGATE}"}}'),
    ("/v1/audio/speech", f'{{"model": "espeak", "input": "hi", "voice": {{"id": "{SURROGATE}"}}}}'),
    ("/v1/synth", f'{{"input": "hello {SURROGATE}"}}'),
    ("/v1/models/switch", f'{{"model": "{SURROGATE}"}}'),
    ("/v1/auth/session", f'{{"key": "{SURROGATE}"}}'),
])
def test_lone_surrogates_are_a_400(fuzzed_server: LiveServer, route: str, body: str) -> None:
    with fuzzed_server.client() as client:
        response = client.post(route, content=body.encode(),
                               headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert_openai_error(response.json(), status=400)


@pytest.mark.parametrize("model", ["kokoro", "piper", "espeak"])
@pytest.mark.parametrize("language", [None, "zh"])
def test_digits_of_other_scripts_are_spoken(
    fuzzed_server: LiveServer, model: str, language: str | None
) -> None:
    text = "٣ ३ 𝟑 ๓"  # Arabic-Indic, Devanagari, mathematical and Thai threes
    with fuzzed_server.client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": model, "input": text, "language": language, "response_format": "wav"})
    assert response.status_code == 200, response.text
    assert decode(response.content, "wav").duration > 0.3


def test_an_oversized_body_is_a_413_before_it_is_read(fuzzed_server: LiveServer) -> None:
    body = b'{"model": "espeak", "input": "' + b"a" * (2 << 20) + b'"}'

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for start in range(0, len(body), 1 << 16):
            yield body[start:start + (1 << 16)]

    with fuzzed_server.client() as client:
        for content in (body, chunked()):
            response = client.post("/v1/audio/speech", content=content,
                                   headers={"content-type": "application/json"})
            assert response.status_code == 413
            assert assert_openai_error(response.json())["code"] == "request_too_large"
            assert response.headers["x-request-id"]


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(test_settings(tmp_path_factory.mktemp("keyed"), preload=[],
                                      api_keys="fuzz-key-1"))
    yield live
    live.stop()


@pytest.mark.parametrize("headers", [
    {"cookie": f"{COOKIE}=nonce.99999999999.\xe9"},  # non-ASCII signature
    {"cookie": f"{COOKIE}=nonce.\xb2.signature"},  # a digit int() cannot read
    {"cookie": f"{COOKIE}=..."},
    {"authorization": "Bearer \xe9\xe9"},
    {"authorization": "Bearer"},
])
def test_malformed_credentials_are_a_401(keyed_server: LiveServer, headers: dict[str, str]
                                         ) -> None:
    raw = {name.encode(): value.encode("latin-1") for name, value in headers.items()}
    response = httpx.get(keyed_server.url + "/stats", headers=raw, timeout=30)
    assert response.status_code == 401, response.text
    assert assert_openai_error(response.json())["code"] == "invalid_api_key"
    body = json.dumps({"key": "clé"})
    session = httpx.post(keyed_server.url + "/v1/auth/session", content=body, timeout=30,
                         headers={"content-type": "application/json"})
    assert session.status_code == 401
