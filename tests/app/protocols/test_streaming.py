"""HTTP streaming: chunked audio as segments finish, OpenAI-style SSE, clean joins."""

from __future__ import annotations

import base64
import json
import time
from itertools import pairwise
from pathlib import Path

import numpy as np
import openai

from app.main import create_app
from app.serving.events import SegmentEnd
from app.serving.plan import SpeechPlan
from app.serving.service import SpeechService
from tests.conftest import LiveServer, decode, test_settings

SENTENCES = [
    "The morning train left the station on time.",
    "Passengers read their papers in silence.",
    "Outside, the fields were covered in frost.",
    "A conductor walked slowly down the aisle.",
    "He checked every ticket with great care.",
    "Near the window, a child pointed at the hills.",
    "The sun rose higher over the valley.",
    "Someone laughed at the back of the carriage.",
    "The next stop was still an hour away.",
    "Everyone settled in for the long ride.",
]
TEN = " ".join(SENTENCES)


def test_sdk_streaming_delivers_first_audio_long_before_the_last(server: LiveServer) -> None:
    with server.client() as http:  # streaming is measured here, not Piper's load
        http.post("/v1/models/piper/load").raise_for_status()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    started = time.perf_counter()
    arrivals: list[float] = []
    body = b""
    with client.audio.speech.with_streaming_response.create(
        model="piper", voice="alloy", input=TEN, response_format="pcm"
    ) as response:
        rate = int(response.headers["x-sample-rate"])
        for chunk in response.iter_bytes():
            arrivals.append(time.perf_counter() - started)
            body += chunk
    assert len(arrivals) >= 5
    assert arrivals[0] < arrivals[-1] / 3, arrivals
    audio = decode(body, "pcm", pcm_rate=rate)
    assert len(TEN) / 25 < audio.duration < len(TEN) / 6 and audio.rms > 0.01


def test_streamed_formats_decode_to_the_same_audio(server: LiveServer) -> None:
    """eSpeak is deterministic, so every format must carry the same samples."""
    with server.client() as http:
        def fetch(fmt: str) -> tuple[bytes, int]:
            r = http.post("/v1/audio/speech", json={
                "model": "espeak", "voice": "en-us", "input": TEN, "response_format": fmt})
            assert r.status_code == 200
            return r.content, int(r.headers["x-sample-rate"])

        pcm24 = decode(fetch("pcm")[0], "pcm", pcm_rate=24000)  # OpenAI's pcm is 24 kHz
        pcm = decode(fetch("wav")[0], "wav").samples
        flac = decode(fetch("flac")[0], "flac").samples
        mp3 = decode(fetch("mp3")[0], "mp3").samples
    assert np.array_equal(pcm, flac)
    assert abs(pcm24.duration - len(pcm) / 22050) < 0.001
    # mp3 adds encoder delay: align by cross-correlation, then compare shapes.
    lag = int(np.argmax(np.correlate(mp3[:44100], pcm[:22050], mode="valid")))
    aligned = mp3[lag: lag + len(pcm)]
    n = min(len(aligned), len(pcm))
    assert np.corrcoef(aligned[:n], pcm[:n])[0, 1] > 0.95


def test_sse_events_carry_the_audio_and_usage(server: LiveServer) -> None:
    text = " ".join(SENTENCES[:3])
    with server.client() as http, http.stream("POST", "/v1/audio/speech", json={
        "model": "tts-1", "voice": "alloy", "input": text,
        "response_format": "pcm", "stream_format": "sse"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        rate = int(response.headers["x-sample-rate"])
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done" and set(kinds[:-1]) == {"speech.audio.delta"}
    assert len(kinds) >= 3
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    audio = decode(pcm, "pcm", pcm_rate=rate)
    assert 4 < audio.duration < 20 and audio.rms > 0.01
    done = events[-1]
    assert done["usage"]["input_tokens"] > 0
    assert done["stats"]["segments"] == len(server.segments("tts-1", text)) >= 2
    assert abs(done["stats"]["audio_duration_ms"] / 1000 - audio.duration) < 0.05


async def segment_audio(service: SpeechService, plan: SpeechPlan) -> list[np.ndarray]:
    """Each segment's audio of `plan`, spoken (a segment may come in several pieces)."""
    chunks: list[np.ndarray] = []
    pieces: list[np.ndarray] = []
    async with service.speak(plan) as job:
        async for event in job.events():
            if isinstance(event, np.ndarray):
                pieces.append(event)
            elif isinstance(event, SegmentEnd):
                chunks.append(np.concatenate(pieces))
                pieces = []
    return chunks


async def test_segment_joins_are_click_free_and_unclipped(tmp_path: Path) -> None:
    # One whole sentence per segment (no first-segment cut, no packing): four sentences, three
    # sentence joins to check (a join inside a sentence: tests/app/serving/test_fairness.py).
    app = create_app(test_settings(tmp_path, preload=[], segment_growth=1,
                                   first_segment_chars=120))
    service = app.state.service
    try:
        for model in ("piper", "kokoro"):
            plan = await service.plan(model=model, text=" ".join(SENTENCES[:4]))
            chunks = await segment_audio(service, plan)
            assert len(chunks) >= 4
            inside = max(float(np.max(np.abs(np.diff(c)))) for c in chunks)
            joins = [abs(float(b[0]) - float(a[-1])) for a, b in pairwise(chunks)]
            assert max(joins) < inside / 20, (model, max(joins), inside)
            audio = np.concatenate(chunks)
            assert float(np.max(np.abs(audio))) <= 0.98 + 1e-6
            # a natural pause separates sentences: each later chunk starts with silence
            rate = service.registry[model].engine.sample_rate
            for chunk in chunks[1:]:
                assert float(np.max(np.abs(chunk[: rate // 10]))) < 0.01
    finally:
        await service.registry.close()
