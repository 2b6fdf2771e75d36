"""Wyoming, driven by the `wyoming` package's own client the way Home Assistant's Wyoming TTS
integration drives it: describe, synthesize (read until `audio-stop`), and the streaming form
(text in pieces, read until `synthesize-stopped`). Audio is compared with the HTTP route's for
the same request (the audio cache is off, so both are rendered) and heard by Whisper."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeTextFormat,
    SynthesizeVoice,
)

from app.protocols.wyoming import bind_host
from app.settings import Settings
from tests.conftest import LiveServer, free_port, start_server, test_settings
from tests.hearing import hear, normalize

READ_TIMEOUT = 60.0
ZEROCONF_NAME = f"voxmux-test-{os.getpid()}"


@pytest.fixture(scope="module")
def wyoming(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, int]]:
    port = free_port()
    live = start_server(test_settings(tmp_path_factory.mktemp("wyoming"), preload=[],
                                      idle_ttl=-1, cache_max_items=0, wyoming_port=port,
                                      ws_max_pending_chars=3000, ws_first_message_timeout=2,
                                      ws_text_idle_timeout=20,
                                      wyoming_zeroconf=ZEROCONF_NAME))
    yield live, port
    live.stop()


async def _read(client: AsyncTcpClient, until: str) -> list[Event]:
    """Events up to and including the first of type `until` (or an error)."""
    events: list[Event] = []
    while True:
        event = await asyncio.wait_for(client.read_event(), READ_TIMEOUT)
        assert event is not None, "the server closed the connection"
        events.append(event)
        if event.type == until or Error.is_type(event.type):
            return events


def _audio(events: list[Event]) -> tuple[np.ndarray, int]:
    starts = [AudioStart.from_event(e) for e in events if AudioStart.is_type(e.type)]
    chunks = [AudioChunk.from_event(e) for e in events if AudioChunk.is_type(e.type)]
    assert len(starts) == 1 and sum(AudioStop.is_type(e.type) for e in events) == 1
    rate = starts[0].rate
    assert all((c.rate, c.width, c.channels) == (rate, 2, 1) for c in chunks)
    pcm = b"".join(c.audio for c in chunks)
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768, rate


def _http_pcm(live: LiveServer, model: str, voice: str, text: str) -> tuple[bytes, int]:
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": model, "voice": voice, "input": text, "response_format": "pcm"})
    assert response.status_code == 200, response.text
    return response.content, int(response.headers["x-sample-rate"])


def test_describe_lists_every_models_voices(wyoming: tuple[LiveServer, int]) -> None:
    async def describe() -> Info:
        async with AsyncTcpClient("127.0.0.1", wyoming[1]) as client:
            await client.write_event(Describe().event())
            return Info.from_event((await _read(client, "info"))[-1])

    info = asyncio.run(describe())
    program = next(p for p in info.tts if p.installed)  # as Home Assistant picks it
    assert program.supports_synthesize_streaming
    voices = {v.name: v.languages for v in program.voices if v.installed}
    assert voices["hibari:heart"] == ["en-US"]
    assert voices["espeak:fr-fr"] == ["fr-FR"]
    assert "piper:en_US-joe-medium" in voices and "kokoro:jf_alpha" in voices
    with httpx.Client(base_url=wyoming[0].url) as http:
        listed = http.get("/v1/audio/voices").json()
    count = len(listed["data"] if isinstance(listed, dict) else listed)
    assert len(voices) == count  # every voice the API lists


def test_zeroconf_announces_it_as_home_assistant_looks_for_it(
        wyoming: tuple[LiveServer, int]) -> None:
    """Home Assistant's discovery asks for `_wyoming._tcp.local.` services: the announcement
    names the name set and the port Wyoming listens on (loopback here: VOXMUX_HOST)."""
    from zeroconf import IPVersion
    from zeroconf.asyncio import AsyncZeroconf

    from app.protocols.wyoming import ZEROCONF_TYPE

    async def look() -> object:
        browser = AsyncZeroconf(ip_version=IPVersion.V4Only)
        try:
            return await browser.async_get_service_info(
                ZEROCONF_TYPE, f"{ZEROCONF_NAME}.{ZEROCONF_TYPE}", timeout=5000)
        finally:
            await browser.async_close()

    found = asyncio.run(look())
    assert found is not None, "no zeroconf announcement"
    assert found.port == wyoming[1]  # type: ignore[attr-defined]
    assert found.parsed_addresses() == ["127.0.0.1"]  # type: ignore[attr-defined]


def test_synthesize_as_home_assistant_does(wyoming: tuple[LiveServer, int]) -> None:
    text = "The kitchen lights are now off. Good night, and sleep well."

    async def synthesize() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming[1]) as client:
            await client.write_event(Synthesize(
                text=text, voice=SynthesizeVoice(name="hibari:heart")).event())
            return await _read(client, AudioStop().event().type)

    samples, rate = _audio(asyncio.run(synthesize()))
    pcm, http_rate = _http_pcm(wyoming[0], "hibari", "heart", text)
    assert rate == http_rate == 24000
    assert np.array_equal(samples, np.frombuffer(pcm, "<i2").astype(np.float32) / 32768)
    heard = normalize(hear(samples, rate).text)
    assert {"kitchen", "lights", "night"} <= set(heard), heard


def test_streamed_text_is_spoken_before_it_ends(wyoming: tuple[LiveServer, int]) -> None:
    """Home Assistant's streaming form: the first sentence is heard while the rest of the text
    is still being written; the `synthesize` sent for older servers adds nothing."""
    first, rest = "The weather is cold today.", " Tomorrow it will rain in the hills."

    async def stream() -> tuple[list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", wyoming[1]) as client:
            voice = SynthesizeVoice(name="piper:en_US-joe-medium")
            await client.write_event(SynthesizeStart(voice=voice).event())
            for piece in ("The weather ", "is cold", " today.", " Tomorrow"):
                await client.write_event(SynthesizeChunk(text=piece).event())
            early = await _read(client, "audio-chunk")
            for piece in (" it will rain", " in the hills."):
                await client.write_event(SynthesizeChunk(text=piece).event())
            await client.write_event(Synthesize(text=first + rest, voice=voice).event())
            await client.write_event(SynthesizeStop().event())
            return early, await _read(client, SynthesizeStopped().event().type)

    early, late = asyncio.run(stream())
    assert not any(Error.is_type(e.type) for e in early + late), early + late
    assert AudioChunk.is_type(early[-1].type)  # audio before the text was complete
    samples, rate = _audio(early + late)
    assert rate == 22050
    whole, _ = _http_pcm(wyoming[0], "piper", "en_US-joe-medium", first + rest)
    assert 0.8 < len(samples) / (len(whole) / 2) < 1.25  # the compat synthesize added nothing
    heard = normalize(hear(samples, rate).text)
    assert {"weather", "cold", "tomorrow", "rain", "hills"} <= set(heard), heard


def test_ssml_is_read_when_the_client_says_so(wyoming: tuple[LiveServer, int]) -> None:
    ssml = '<speak>Good morning.<break time="900ms"/>Good night.</speak>'

    async def synthesize() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming[1]) as client:
            await client.write_event(Synthesize(
                text=ssml, voice=SynthesizeVoice(name="espeak:en-us"),
                text_format=SynthesizeTextFormat.SSML).event())
            return await _read(client, "audio-stop")

    samples, rate = _audio(asyncio.run(synthesize()))
    block = rate // 200
    rms = np.sqrt(np.mean(np.square(samples[:len(samples) // block * block]
                                    .reshape(-1, block)), axis=1))
    quiet = longest = 0
    for level in rms:
        quiet = quiet + 1 if level < 0.003 else 0
        longest = max(longest, quiet)
    assert abs(longest * block / rate - 0.9) < 0.03  # the break, not "less than speak"
    assert set(normalize(hear(samples, rate).text)) <= {"good", "morning", "night"}


def test_errors_are_error_events_and_the_connection_goes_on(
        wyoming: tuple[LiveServer, int]) -> None:
    async def attempt() -> tuple[list[Event], list[Event], list[Event]]:
        async with AsyncTcpClient("127.0.0.1", wyoming[1]) as client:
            await client.write_event(Synthesize(
                text="Hello.", voice=SynthesizeVoice(name="nobody")).event())
            whole = await _read(client, "error")
            await client.write_event(SynthesizeStart(
                voice=SynthesizeVoice(name="piper:nope")).event())
            stream = await _read(client, "error")
            stream.append(await asyncio.wait_for(client.read_event(), READ_TIMEOUT))
            await client.write_event(Describe().event())
            return whole, stream, await _read(client, "info")

    whole, stream, described = asyncio.run(attempt())
    error = Error.from_event(whole[-1])
    assert error.code == "voice_not_found" and "nobody" in error.text
    assert Error.from_event(stream[0]).code == "voice_not_found"
    assert SynthesizeStopped.is_type(stream[1].type)  # a stream always ends
    assert described[-1].type == "info"


def test_a_client_gone_mid_stream_releases_the_model(wyoming: tuple[LiveServer, int]) -> None:
    live, port = wyoming
    text = " ".join(["The long report goes on and on about the weather."] * 12)

    async def leave() -> None:
        client = AsyncTcpClient("127.0.0.1", port)
        await client.connect()
        await client.write_event(Synthesize(
            text=text, voice=SynthesizeVoice(name="piper")).event())
        await _read(client, "audio-chunk")
        await client.disconnect()

    asyncio.run(leave())
    deadline = time.monotonic() + 30
    with httpx.Client(base_url=live.url) as http:
        while time.monotonic() < deadline:
            piper = http.get("/stats").json()["models"]["piper"]
            if piper["refcount"] == 0 and piper["running"] == 0:
                break
            time.sleep(0.2)
    assert piper["refcount"] == 0 and piper["running"] == 0, piper


def test_a_server_with_keys_keeps_wyoming_on_loopback(tmp_path: Path) -> None:
    open_server = Settings(host="0.0.0.0", data_dir=tmp_path)
    keyed = Settings(host="0.0.0.0", api_keys=["k" * 32], data_dir=tmp_path)
    assert bind_host(open_server) == "0.0.0.0"
    assert bind_host(keyed) == "127.0.0.1"
    assert bind_host(keyed.model_copy(update={"wyoming_host": "0.0.0.0"})) == "0.0.0.0"


async def _raw(port: int, *lines: bytes) -> tuple[list[Event], float]:
    """Send raw bytes; read events until the server closes; and how long that took."""
    from wyoming.event import async_read_event

    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for line in lines:
        writer.write(line)
    await writer.drain()
    events = []
    while (event := await asyncio.wait_for(async_read_event(reader), READ_TIMEOUT)) is not None:
        events.append(event)
    writer.close()
    return events, time.monotonic() - started


@pytest.mark.parametrize("header", [
    b'{"type": "synthesize", "data_length": 1000000000}\n',  # claims a gigabyte
    b'{"type": "synthesize", "payload_length": 5000}\n',
    b'{"type": ["synthesize"]}\n',
    b"x" * 70_000 + b"\n",
])
def test_an_event_out_of_bounds_is_an_error_and_a_close(wyoming: tuple[LiveServer, int],
                                                        header: bytes) -> None:
    events, _ = asyncio.run(_raw(wyoming[1], header))
    assert [e.type for e in events] == ["error"]
    assert Error.from_event(events[0]).code == "invalid_value"


def test_a_silent_connection_is_closed(wyoming: tuple[LiveServer, int]) -> None:
    events, seconds = asyncio.run(_raw(wyoming[1], b'{"type": "synth'))  # half a header
    assert events == [] and seconds < 10


def test_a_readable_but_invalid_event_is_an_error_and_the_connection_goes_on(
        wyoming: tuple[LiveServer, int]) -> None:
    async def attempt() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming[1]) as client:
            await client.write_event(Event(type="synthesize", data={"text": 5}))
            events = await _read(client, "error")
            await client.write_event(Event(type="synthesize",
                                           data={"text": "Hi.", "voice": {"name": 7}}))
            events += await _read(client, "error")
            await client.write_event(Describe().event())
            return events + await _read(client, "info")

    events = asyncio.run(attempt())
    assert [e.type for e in events] == ["error", "error", "info"]
    assert {Error.from_event(e).code for e in events[:2]} == {"invalid_event"}


def test_a_stream_over_the_text_limit_says_so_and_ends(wyoming: tuple[LiveServer, int]) -> None:
    """More text than may wait (3,000 characters here), by chunks or by the unfinished tail the
    stop adds: one error naming the limit (it was 'cancelled', or no answer at all when the
    tail did it), and `synthesize-stopped` still ends the stream."""
    async def attempt() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming[1]) as client:
            await client.write_event(SynthesizeStart(
                voice=SynthesizeVoice(name="espeak:en-us")).event())
            for _ in range(300):  # 9,000 characters, three times the 3,000 allowed waiting
                await client.write_event(SynthesizeChunk(text="It rains today. ").event())
            await client.write_event(SynthesizeChunk(text="and then " * 40).event())
            await client.write_event(SynthesizeStop().event())
            events: list[Event] = []
            while not events or events[-1].type != "synthesize-stopped":
                events.append(await asyncio.wait_for(client.read_event(), READ_TIMEOUT))
            return events

    events = asyncio.run(attempt())
    errors = [Error.from_event(e) for e in events if Error.is_type(e.type)]
    assert [e.code for e in errors] == ["text_backlog_full"], errors


def test_a_failed_stream_start_answers_once(wyoming: tuple[LiveServer, int]) -> None:
    """Home Assistant's order with a voice that does not exist: one error and the stream's
    end; its `synthesize` for older servers is not a second request."""
    async def attempt() -> list[Event]:
        async with AsyncTcpClient("127.0.0.1", wyoming[1]) as client:
            voice = SynthesizeVoice(name="piper:nope")
            await client.write_event(SynthesizeStart(voice=voice).event())
            await client.write_event(SynthesizeChunk(text="Hello there.").event())
            await client.write_event(Synthesize(text="Hello there.", voice=voice).event())
            await client.write_event(SynthesizeStop().event())
            await client.write_event(Describe().event())
            events: list[Event] = []
            while not events or events[-1].type != "info":
                events.append(await asyncio.wait_for(client.read_event(), READ_TIMEOUT))
            return events

    events = asyncio.run(attempt())
    assert [e.type for e in events] == ["error", "synthesize-stopped", "info"]
