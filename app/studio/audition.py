"""Hearing voices before choosing one: a voice's sample sentence, and two to four voices on the
same text side by side.

Both go through the speech service like any API request (validated, queued, counted). A sample
is not kept anywhere of its own: its render record (model, voice as resolved, sentence, and the
fingerprint of the voice's files) is the audio cache's key, so the second press of a play button
is a cache hit that touches no engine, the cache's item and byte budgets bound what samples
take, and a replaced voice file is a new record (and a rescan drops the model's old entries).
The same record, hashed, is the sample's ETag: a browser that heard it asks again with
`If-None-Match` and gets a 304 without the audio being looked up or encoded.
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass

from starlette.requests import Request

from app.audio.encoders import encode_whole
from app.protocols.native import whole_timed
from app.serving.plan import SpeechPlan
from app.serving.service import SpeechService
from app.studio.samples import sample_text, spoken_language
from app.studio.view import Clip, named_voices, synthesize
from engines.base import InvalidParameter, VoxMuxError

SAMPLE_FORMAT = "mp3"
"""Small, and every browser plays it."""
COMPARE_MIN, COMPARE_MAX = 2, 4


@dataclass(frozen=True)
class Sample:
    plan: SpeechPlan
    etag: str

    @property
    def text(self) -> str:
        return str(self.plan.text)


async def plan_sample(service: SpeechService, *, model: str, voice: str,
                      request_id: str = "", client: str = "") -> Sample:
    """The sample request for `voice` of `model` (its sentence in the voice's language), and
    the ETag its audio will have. Plans only: nothing is synthesized."""
    handle = service.registry.resolve(model)
    resolved = service.resolve_voice(handle, voice or None)
    text = sample_text(spoken_language(handle.engine.voices(), resolved))
    plan = await service.plan(model=handle.id, text=text, voice=voice or None, whole=True,
                              request_id=request_id or None, client=client)
    key = f"{service.render_record(plan).key()}.{SAMPLE_FORMAT}"
    return Sample(plan, f'"{hashlib.sha256(key.encode()).hexdigest()[:32]}"')


async def render_sample(service: SpeechService, sample: Sample,
                        request: Request | None = None) -> tuple[bytes, dict[str, object]]:
    """The sample's encoded audio and its stats envelope (`cache` says whether it was a hit)."""
    job = service.speak(sample.plan)
    samples, _ = await whole_timed(job, request)
    data = await asyncio.to_thread(encode_whole, samples, job.sample_rate, SAMPLE_FORMAT)
    assert job.stats is not None
    return data, job.stats.envelope()


@dataclass(frozen=True)
class Contender:
    """One voice of a comparison: its clip, or why it has none."""

    model: str
    voice: str
    name: str
    """The voice's name in its model's listing (the voice string itself for a blend)."""
    clip: Clip | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.model}:{self.voice}"


def check_picks(picks: list[tuple[str, str]]) -> None:
    if not COMPARE_MIN <= len(picks) <= COMPARE_MAX:
        raise InvalidParameter(
            f"Pick {COMPARE_MIN} to {COMPARE_MAX} voices to compare; {len(picks)} picked",
            param="voice",
        )


async def compare(service: SpeechService, picks: list[tuple[str, str]], *, text: str,
                  speed: float, fmt: str, request_id: str, client: str = "",
                  request: Request | None = None) -> list[Contender]:
    """Each picked voice speaks `text`, one after the other: together they would queue behind
    each other on a shared model and on the CPU, and each clip's timings would carry the others'
    work. A voice that cannot speak it gets its error; the others still speak."""
    check_picks(picks)
    names = {(v.model, v.id): v.name for v in named_voices(service, picks)}
    contenders = []
    for model, voice in picks:
        name = names.get((model, voice), voice)
        try:
            clip = await synthesize(service, model=model, text=text, voice=voice, speed=speed,
                                    fmt=fmt, request_id=request_id, client=client,
                                    request=request)
        except VoxMuxError as exc:
            contenders.append(Contender(model, voice, name, error=exc.message))
        else:
            contenders.append(Contender(model, voice, name, clip))
    return contenders
