"""The OpenAPI schema declares what the server does: no 422s, the key when keys are on, the
longest `input` (app.http.openapi)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from tests.app.jobs.conftest import wait_job
from tests.conftest import start_server, test_settings

GUARDED_ALWAYS = {("/stats", "get"), ("/requests", "get"), ("/v1/models/rescan", "post"),
                  ("/v1/models/switch", "post"), ("/v1/models/{model_id}/load", "post"),
                  ("/v1/models/{model_id}/unload", "post"),
                  ("/v1/audio/requests/{request_id}/cancel", "post")}
OPEN_ALWAYS = {("/health", "get"), ("/v1/auth/session", "get"), ("/v1/auth/session", "post"),
               ("/v1/auth/session", "delete")}


def schema(**settings: Any) -> dict[str, Any]:
    result: dict[str, Any] = create_app(Settings(preload=[], **settings)).openapi()
    return result


def operations(spec: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in spec["paths"].items():
        for method, op in item.items():
            yield path, method, op


def secured(spec: dict[str, Any]) -> set[tuple[str, str]]:
    return {(path, method) for path, method, op in operations(spec) if op.get("security")}


def test_no_422_is_declared_and_invalid_input_is_a_400() -> None:
    spec = schema()
    assert "422" not in json.dumps(spec["paths"])
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for path, method, op in operations(spec):
        if op.get("parameters") or op.get("requestBody"):
            error = op["responses"]["400"]["content"]["application/json"]["schema"]
            assert error == {"$ref": "#/components/schemas/ErrorResponse"}, (path, method)


def test_the_422_would_never_be_sent(tmp_path: Path) -> None:
    """What the schema used to promise, checked against the server: invalid bodies get 400."""
    with TestClient(create_app(test_settings(tmp_path, preload=[]))) as client:
        for path, body in (("/v1/audio/speech", {"model": 1}), ("/v1/models/switch", {}),
                           ("/v1/synth", {"input": ["x"]})):
            assert client.post(path, json=body).status_code == 400
        assert client.get("/api/tts", params={"text": "x", "speed": "fast"}).status_code == 400


def test_no_security_is_declared_without_keys() -> None:
    spec = schema()
    assert "securitySchemes" not in spec["components"]
    assert secured(spec) == set()


@pytest.mark.parametrize("scope", ["admin", "all"])
def test_keys_declare_bearer_and_the_session_cookie(scope: str) -> None:
    spec = schema(api_keys="k-123456", auth_scope=scope)
    schemes = spec["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer",
                                 "description": schemes["bearer"]["description"]}
    assert schemes["session"]["in"] == "cookie" and schemes["session"]["name"] == "voxmux_session"
    guarded = secured(spec)
    every = {(path, method) for path, method, _ in operations(spec)}
    if scope == "admin":
        assert guarded == GUARDED_ALWAYS
    else:
        assert guarded == every - OPEN_ALWAYS
    for path, method in guarded:
        op = spec["paths"][path][method]
        assert op["security"] == [{"bearer": []}, {"session": []}]
        assert "401" in op["responses"]


def test_the_longest_input_is_declared() -> None:
    spec = schema(max_input_chars=777)
    bodies = spec["components"]["schemas"]
    for name in ("SpeechRequest", "SynthRequest"):
        assert bodies[name]["properties"]["input"]["maxLength"] == 777, name
    for path in ("/api/tts", "/api/tts/stream"):
        text = next(p for p in spec["paths"][path]["get"]["parameters"] if p["name"] == "text")
        assert text["schema"]["maxLength"] == 777


def test_a_finished_jobs_results_answer_the_content_types_the_schema_declares(
        tmp_path: Path) -> None:
    """Schemathesis flagged the job result routes: their audio, captions and ZIP were not in
    the schema. Each answer's type is one the schema lists for its route."""
    live = start_server(test_settings(tmp_path, preload=["espeak"]))
    spec = live.app.openapi()
    try:
        with live.client() as client:
            job = client.post("/v1/audio/jobs", json={"model": "espeak", "input": "One. Two.",
                                                      "response_format": "wav"}).json()
            wait_job(client, job["id"])
            base = f"/v1/audio/jobs/{job['id']}"
            answers = {
                "/v1/audio/jobs/{job_id}/audio": client.get(f"{base}/audio"),
                "/v1/audio/jobs/{job_id}/zip": client.get(f"{base}/zip"),
                "/v1/audio/jobs/{job_id}/chapters/{number}/audio":
                    client.get(f"{base}/chapters/1/audio"),
                "/v1/audio/jobs/{job_id}/chapters/{number}/captions":
                    client.get(f"{base}/chapters/1/captions", params={"format": "vtt"}),
            }
    finally:
        live.stop()
    for path, answer in answers.items():
        assert answer.status_code == 200, (path, answer.text)
        declared = spec["paths"][path]["get"]["responses"]["200"]["content"]
        sent = answer.headers["content-type"].replace(" ", "")
        assert sent in {kind.replace(" ", "") for kind in declared}, (path, sent, declared)
