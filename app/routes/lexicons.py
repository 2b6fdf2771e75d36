"""`/v1/audio/lexicons`: each API key's pronunciation lexicons (create, list, read, replace,
delete; a W3C PLS document is imported as one). They apply to every request made with the key.
The store reads and writes files: each call runs in a worker thread, off the event loop."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from pydantic import ValidationError

from app.http.deps import ClientDep, ServiceDep
from app.http.errors import describe_validation_error
from app.protocols.schemas import ERROR_RESPONSES, LexiconBody, LexiconCreate
from app.serving.lexicons import owner_of
from app.text.lexicon import parse_pls
from engines.base import InvalidParameter

router = APIRouter(tags=["pronunciation"])

PLS_TYPES = ("application/pls+xml", "application/xml", "text/xml")


@router.get("/v1/audio/lexicons", responses=ERROR_RESPONSES)
async def list_lexicons(service: ServiceDep, client: ClientDep) -> dict[str, object]:
    data = await asyncio.to_thread(service.lexicons.list, owner_of(client))
    return {"object": "list", "data": data}


@router.post("/v1/audio/lexicons", responses=ERROR_RESPONSES, status_code=201,
             openapi_extra={"requestBody": {"content": {
                 "application/json": {"schema": LexiconCreate.model_json_schema()},
                 "application/pls+xml": {"schema": {"type": "string"}}}}})
async def create_lexicon(request: Request, service: ServiceDep, client: ClientDep,
                         name: str | None = None) -> dict[str, object]:
    """JSON `{name, language, scope, entries: {word: "/ipa/" or respelling}}`, or a PLS
    document (`Content-Type: application/pls+xml`, the name in `?name=`)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    raw = await request.body()
    if kind in PLS_TYPES:
        if not name:
            raise InvalidParameter("a PLS import needs ?name=", param="name")
        language, entries = await asyncio.to_thread(parse_pls, raw.decode("utf-8", "replace"))
        return await asyncio.to_thread(service.lexicons.put, owner_of(client), name, language,
                                       entries)
    try:
        body = await asyncio.to_thread(LexiconCreate.model_validate_json, raw)
    except ValidationError as exc:  # the first problem only: 90,000 bad entries are one
        param, message = describe_validation_error(dict(exc.errors()[0]))
        raise InvalidParameter(f"a lexicon is JSON {{name, language, entries}} or PLS: "
                               f"{message}", param=param or "entries") from None
    return await asyncio.to_thread(service.lexicons.put, owner_of(client), body.name,
                                   body.language, body.entries, body.scope)


@router.get("/v1/audio/lexicons/{name}", responses=ERROR_RESPONSES)
async def get_lexicon(name: str, service: ServiceDep, client: ClientDep) -> dict[str, object]:
    return await asyncio.to_thread(service.lexicons.get, owner_of(client), name)


@router.put("/v1/audio/lexicons/{name}", responses=ERROR_RESPONSES)
async def replace_lexicon(name: str, body: LexiconBody, service: ServiceDep,
                          client: ClientDep) -> dict[str, object]:
    return await asyncio.to_thread(service.lexicons.put, owner_of(client), name, body.language,
                                   body.entries, body.scope)


@router.delete("/v1/audio/lexicons/{name}", responses=ERROR_RESPONSES)
async def delete_lexicon(name: str, service: ServiceDep, client: ClientDep
                         ) -> dict[str, object]:
    await asyncio.to_thread(service.lexicons.delete, owner_of(client), name)
    return {"name": name, "deleted": True}
