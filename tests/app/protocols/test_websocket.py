"""`WS /ws/v1/tts` and `WS /ws/v1/tts/text` through a real `websockets` client and real engines."""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.conftest import LiveServer, decode, start_server, test_settings

PIPER_RATE = 22050
THREE = "The quick brown fox jumps over the lazy dog. It was a sunny day. Birds sang in the trees."


def ws_connect(server: LiveServer, path: str = "/ws/v1/tts") -> ClientConnection:
    return connect(server.url.replace("http://", "ws://", 1) + path, proxy=None, open_timeout=30)


def long_text(sentences: int) -> str:
    """Distinct sentences (a fresh word each run), so no earlier result is replayed from cache."""
    tag = uuid.uuid4().hex[:6]
    return " ".join(
        f"Sentence {i} of the long story about {tag} goes on for a little while."
        for i in range(sentences)
    )


@dataclass
class Received:
    """Everything a client saw, in order: JSON frames, audio bytes, the close code."""

    kinds: list[str] = field(default_factory=list)
    """`bin` for a binary frame, else the JSON frame's type."""
    frames: list[dict[str, Any]] = field(default_factory=list)
    binary: list[bytes] = field(default_factory=list)
    audio: bytes = b""
    close_code: int | None = None

    def add(self, message: str | bytes) -> None:
        if isinstance(message, bytes):
            self.kinds.append("bin")
            self.binary.append(message)
            self.audio += message
            return
        frame = json.loads(message)
        self.kinds.append(frame["type"])
        self.frames.append(frame)
        if frame["type"] == "audio":
            self.audio += base64.b64decode(frame["audio"])

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == kind]

    @property
    def last(self) -> dict[str, Any]:
        return self.frames[-1]

    def read(self, conn: ClientConnection,
             until: Callable[[Received], bool] = lambda _: False) -> Received:
        """Receive until `until` holds or the server closes."""
        try:
            while not until(self):
                self.add(conn.recv(timeout=60))
        except ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd else None
        return self


def session(server: LiveServer, request: dict[str, Any] | str | bytes,
            path: str = "/ws/v1/tts") -> Received:
    with ws_connect(server, path) as conn:
        conn.send(request if isinstance(request, str | bytes) else json.dumps(request))
        return Received().read(conn)


def refcount(server: LiveServer, model: str) -> int:
    return server.app.state.service.registry.status()[model].refcount


def wait_idle(server: LiveServer, model: str, request_id: str) -> None:
    """The lease is released and the request gone from the active set, within a few seconds."""
    deadline = time.monotonic() + 5
    service = server.app.state.service
    while refcount(server, model) or request_id in {j.plan.request_id for j in service.running()}:
        assert time.monotonic() < deadline, "the engine lease was not released"
        time.sleep(0.02)


def assert_speech(audio: bytes, text: str) -> None:
    decoded = decode(audio, "pcm", pcm_rate=PIPER_RATE)
    assert len(text) / 25 < decoded.duration < len(text) / 6, decoded.duration
    assert decoded.rms > 0.01


# -- /ws/v1/tts ------------------------------------------------------------------------------


def test_frames_arrive_in_order_and_decode_to_speech(server: LiveServer) -> None:
    got = session(server, {"model": "piper", "input": THREE, "voice": "alloy"})

    started = got.frames[0]
    assert got.kinds[0] == "started" and got.kinds[-1] == "done"
    assert started["sample_rate"] == PIPER_RATE and started["channels"] == 1
    planned = server.segments("piper", THREE)
    assert started["format"] == "pcm_s16le" and started["segments"] == len(planned) >= 2
    assert started["request_id"] and started["model"] == "piper"
    kinds = [k for k in got.kinds if k != "progress"]  # keepalives may come on a busy machine
    assert set(kinds) == {"started", "bin", "segment", "done"}
    # Each segment frame follows that segment's audio, and segments come in order.
    body = kinds[1:-1]
    assert body[0] == "bin" and body[-1] == "segment"
    assert all(body[i - 1] == "bin" for i, k in enumerate(body) if k == "segment")
    segments = got.of("segment")
    assert [s["index"] for s in segments] == list(range(len(planned)))
    assert [s["text"] for s in segments] == planned and " ".join(planned) == THREE
    assert all(len(frame) % 2 == 0 for frame in got.binary)
    assert sum(s["samples"] for s in segments) * 2 == len(got.audio)

    assert_speech(got.audio, THREE)
    stats = got.last["stats"]
    assert stats["segments"] == len(planned) and stats["ttfb_ms"] > 0 and stats["rtf"] > 0
    assert stats["audio_duration_ms"] == pytest.approx(len(got.audio) / 2 / PIPER_RATE * 1000, 1)
    assert got.close_code == 1000


def test_wav_format_sends_a_streaming_header_first(server: LiveServer) -> None:
    got = session(server, {"model": "piper", "text": "Hello from the wave format.",
                           "format": "wav"})
    assert got.kinds[:2] == ["started", "bin"] and got.frames[0]["format"] == "wav"
    header = got.binary[0]
    assert len(header) == 44 and header[:4] == b"RIFF" and header[8:12] == b"WAVE"
    decoded = decode(got.audio, "wav")
    assert decoded.sample_rate == PIPER_RATE and decoded.rms > 0.01
    assert decoded.duration == pytest.approx((len(got.audio) - 44) / 2 / PIPER_RATE, abs=0.01)


def test_base64_frames_carry_the_same_audio(server: LiveServer) -> None:
    request = {"model": "espeak", "input": "Base sixty four frames. For browsers.",
               "voice": {"id": "en-us"}}
    raw = session(server, request)
    text_only = session(server, {**request, "binary": False})
    assert "bin" not in text_only.kinds
    assert text_only.kinds[0] == "started" and text_only.kinds[-1] == "done"
    assert len(text_only.of("audio")) >= 2
    assert text_only.audio == raw.audio
    assert decode(text_only.audio, "pcm", pcm_rate=22050).rms > 0.01


@pytest.mark.parametrize(
    ("request_", "code", "param"),
    [
        ({"model": "piper", "input": "Hi there.", "voice": "nobody"}, "voice_not_found", "voice"),
        ({"model": "no-such-model", "input": "Hi there."}, "model_not_found", "model"),
        ({"model": "piper", "input": "Hi there.", "stream": True}, "extra_forbidden", "stream"),
        ({"model": "piper", "input": "Hi there.", "speed": 9}, None, "speed"),
        ({"model": "piper", "input": "Hi there.", "format": "mp3"}, None, "format"),
        ({"model": "piper", "input": "!!!"}, None, "input"),
    ],
)
def test_invalid_request_gets_an_error_frame(
    server: LiveServer, request_: dict[str, Any], code: str | None, param: str | None
) -> None:
    got = session(server, request_)
    assert got.kinds == ["error"]
    error = got.last["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    if code:
        assert error["code"] == code
    assert got.close_code == 1000


@pytest.mark.parametrize(
    ("message", "close_code", "code"),
    [
        ("{not json", 1003, "invalid_json"),
        ("[1, 2]", 1003, "invalid_json"),
        (b'{"model": "piper", "input": "binary"}', 1003, "invalid_json"),
        (json.dumps({"model": "piper", "input": "x" * 70_000}), 1009, "message_too_large"),
    ],
)
def test_protocol_violation_closes_with_its_code(
    server: LiveServer, message: str | bytes, close_code: int, code: str
) -> None:
    got = session(server, message)
    assert got.kinds == ["error"] and got.last["error"]["code"] == code
    assert got.close_code == close_code


def test_cancel_mid_stream_stops_and_frees_the_lease(server: LiveServer) -> None:
    text = long_text(50)
    with ws_connect(server) as conn:
        conn.send(json.dumps({"model": "piper", "input": text}))
        got = Received().read(conn, lambda r: bool(r.of("segment")))
        conn.send(json.dumps({"type": "cancel"}))
        got.read(conn)
    planned = got.frames[0]["segments"]
    assert planned >= 8  # 50 sentences, packed after the first
    assert got.last is not None and got.last["type"] == "cancelled" and got.close_code == 1000
    assert 1 <= len(got.of("segment")) < planned / 2
    wait_idle(server, "piper", got.frames[0]["request_id"])


def test_disconnect_mid_stream_frees_the_lease(server: LiveServer) -> None:
    with ws_connect(server) as conn:
        conn.send(json.dumps({"model": "piper", "input": long_text(50)}))
        got = Received().read(conn, lambda r: "bin" in r.kinds)
        assert refcount(server, "piper") == 1
    wait_idle(server, "piper", got.frames[0]["request_id"])


def test_http_cancel_ends_a_websocket_request(server: LiveServer) -> None:
    with ws_connect(server) as conn, server.client() as http:
        conn.send(json.dumps({"model": "piper", "input": long_text(50)}))
        got = Received().read(conn, lambda r: "bin" in r.kinds)
        request_id = got.frames[0]["request_id"]
        assert http.post(f"/v1/audio/requests/{request_id}/cancel").status_code == 200
        got.read(conn)
    assert got.last is not None and got.last["type"] == "cancelled"
    wait_idle(server, "piper", request_id)


# -- /ws/v1/tts/text -------------------------------------------------------------------------


def tokens(text: str, size: int = 3) -> Iterator[str]:
    """LLM-like fragments: a few characters each, cut anywhere."""
    for start in range(0, len(text), size):
        yield text[start : start + size]


def text_session(server: LiveServer, fragments: list[dict[str, Any]],
                 options: dict[str, Any] | None = None) -> Received:
    with ws_connect(server, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps(options or {"model": "piper"}))
        for fragment in fragments:
            conn.send(json.dumps(fragment))
        return Received().read(conn)


def test_fragments_become_three_sentences_in_order(server: LiveServer) -> None:
    text = "Hi. How are you today? I am fine, thanks."
    got = text_session(server, [{"text": t} for t in tokens(text)] + [{"type": "end"}])

    assert got.kinds[0] == "started" and got.kinds[-1] == "done"
    assert got.frames[0]["sample_rate"] == PIPER_RATE
    segments = got.of("segment")
    assert [s["text"] for s in segments] == ["Hi.", "How are you today?", "I am fine, thanks."]
    assert [s["index"] for s in segments] == [0, 1, 2]
    assert sum(s["samples"] for s in segments) * 2 == len(got.audio)
    assert_speech(got.audio, text)
    done = got.last
    assert done["sentences"] == 3 and done["stats"]["segments"] == 3
    assert done["stats"]["audio_duration_ms"] == pytest.approx(
        len(got.audio) / 2 / PIPER_RATE * 1000, 1)
    assert done["stats"]["ttfb_ms"] > 0 and done["stats"]["rtf"] > 0
    assert got.close_code == 1000


def test_flush_forces_out_an_unfinished_sentence(server: LiveServer) -> None:
    with ws_connect(server, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "piper", "format": "wav"}))
        for piece in tokens("Hold on a moment"):
            conn.send(json.dumps({"text": piece}))
        conn.send(json.dumps({"type": "flush"}))
        got = Received().read(conn, lambda r: bool(r.of("segment")))
        assert got.of("segment")[0]["text"] == "Hold on a moment"
        conn.send(json.dumps({"text": " Done now.", "type": "end"}))
        got.read(conn)
    assert [s["text"] for s in got.of("segment")] == ["Hold on a moment", "Done now."]
    assert got.binary[0][:4] == b"RIFF" and decode(got.audio, "wav").rms > 0.01


def test_text_is_read_while_sentences_are_synthesized(server: LiveServer) -> None:
    sentences = [f"This is sentence number {i}, spoken while more text streams in." for i in
                 range(8)]
    with ws_connect(server, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "piper"}))
        for piece in tokens(" ".join(sentences), 4):
            conn.send(json.dumps({"text": piece}))
        conn.send(json.dumps({"type": "end"}))
        got = Received().read(conn)  # nothing read until every fragment is sent
    # The first sentence is cut at its comma (a short first segment), the others come whole.
    first, rest = sentences[0].split(", ")
    assert [s["text"] for s in got.of("segment")] == [first + ",", rest, *sentences[1:]]
    assert got.last["sentences"] == 9


def test_text_cancel_is_seen_during_synthesis(server: LiveServer) -> None:
    sentences = long_text(12).split(". ")
    with ws_connect(server, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "piper"}))
        for sentence in sentences:
            conn.send(json.dumps({"text": sentence + ". "}))
        got = Received().read(conn, lambda r: bool(r.of("segment")))
        conn.send(json.dumps({"type": "cancel"}))
        got.read(conn)
    assert got.last is not None and got.last["type"] == "cancelled" and got.close_code == 1000
    assert 1 <= len(got.of("segment")) < len(sentences) / 2
    wait_idle(server, "piper", got.frames[0]["request_id"])


def test_nothing_speakable_is_merged_or_skipped(server: LiveServer) -> None:
    got = text_session(server, [{"text": "..."}, {"type": "flush"}, {"text": "Okay then."},
                                {"text": " 🙂 "}, {"type": "end"}])
    assert [s["text"] for s in got.of("segment")] == ["... Okay then."]
    assert got.kinds[-1] == "done" and got.last["sentences"] == 1


def test_text_options_are_checked_before_started(server: LiveServer) -> None:
    got = text_session(server, [], {"model": "piper", "voice": "nobody"})
    assert got.kinds == ["error"] and got.last["error"]["code"] == "voice_not_found"
    got = text_session(server, [], {"model": "piper", "text": "Options carry no text."})
    assert got.kinds == ["error"] and got.last["error"]["param"] == "text"


@pytest.mark.parametrize(
    ("message", "close_code", "code"),
    [("{oops", 1003, "invalid_json"), ('{"type": "pause"}', 1000, "literal_error")],
)
def test_bad_fragment_ends_the_text_session(
    server: LiveServer, message: str, close_code: int, code: str
) -> None:
    with ws_connect(server, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "piper"}))
        conn.send(json.dumps({"text": "Fine so far. "}))
        conn.send(message)
        got = Received().read(conn)
    assert got.kinds[0] == "started" and got.kinds[-1] == "error"
    assert got.last["error"]["code"] == code and got.close_code == close_code


def test_text_client_disconnect_frees_the_lease(server: LiveServer) -> None:
    with ws_connect(server, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "piper"}))
        conn.send(json.dumps({"text": long_text(10)}))
        got = Received().read(conn, lambda r: "bin" in r.kinds)
    wait_idle(server, "piper", got.frames[0]["request_id"])


# -- limits, on a server of their own ----------------------------------------------------------


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    settings = test_settings(
        Path(tmp_path_factory.mktemp("ws-limits")), preload=[], ws_max_connections=1,
        ws_first_message_timeout=0.5, ws_keepalive=0.1,
    )
    live = start_server(settings)
    yield live
    live.stop()


def test_silent_client_is_closed_after_the_first_message_timeout(strict: LiveServer) -> None:
    with ws_connect(strict) as conn:
        got = Received().read(conn)
    assert got.kinds == ["error"] and got.last["error"]["code"] == "timeout"
    assert got.close_code == 1008


def test_idle_text_session_sends_progress_keepalives(strict: LiveServer) -> None:
    with ws_connect(strict, "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "espeak"}))
        time.sleep(0.5)
        conn.send(json.dumps({"type": "end"}))
        got = Received().read(conn)
    assert got.kinds[0] == "started" and got.kinds[-1] == "done"
    assert set(got.kinds[1:-1]) == {"progress"}
    assert got.of("progress")[0]["segments_done"] == 0
    assert got.last["sentences"] == 0 and got.last["stats"]["audio_duration_ms"] == 0


def test_connection_over_the_limit_is_closed_with_1013(strict: LiveServer) -> None:
    with ws_connect(strict, "/ws/v1/tts/text") as first:
        first.send(json.dumps({"model": "espeak"}))
        Received().read(first, lambda r: "started" in r.kinds)
        with ws_connect(strict) as second:
            refused = Received().read(second)
        first.send(json.dumps({"text": "Still served.", "type": "end"}))
        served = Received().read(first)
    assert refused.kinds == ["error"] and refused.close_code == 1013
    assert refused.last["error"]["code"] == "too_many_connections"
    assert served.kinds[-1] == "done" and served.last["sentences"] == 1
    assert np.frombuffer(served.audio, "<i2").any()
