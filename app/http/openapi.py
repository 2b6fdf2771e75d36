"""The OpenAPI schema says what the server really does.

FastAPI declares a 422 for every route with parameters; VoxMux answers invalid input with a 400
in OpenAI's shape, so each 422 becomes that 400. With keys on, the schema declares how to present
one (`Authorization: Bearer`, or the Studio's session cookie) on the routes that need it under the
configured scope. The longest `input` (and `/api/tts`'s `text`) is `max_input_chars`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from fastapi import FastAPI, routing
from fastapi.dependencies.models import Dependant

from app.http.auth import COOKIE, Authenticator, require_admin, require_synthesis
from app.protocols.schemas import ErrorResponse

ERROR_REF = "#/components/schemas/ErrorResponse"
SECURITY_SCHEMES = {
    "bearer": {"type": "http", "scheme": "bearer",
               "description": "A VoxMux API key (the OpenAI SDK's `api_key`)"},
    "session": {"type": "apiKey", "in": "cookie", "name": COOKIE,
                "description": "The Studio's session cookie from `POST /v1/auth/session`"},
}
TEXT_FIELDS = ("input", "text")


def _calls(dependant: Dependant) -> Iterator[Callable[..., Any] | None]:
    for dep in dependant.dependencies:
        yield dep.call
        yield from _calls(dep)


def _guarded(dependant: Dependant, auth: Authenticator) -> bool:
    calls = set(_calls(dependant))
    return require_admin in calls or (auth.scope == "all" and require_synthesis in calls)


def _operations(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for item in schema.get("paths", {}).values():
        yield from (op for op in item.values() if isinstance(op, dict))


def refine(schema: dict[str, Any], app: FastAPI, auth: Authenticator,
           max_input_chars: int) -> None:
    error = {"description": "Invalid request",
             "content": {"application/json": {"schema": {"$ref": ERROR_REF}}}}
    for op in _operations(schema):
        if op.get("responses", {}).pop("422", None) is not None:
            op["responses"].setdefault("400", error)
        for param in op.get("parameters", []):
            if param.get("in") == "query" and param.get("name") in TEXT_FIELDS:
                param["schema"]["maxLength"] = max_input_chars
    schemas = schema.setdefault("components", {}).setdefault("schemas", {})
    for body in schemas.values():
        for name in TEXT_FIELDS:
            field = body.get("properties", {}).get(name)
            if field is not None and field.get("type") == "string":
                field["maxLength"] = max_input_chars
    if "ErrorResponse" not in schemas:
        schemas["ErrorResponse"] = ErrorResponse.model_json_schema(
            ref_template="#/components/schemas/{model}")
        schemas.update(schemas["ErrorResponse"].pop("$defs", {}))
    text = json.dumps(schema)
    for unused in ("HTTPValidationError", "ValidationError"):
        if f'"#/components/schemas/{unused}"' not in text:
            schemas.pop(unused, None)
    if not auth.enabled:
        return
    schema["components"]["securitySchemes"] = SECURITY_SCHEMES
    denied = {"description": "No valid API key",
              "content": {"application/json": {"schema": {"$ref": ERROR_REF}}}}
    for route in routing.iter_route_contexts(app.routes):  # routes of included routers too
        if not isinstance(route.original_route, routing.APIRoute) or not route.include_in_schema:
            continue
        if not _guarded(route.dependant, auth):
            continue
        item = schema["paths"].get(route.path_format, {})
        for method in route.methods or ():
            op = item.get(method.lower())
            if op is not None:
                op["security"] = [{"bearer": []}, {"session": []}]
                op.setdefault("responses", {}).setdefault("401", denied)


def install(app: FastAPI, auth: Authenticator, max_input_chars: int) -> None:
    original = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            refine(original(), app, auth, max_input_chars)
        return app.openapi_schema or {}

    app.openapi = openapi  # type: ignore[method-assign]
