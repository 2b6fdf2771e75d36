"""The Wyoming protocol (Home Assistant's local voice services) beside HTTP, on the same speech
service: its engines, scheduler, cache and limits.

A client asks `describe` and gets `info`: one TTS program, `voxmux`, whose voices are every
model's voices named `model:voice` (`piper:en_US-joe-medium`, `hibari:heart`), each with its
language. `synthesize` (the whole text; `text_format: ssml` reads SSML) answers `audio-start`,
`audio-chunk`s of 16-bit mono PCM at the model's rate, `audio-stop`. The streaming form
(`synthesize-start`, `synthesize-chunk`s of text as an LLM writes it, `synthesize-stop`) is a
text-in job: each sentence is spoken once it is complete, in one `audio-start` ... `audio-stop`,
then `synthesize-stopped`; the `synthesize` a streaming client also sends (for servers without
streaming) is ignored inside a stream. Failures are `error` events (a stream still ends with
`synthesize-stopped`). A voice names a model and voice (`model:voice`), a model (its default
voice), or a voice id one model has; none: the model `tts-1` names.

The protocol carries no key: with API keys set, Wyoming listens on loopback unless
`VOXMUX_WYOMING_HOST` says otherwise (`bind_host`). Events are read by VoxMux's own bounded reader
(`read_event`: a header line and its data of at most 64 KiB each, no payload: a client sends only
text): one over the bounds, or not a Wyoming event, is an `error` and the connection closes. A
connection without a first event in `VOXMUX_WS_FIRST_MESSAGE_TIMEOUT` seconds, or silent for
`VOXMUX_WS_TEXT_IDLE_TIMEOUT` after it, is closed (a stream's text ends there and is spoken
first); a malformed but readable event is an `error`, and the connection goes on.

Budgets, as a server facing the network keeps them: at most `VOXMUX_WYOMING_MAX_CONNECTIONS`
connections in all and `VOXMUX_WYOMING_MAX_CONNECTIONS_PER_CLIENT` from one address (`Places`);
one more is answered with one `error` (`too_many_connections`, naming the setting) and closed at
once. Every event sent waits at most `VOXMUX_WYOMING_SEND_TIMEOUT` seconds for a client that
reads nothing: past it the connection is reset as if the client had left, and its request is
cancelled. The handler only reads, routes and frames: it hands the loop back after every event,
so a client pouring events in cannot hold it.

Home Assistant finds Wyoming servers over zeroconf; VoxMux announces itself only when
`VOXMUX_WYOMING_ZEROCONF` names it (the `zeroconf` extra), since an announcement invites every
device on the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import json
import logging
import socket
import struct
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_write_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler, AsyncTcpServer
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from app.audio.encoders import to_pcm16
from app.http.errors import TooManyConnections, kind_of
from app.serving.budgets import env_name
from app.serving.job import SpeechJob
from app.serving.service import SpeechService
from app.settings import Settings
from app.text.feed import TextFeed
from engines.base import InvalidParameter, VoxMuxError
from engines.signature import package_versions

log = logging.getLogger(__name__)

DEFAULT_MODEL = "tts-1"
"""The model a request that names no voice gets (an alias: `hibari` in the catalogue)."""
CHUNK_SAMPLES = 4096
"""Samples per `audio-chunk` (a satellite plays them as they come)."""
WIDTH, CHANNELS = 2, 1
ATTRIBUTION = Attribution(name="VoxMux", url="")
ZEROCONF_TYPE = "_wyoming._tcp.local."


MAX_EVENT_BYTES = 64 * 1024
"""The most a header line, or its data, may hold (a `synthesize` of the longest input is far
less); asyncio's line limit is the same."""


MAX_DESCRIBES = 8
"""`describe` events answered on one connection (Home Assistant sends one)."""
LINGER_S = 1.0
"""How long a closing connection waits for its client to close too (see `_close`)."""


class BadEvent(InvalidParameter):
    """Not a Wyoming event VoxMux reads: the connection cannot be resynchronized after it."""


class ClientStalled(ConnectionError):
    """The client took nothing for the send timeout: it is treated as gone."""


class Places:
    """Connection places: `limit` in all, `per_client` of one client address. A connection
    takes one before it reads anything and frees it when it has closed, whatever closed it."""

    def __init__(self, limit: int, per_client: int) -> None:
        self.limit = limit
        self.per_client = per_client
        self.open = 0
        self._clients: Counter[str] = Counter()
        self._refusal_logged = 0.0

    def take(self, client: str) -> TooManyConnections | None:
        """A place for `client`, or the refusal to send it."""
        held = self._clients[client]
        if self.open >= self.limit:
            refusal = TooManyConnections(
                f"The Wyoming server has {self.open} connections open, its limit "
                f"({env_name('wyoming_max_connections')}); retry shortly",
                param="connections")
        elif held >= self.per_client:
            refusal = TooManyConnections(
                f"This address has {held} Wyoming connections open, the most one client may "
                f"({env_name('wyoming_max_connections_per_client')}); close one or retry "
                "shortly", param="connections")
        else:
            self.open += 1
            self._clients[client] += 1
            return None
        if time.monotonic() - self._refusal_logged > 60:  # a flood of refusals: a line a minute
            self._refusal_logged = time.monotonic()
            log.warning("wyoming: refused a connection from %s: %s", client, refusal.message)
        return refusal

    def free(self, client: str) -> None:
        self.open -= 1
        self._clients[client] -= 1
        if self._clients[client] <= 0:
            del self._clients[client]


async def read_event(reader: asyncio.StreamReader) -> Event | None:
    """One event, None at the end of the stream; `BadEvent` for one out of bounds or not an
    event (the `wyoming` package's reader buffers whatever length a header claims)."""
    try:
        line = await reader.readline()
    except (ValueError, asyncio.LimitOverrunError):
        raise BadEvent(f"an event header is longer than {MAX_EVENT_BYTES} bytes") from None
    if not line:
        return None
    try:
        header = json.loads(line)
        if not isinstance(header, dict) or not isinstance(header.get("type"), str):
            raise ValueError("no type")
        data = header.get("data") or {}
        length, payload = header.get("data_length") or 0, header.get("payload_length") or 0
        if not isinstance(data, dict) or not isinstance(length, int) or not isinstance(
                payload, int):
            raise ValueError("bad lengths")
    except (ValueError, RecursionError):
        raise BadEvent("not a Wyoming event header (one JSON object with a type)") from None
    if not 0 <= length <= MAX_EVENT_BYTES or payload != 0:
        raise BadEvent(f"an event's data may hold at most {MAX_EVENT_BYTES} bytes and a "
                       "client's events no payload")
    if length:
        try:
            extra = json.loads(await reader.readexactly(length))
        except (ValueError, RecursionError):
            raise BadEvent("an event's data is not a JSON object") from None
        if not isinstance(extra, dict):
            raise BadEvent("an event's data is not a JSON object")
        data = {**data, **extra}
    return Event(type=header["type"], data=data)


def bind_host(settings: Settings) -> str:
    """Where Wyoming listens: its own host setting, else loopback on a server with keys (the
    protocol has no key field), else the HTTP host."""
    if settings.wyoming_host:
        return settings.wyoming_host
    return "127.0.0.1" if settings.api_keys else settings.host


def language_tag(code: str) -> str:
    """`en-us` -> `en-US` (the form Home Assistant lists languages in)."""
    base, _, region = code.partition("-")
    return f"{base.lower()}-{region.upper()}" if region and len(region) == 2 else code


def info(service: SpeechService) -> Info:
    """Every model's voices as one TTS program."""
    voices = []
    for handle in service.models():
        fallback = list(handle.engine.capabilities.languages)
        for voice in handle.engine.voices():
            languages = [voice.language] if voice.language else fallback
            voices.append(TtsVoice(
                name=f"{handle.id}:{voice.id}", description=f"{voice.name} ({handle.id})",
                attribution=ATTRIBUTION, installed=True, version=None,
                languages=[language_tag(code) for code in languages]))
    return Info(tts=[TtsProgram(
        name="voxmux", description="VoxMux: every model's voices", attribution=ATTRIBUTION,
        installed=True, version=package_versions("voxmux"), voices=voices,
        supports_synthesize_streaming=True)])


def resolve(service: SpeechService, voice: SynthesizeVoice | None) -> tuple[str, str | None]:
    """(model, voice) for a Wyoming voice; none: `DEFAULT_MODEL`'s default."""
    name = (voice.name or "").strip() if voice is not None else ""
    return service.named_voice(name) if name else (DEFAULT_MODEL, None)


class WyomingHandler(AsyncEventHandler):
    """One client connection."""

    def __init__(self, service: SpeechService, places: Places, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self.service = service
        self.places = places
        settings = service.settings
        self.first_timeout = settings.ws_first_message_timeout
        self.idle_timeout = settings.ws_text_idle_timeout
        self.send_timeout = settings.wyoming_send_timeout
        peer = writer.get_extra_info("peername")
        self.address = str(peer[0]) if peer else "unknown"
        self.client = f"wyoming:{self.address}"
        self._streaming = False
        """Between `synthesize-start` and `synthesize-stop` (a failed start too: the
        `synthesize` a streaming client sends for older servers is then not a new request)."""
        self._stream: SpeechJob | None = None
        self._speaking: asyncio.Task[None] | None = None
        self._describes = 0
        self._overflow: VoxMuxError | None = None
        """Why the stream's text was refused (too much waiting): its error, told once."""

    async def run(self) -> None:
        """The connection, in a place of its own (or refused at once), until it has closed."""
        refusal = self.places.take(self.address)
        if refusal is not None:
            with contextlib.suppress(ConnectionError):
                await self._error(refusal)
            await self._close()
            return
        try:
            await self._serve()
        finally:
            self.places.free(self.address)

    async def _serve(self) -> None:
        """Events until the client leaves, goes quiet, stops reading, or sends what is not an
        event."""
        timeout = self.first_timeout  # a connection that says nothing is closed as on HTTP
        try:
            while not self.writer.is_closing():  # closing: a stalled client was cut off
                try:
                    async with asyncio.timeout(timeout):
                        event = await read_event(self.reader)
                except TimeoutError:
                    await self._stop()  # the text so far is spoken, then the connection ends
                    break
                if event is None or not await self._handle(event):
                    break
                timeout = self.idle_timeout
                await asyncio.sleep(0)  # events already buffered would not hand the loop back
        except BadEvent as exc:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._error(exc)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away mid-event, or read nothing for the send timeout
        finally:
            await self.disconnect()
            await self._close()

    async def write_event(self, event: Event) -> None:
        """Send `event`, waiting at most the send timeout for the client to take it (`drain`
        waits for as long as a client reads nothing): past it the connection is reset and
        `ClientStalled` ends what was being sent, as if the client had left."""
        try:
            async with asyncio.timeout(self.send_timeout):
                await async_write_event(event, self.writer)
        except TimeoutError:
            log.info("wyoming %s read nothing for %g s (%s); the connection is reset",
                     self.client, self.send_timeout, env_name("wyoming_send_timeout"))
            self._reset()
            raise ClientStalled(f"the client read nothing for {self.send_timeout:g} s") from None

    async def _close(self) -> None:
        """Close, and wait until closed: what is still buffered for a client that reads
        nothing would keep the socket open for ever, so after the send timeout it is reset.

        Closing a socket with unread bytes in it sends a reset, which can destroy the last
        events on their way (the `error` of a refused connection, whose `describe` was never
        read): so the server first ends its side, then reads and drops what the client still
        sends until it closes too, for `LINGER_S` at most."""
        if not self.writer.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                self.writer.write_eof()
            with contextlib.suppress(TimeoutError, OSError, ValueError):
                async with asyncio.timeout(LINGER_S):
                    while await self.reader.read(MAX_EVENT_BYTES):
                        pass
        self.writer.close()
        try:
            async with asyncio.timeout(self.send_timeout):
                await self.writer.wait_closed()
        except TimeoutError:
            self._reset()
        except OSError:
            pass  # closed by a reset

    def _reset(self) -> None:
        """Close at once with a reset: a plain close leaves the kernel trying to deliver what
        is buffered (the socket lingers, orphaned, for minutes); zero linger discards it."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    async def _handle(self, event: Event) -> bool:
        """`handle_event`, with a readable event that is not a valid one answered by `error`."""
        try:
            return await self.handle_event(event)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            await self._error(InvalidParameter(f"a {event.type} event VoxMux cannot read: "
                                               f"{type(exc).__name__} {exc}"[:300],
                                               param="data", code="invalid_event"))
            return True

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            self._describes += 1
            if self._describes > MAX_DESCRIBES:  # (27 KB each: a flood of them is 1,400x out)
                raise BadEvent(f"more than {MAX_DESCRIBES} describe events on one connection")
            await self.write_event(info(self.service).event())
        elif SynthesizeStart.is_type(event.type):
            await self._start(SynthesizeStart.from_event(event))
        elif SynthesizeChunk.is_type(event.type):
            self._feed(_text(event))
        elif SynthesizeStop.is_type(event.type):
            await self._stop()
        elif Synthesize.is_type(event.type) and not self._streaming:
            _text(event)
            await self._whole(Synthesize.from_event(event))
        return True

    async def _whole(self, request: Synthesize) -> None:
        try:
            model, voice = resolve(self.service, request.voice)
            plan = await self.service.plan(model=model, voice=voice, text=request.text,
                                           client=self.client, input_format=_format(request))
        except VoxMuxError as exc:
            await self._error(exc)
            return
        await self._speak(self.service.speak(plan))

    async def _start(self, request: SynthesizeStart) -> None:
        await self._stop()  # a new stream ends the one before
        self._streaming, self._overflow = True, None
        try:
            model, voice = resolve(self.service, request.voice)
            plan = self.service.plan_stream(model=model, voice=voice, client=self.client)
        except VoxMuxError as exc:
            await self._error(exc)
            await self.write_event(SynthesizeStopped().event())
            return
        self._stream = self.service.speak(plan)
        self._speaking = asyncio.create_task(self._speak(self._stream, stream=True))

    def _feed(self, text: str) -> None:
        job = self._stream
        if job is None or self._overflow is not None or not isinstance(job.plan.text, TextFeed):
            return
        try:
            job.plan.text.feed(text)
        except VoxMuxError as exc:  # too much text waiting: the stream ends with this error
            self._refuse(job, exc)

    def _refuse(self, job: SpeechJob, exc: VoxMuxError) -> None:
        self._overflow = exc
        log.warning("wyoming stream from %s: %s", self.client, exc.message)
        job.cancel()

    async def _stop(self) -> None:
        """End the stream's text; wait until its audio and `synthesize-stopped` are sent."""
        job, speaking, self._stream, self._speaking = self._stream, self._speaking, None, None
        self._streaming = False
        if job is None or speaking is None:
            return
        if isinstance(job.plan.text, TextFeed) and self._overflow is None:
            try:
                job.plan.text.end()
            except VoxMuxError as exc:  # the unfinished tail made it too much
                self._refuse(job, exc)
        await speaking

    async def _speak(self, job: SpeechJob, stream: bool = False) -> None:
        """The job's audio as one `audio-start` ... `audio-stop`, or the error it ended with."""
        started = False
        try:
            async with job:
                async for chunk in _chunks(job.audio()):
                    if not started:
                        await self.write_event(AudioStart(job.sample_rate, WIDTH,
                                                          CHANNELS).event())
                        started = True
                    await self.write_event(AudioChunk(job.sample_rate, WIDTH, CHANNELS,
                                                      to_pcm16(chunk)).event())
            if not started:
                await self.write_event(AudioStart(job.sample_rate, WIDTH, CHANNELS).event())
            await self.write_event(AudioStop().event())
        except VoxMuxError as exc:
            await self._error(self._overflow if stream and self._overflow else exc)
        except (ConnectionError, RuntimeError):  # the client went away while it was sent
            return
        if stream:
            await self.write_event(SynthesizeStopped().event())

    async def _error(self, exc: VoxMuxError) -> None:
        await self.write_event(Error(text=exc.message, code=exc.code or kind_of(exc).code).event())

    async def disconnect(self) -> None:
        """The client is gone: whatever it asked for stops."""
        job, speaking = self._stream, self._speaking
        if job is not None:
            job.cancel()
        if speaking is not None:
            speaking.cancel()
            await asyncio.gather(speaking, return_exceptions=True)


def _text(event: Event) -> str:
    text = event.data.get("text")
    if not isinstance(text, str):
        raise TypeError("'text' must be a string")
    return text


def _format(request: Synthesize) -> str | None:
    fmt = request.text_format
    return str(getattr(fmt, "value", fmt)) if fmt else None


async def _chunks(audio: AsyncIterator[np.ndarray]) -> AsyncIterator[np.ndarray]:
    async for chunk in audio:
        for start in range(0, len(chunk), CHUNK_SAMPLES):
            yield chunk[start:start + CHUNK_SAMPLES]


class Listening:
    """The Wyoming server, and its zeroconf announcement when one was asked for."""

    def __init__(self, server: AsyncTcpServer, announced: Any = None) -> None:
        self.server = server
        self._announced = announced

    async def stop(self) -> None:
        if self._announced is not None:  # unregisters the service (mDNS goodbye)
            await self._announced.async_close()
        await self.server.stop()


async def start_server(service: SpeechService, settings: Settings) -> Listening:
    """Listen for Wyoming clients (stopped with `await listening.stop()`), announced over
    zeroconf as `VOXMUX_WYOMING_ZEROCONF` names it (off by default)."""
    server = AsyncTcpServer(bind_host(settings), settings.wyoming_port)
    places = Places(settings.wyoming_max_connections, settings.wyoming_max_connections_per_client)
    await server.start(functools.partial(WyomingHandler, service, places))
    log.info("Wyoming on %s:%d", server.host, server.port)
    try:
        announced = await _announce(settings) if settings.wyoming_zeroconf else None
    except BaseException:
        await server.stop()
        raise
    return Listening(server, announced)


async def _announce(settings: Settings) -> Any:
    """Register `_wyoming._tcp.local.` (what Home Assistant's discovery looks for) under the
    name set, at the address Wyoming listens on (the outgoing interface's for 0.0.0.0)."""
    try:
        from zeroconf import IPVersion
        from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf
    except ImportError:
        raise RuntimeError("VOXMUX_WYOMING_ZEROCONF needs the zeroconf package: "
                           "pip install 'voxmux[zeroconf]'") from None
    host = bind_host(settings)
    if host in ("", "0.0.0.0"):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("224.0.0.251", 5353))  # no packet is sent: it picks the interface
            host = probe.getsockname()[0]
    if ipaddress.ip_address(host).is_loopback:
        log.warning("Wyoming's zeroconf announcement names %s: only this machine can use it "
                    "(set VOXMUX_WYOMING_HOST)", host)
    name = settings.wyoming_zeroconf
    zeroconf = AsyncZeroconf(ip_version=IPVersion.V4Only)
    await zeroconf.async_register_service(AsyncServiceInfo(
        ZEROCONF_TYPE, f"{name}.{ZEROCONF_TYPE}", addresses=[socket.inet_aton(host)],
        port=settings.wyoming_port))
    log.info("Wyoming announced over zeroconf as %s at %s:%d", name, host,
             settings.wyoming_port)
    return zeroconf
