"""Nothing one request asks for holds the event loop: with asyncio's debug mode on, no step of
the loop takes long while requests whose audio is stretched, shifted or resampled are served."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from app.main import create_app
from tests.conftest import test_settings

SLOW_STEP_S = 0.25
"""A loop step longer than this is a stall (stretching 30 s of audio took 0.5 s here)."""
SENTENCE = ("The morning train left the station exactly on time, and the passengers read their "
            "papers in a comfortable silence while the frosty fields went slowly by the window. ")


class _Slow(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Executing"):
            self.steps.append(message)


async def test_ssml_tempo_pitch_and_voice_switches_are_reshaped_off_the_loop(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    loop.slow_callback_duration = SLOW_STEP_S
    slow = _Slow()
    logging.getLogger("asyncio").addHandler(slow)
    app = create_app(test_settings(tmp_path, preload=[], cache_max_items=0))
    service = app.state.service
    ssml = ('<speak><prosody rate="x-slow" pitch="+20%">' + SENTENCE * 2 + "</prosody>"
            '<voice name="espeak">' + SENTENCE + "</voice></speak>")
    try:
        plan = await service.plan(model="piper", text=ssml, whole=True)
        assert max(len(s) for s in plan.segments) > 300  # long segments: long DSP
        async with service.speak(plan) as job:
            audio = await job.whole()
        assert len(audio) / plan.sample_rate > 40
    finally:
        service.close()
        logging.getLogger("asyncio").removeHandler(slow)
        loop.set_debug(False)
    assert not slow.steps, slow.steps
