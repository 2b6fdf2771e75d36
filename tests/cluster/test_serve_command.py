"""`voxmux serve --ray` as an operator runs it: its own local cluster, no Redis, one engine
replica, Wyoming on; it serves (OpenAI's, ElevenLabs' and Wyoming's clients), says what it would
share through Redis, and stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.cluster.conftest import OBJECT_STORE, wait_healthy
from tests.conftest import CACHE_DIR, decode, free_port


@dataclass
class Command:
    process: subprocess.Popen[bytes]
    url: str
    log: Path
    wyoming: int


@pytest.fixture(scope="module")
def command(ray_available: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Command]:
    tmp = tmp_path_factory.mktemp("serve")
    port, wyoming = free_port(), free_port()
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("VOXMUX_", "RAY_ADDRESS"))}
    env.update({
        "VOXMUX_PORT": str(port), "VOXMUX_PRELOAD": "", "VOXMUX_CACHE_DIR": str(CACHE_DIR),
        "VOXMUX_MODELS_DIR": str(tmp / "models"), "VOXMUX_CREDENTIALS_DIR": str(tmp / "keys"),
        "VOXMUX_RAY_CPUS": "2", "VOXMUX_RAY_OBJECT_STORE_BYTES": str(OBJECT_STORE),
        "VOXMUX_RAY_ENGINE_CPUS": "0.5", "VOXMUX_RAY_INGRESS_CPUS": "0",
        "VOXMUX_WYOMING_PORT": str(wyoming),
    })
    log = tmp / "voxmux.log"
    with log.open("wb") as out:
        # Its own process group: whatever happens, nothing of its cluster outlives the module.
        process = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--ray"],
                                   env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tmp,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, replicas=1)
        # Wyoming listens once the application is up, a moment after HTTP answers /health.
        deadline = time.monotonic() + 60
        while not _listening(wyoming):
            assert time.monotonic() < deadline and process.poll() is None, "no Wyoming"
            time.sleep(0.1)
        yield Command(process, url, log, wyoming)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def test_it_serves_without_redis_and_says_what_redis_would_share(command: Command) -> None:
    with httpx.Client(base_url=command.url, timeout=120) as http:
        health = http.get("/health").json()
        response = http.post("/v1/audio/speech", json={
            "model": "espeak", "input": "No Redis needed to speak.", "response_format": "wav"})
    shared = health["cluster"]["shared"]
    assert shared["redis"] is False
    for what in ("audio_cache", "studio_clips", "cancel_by_id"):
        assert "VOXMUX_CACHE_URL" in shared[what], shared
    assert response.status_code == 200, response.text
    audio = decode(response.content, "wav")
    assert audio.duration > 1 and audio.rms > 0.01


def test_wyoming_and_elevenlabs_clients_are_served_on_the_cluster(command: Command) -> None:
    """Home Assistant's Wyoming client (served by the command's own process, rendering on the
    engine replica) and ElevenLabs' SDK (through the ingress) get the single process's audio:
    the same samples the OpenAI route gives for the same voice."""
    from elevenlabs.client import ElevenLabs
    from wyoming.audio import AudioChunk, AudioStart, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.event import Event
    from wyoming.info import Describe, Info
    from wyoming.tts import Synthesize, SynthesizeVoice

    text = "The porch light is on."

    async def wyoming() -> tuple[Info, list[Event]]:
        async with AsyncTcpClient("127.0.0.1", command.wyoming) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await asyncio.wait_for(client.read_event(), 60))
            await client.write_event(Synthesize(
                text=text, voice=SynthesizeVoice(name="hibari:heart")).event())
            events = []
            while not events or not AudioStop.is_type(events[-1].type):
                events.append(await asyncio.wait_for(client.read_event(), 120))
            return info, events

    info, events = asyncio.run(wyoming())
    assert "hibari:heart" in {v.name for p in info.tts for v in p.voices}
    start = AudioStart.from_event(events[0])
    heard = b"".join(AudioChunk.from_event(e).audio for e in events if e.type == "audio-chunk")
    with httpx.Client(base_url=command.url, timeout=120) as http:
        openai = http.post("/v1/audio/speech", json={
            "model": "hibari", "input": text, "response_format": "pcm"})
    assert start.rate == int(openai.headers["x-sample-rate"]) == 24000
    assert heard == openai.content and len(heard) / 2 / 24000 > 0.8
    eleven = ElevenLabs(api_key="open-server", base_url=command.url + "/elevenlabs")
    pcm = b"".join(eleven.text_to_speech.convert("21m00Tcm4TlvDq8ikWAM", text=text,
                                                 output_format="pcm_24000"))
    assert pcm == openai.content  # Rachel is hibari's heart (config/models.toml)


def test_sigterm_drains_the_stream_under_way_and_stops_cleanly(command: Command) -> None:
    """SIGTERM while a stream is under way: the stream ends whole, then the command stops its
    cluster and exits 0 (Ray's own handler used to abort it: exit 134)."""
    text = " ".join(["The server is asked to stop while this sentence is spoken."] * 6)
    with httpx.Client(base_url=command.url, timeout=120) as http, http.stream(
        "POST", "/v1/audio/speech", json={"model": "piper", "input": text,
                                          "response_format": "pcm"}) as response:
        assert response.status_code == 200
        chunks = response.iter_bytes()
        body = next(chunks)
        command.process.send_signal(signal.SIGTERM)
        for chunk in chunks:
            body += chunk
    audio = decode(body, "pcm", pcm_rate=int(response.headers["x-sample-rate"]))
    assert audio.duration > len(text) / 25
    assert command.process.wait(timeout=90) == 0
    log = command.log.read_text(errors="replace")
    assert "Aborted" not in log and "Traceback" not in log, log[-3000:]
    leftover = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _group(p) ==
                command.process.pid]
    assert not leftover, [(p / "cmdline").read_bytes() for p in leftover]


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _group(proc: Path) -> int | None:
    """The process group of a /proc entry (None if it is gone)."""
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None
