"""`POST /v1/audio/batch`: speech bodies in, one ZIP out (`001.<format>`, ..., `manifest.json`).

Each item is checked and spoken on its own, one after another, through the speech service like
any speech request; an item that fails (a bad field, an unknown voice, an engine failure) gets its
error in the manifest, in OpenAI's shape, and the others go on. A batch above `batch_max_items`
becomes a job (`runner`), whose result is the same ZIP.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError

from app.http.errors import error_body
from app.jobs.model import Item, ItemOptions
from app.jobs.results import encode_clip, manifest_entry
from app.protocols.schemas import BatchItem, voice_id
from app.serving.budgets import AudioLimit, check_audio
from app.serving.service import SpeechService
from engines.base import InvalidParameter


def asked(raw: Any) -> dict[str, Any]:
    """What an item asked, as sent (a manifest repeats it)."""
    return raw if isinstance(raw, dict) else {}


def validated(raw: Any) -> tuple[BatchItem | None, dict[str, Any] | None]:
    """The item, or OpenAI's error object saying what is wrong with it."""
    try:
        return BatchItem.model_validate(raw), None
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        message = f"{param}: {first['msg']}" if param else first["msg"]
        return None, error_body(InvalidParameter(message, param=param))["error"]


def fmt_of(raw: Any) -> str:
    value = asked(raw).get("response_format", "mp3")
    return value if isinstance(value, str) else "mp3"


async def run_batch(service: SpeechService, items: list[Any], request_id: str, client: str
                    ) -> tuple[list[tuple[str, bytes]], list[dict[str, Any]]]:
    """Every item spoken in turn: the ZIP's members and its manifest entries. The items' audio
    together is bounded by `batch_max_audio_seconds`: an item past what is left of it is not
    spoken (its input shows it) or stops where it reaches it, and gets the budget's error."""
    members: list[tuple[str, bytes]] = []
    entries: list[dict[str, Any]] = []
    left = service.settings.batch_max_audio_seconds
    for index, raw in enumerate(items):
        body, error = validated(raw)
        fmt = fmt_of(raw)
        file, duration = None, None
        if body is not None:
            try:
                plan = await service.plan(**body.plan_fields(), text=body.input, whole=True,
                                          request_id=f"{request_id}-{index + 1:03d}",
                                          client=client)
                check_audio(plan.least_seconds, left, "batch_max_audio_seconds",
                            "The batch's audio with this item")
                if plan.audio_limit is None or left < plan.audio_limit.seconds:
                    plan.audio_limit = AudioLimit(left, "batch_max_audio_seconds")
                async with service.speak(plan) as job:
                    audio = await job.whole()
                data = await asyncio.to_thread(encode_clip, audio, fmt, plan.sample_rate)
                file = f"{index + 1:03d}.{fmt}"
                members.append((file, data))
                duration = len(audio) / plan.sample_rate
                left -= duration
            except Exception as exc:
                error = error_body(exc)["error"]
        entries.append(manifest_entry(index, file, asked(raw), fmt, duration, error))
    return members, entries


def batch_items(items: list[Any]) -> list[Item]:
    """A large batch as a job's items, each as sent; one that is not a valid speech body
    carries its error (the job plans the others: `JobRunner.create`)."""
    out: list[Item] = []
    for index, raw in enumerate(items):
        body, error = validated(raw)
        options = ItemOptions(model="", response_format=fmt_of(raw))
        text = ""
        if body is not None:
            options = ItemOptions(model=body.model, voice=voice_id(body.voice), speed=body.speed,
                                  language=body.language, instructions=body.instructions,
                                  response_format=body.response_format)
            text = body.input
        out.append(Item(index, "", text, options, asked(raw), error))
    return out
