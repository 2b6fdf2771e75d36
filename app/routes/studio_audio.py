"""Audio the Studio's players load by URL: the clips it made (`/studio/audio/{id}`, byte ranges
for seeking) and each voice's sample (`/studio/preview`).

Both are GETs, so that an `<audio src>` can load them; neither changes any state a cross-site
page could abuse (the sample of a voice is the same for everyone and cached).
"""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from app.audio.encoders import CONTENT_TYPES
from app.http.deps import ClientDep, RequestIdDep, ServiceDep
from app.http.errors import InvalidApiKey
from app.protocols.native import compact
from app.studio.audition import SAMPLE_FORMAT, plan_sample, render_sample
from app.studio.deps import ClipsDep, access

router = APIRouter(tags=["studio"], include_in_schema=False)

_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


@router.get("/studio/audio/{clip_id}")
async def clip_audio(clip_id: str, request: Request, clips: ClipsDep) -> Response:
    clip = await clips.get(clip_id)
    if clip is None or not access(request).synthesis:
        return Response("This clip is gone; generate it again.", status_code=404,
                        media_type="text/plain")
    headers = {
        "Accept-Ranges": "bytes",
        "Content-Disposition": f'inline; filename="{clip.filename}"',
        "Cache-Control": "private, max-age=3600",
    }
    size = len(clip.data)
    # Browsers ask for byte ranges to seek in audio; one range is all they send.
    match = _RANGE.fullmatch(request.headers.get("range", "").strip())
    if match is None or not (match[1] or match[2]):
        return Response(clip.data, media_type=clip.content_type, headers=headers)
    if match[1]:
        start, end = int(match[1]), min(int(match[2] or size - 1), size - 1)
    else:
        start, end = max(size - int(match[2]), 0), size - 1
    if start > end:
        return Response(status_code=416, headers={"Content-Range": f"bytes */{size}"})
    headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    return Response(clip.data[start:end + 1], status_code=206, media_type=clip.content_type,
                    headers=headers)


@router.get("/studio/preview")
async def preview(request: Request, service: ServiceDep, request_id: RequestIdDep,
                  client: ClientDep, model: Annotated[str, Query()],
                  voice: Annotated[str, Query()] = "") -> Response:
    """A short sentence in the voice's language, spoken by it. Errors are OpenAI's JSON (the
    page reads their message when the player cannot play)."""
    if not access(request).synthesis:
        raise InvalidApiKey("Sign in with an API key to hear voices")
    sample = await plan_sample(service, model=model, voice=voice.strip(),
                               request_id=request_id, client=client)
    # Revalidated every time (no-cache): the ETag is the render record, so a replaced voice
    # file is a new ETag, and an unchanged voice costs the browser a 304 and no synthesis.
    headers = {"ETag": sample.etag, "Cache-Control": "private, no-cache"}
    if sample.etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    data, stats = await render_sample(service, sample, request)
    headers["X-VoxMux-Stats"] = compact(stats)
    headers["Content-Disposition"] = f'inline; filename="sample.{SAMPLE_FORMAT}"'
    return Response(data, media_type=CONTENT_TYPES[SAMPLE_FORMAT], headers=headers)
