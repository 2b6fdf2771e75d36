"""hibari through every route a client uses: each format, streamed and whole, over HTTP, SSE and
the WebSockets, cancelled, at other speeds, a user's voice file winning over the OpenAI name of
the same spelling, and heard by Whisper as well as the package's own audio for the same text."""

from __future__ import annotations

import base64
import json
import shutil
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.sync.client import connect

from tests.app.protocols.test_intelligibility import SENTENCES, wer
from tests.conftest import Decoded, LiveServer, decode, start_server, test_settings

RATE = 24_000
TEXT = "Hibari reads English quickly. It has 3 short sentences. This is the last one."


def unique(text: str = TEXT) -> str:
    """A text nobody asked for before, so the audio cache replays nothing."""
    return f"{text} Code {uuid.uuid4().hex[:4]}."


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from hibari.voices import voice_path

    tmp = tmp_path_factory.mktemp("hibari")
    (tmp / "models" / "hibari").mkdir(parents=True)
    # A user's voice file named as an OpenAI voice (the package's British male is `fable`).
    shutil.copy(voice_path("heart", download_missing=False),
                tmp / "models" / "hibari" / "fable.onnx")
    server = start_server(test_settings(tmp, preload=["hibari"], idle_ttl=-1))
    yield server
    server.stop()


def ws_url(live: LiveServer, path: str) -> str:
    return live.url.replace("http://", "ws://", 1) + path


def speech(live: LiveServer, **body: Any) -> httpx.Response:
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={"model": "hibari"} | body)
    assert response.status_code == 200, response.text
    return response


def assert_speech(audio: Decoded, text: str, rate: int = RATE) -> None:
    assert audio.sample_rate == rate
    assert len(text) / 25 < audio.duration < len(text) / 6, audio.duration
    assert audio.rms > 0.01


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_format_decodes_at_its_rate(live: LiveServer, fmt: str) -> None:
    text = unique()
    response = speech(live, input=text, voice="heart", response_format=fmt)
    assert response.headers["x-voxmux-model"] == "hibari"
    audio = decode(response.content, fmt, pcm_rate=int(response.headers["x-sample-rate"]))
    assert_speech(audio, text, 48_000 if fmt == "opus" else RATE)


def test_sse_and_chunked_streams_send_each_segment_as_it_is_made(live: LiveServer) -> None:
    text = unique()
    with live.client() as client, client.stream("POST", "/v1/audio/speech", json={
            "model": "hibari", "input": text, "response_format": "pcm"}) as response:
        assert response.status_code == 200
        chunks = [chunk for chunk in response.iter_raw() if chunk]
    assert int(response.headers["x-voxmux-segments"]) >= 2 and len(chunks) >= 2
    assert_speech(decode(b"".join(chunks), "pcm", RATE), text)
    body = speech(live, input=text, response_format="pcm", stream_format="sse").text
    events = [json.loads(line[6:]) for line in body.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert_speech(decode(pcm, "pcm", RATE), text)


def test_the_whole_file_routes(live: LiveServer) -> None:
    text = unique()
    with live.client() as client:
        synth = client.post("/v1/synth", json={"text": text, "model": "hibari"})
        legacy = client.get("/api/tts", params={"text": text, "model": "hibari"})
        continuous = client.get("/api/tts/stream", params={"text": unique(), "model": "hibari"})
        captioned = client.post("/v1/audio/captioned_speech", json={
            "model": "hibari", "input": text, "stream": False, "response_format": "wav"})
    for response in (synth, legacy, continuous, captioned):
        assert response.status_code == 200, response.text
    assert json.loads(synth.headers["x-voxmux-stats"])["audio_duration_ms"] > 0
    for body in (synth.content, legacy.content, continuous.content):
        assert_speech(decode(body, "wav"), text)
    words = captioned.json()["timestamps"]
    assert [w["word"] for w in words][:4] == ["Hibari", "reads", "English", "quickly"]
    assert next(w for w in words if w["word"] == "3")["end_time"] > words[0]["end_time"]


def test_the_websockets_stream_and_cancel(live: LiveServer) -> None:
    text = unique()
    frames: list[Any] = []
    with connect(ws_url(live, "/ws/v1/tts")) as ws:
        ws.send(json.dumps({"model": "hibari", "voice": "heart", "input": text,
                            "timestamps": "word"}))
        while not frames or not isinstance(frames[-1], dict) or frames[-1]["type"] not in (
                "done", "error", "cancelled"):
            frame = ws.recv()
            frames.append(frame if isinstance(frame, bytes) else json.loads(frame))
    started, done = frames[0], frames[-1]
    assert started["type"] == "started" and started["sample_rate"] == RATE
    assert done["type"] == "done", done
    assert sum(1 for f in frames if isinstance(f, dict) and f["type"] == "words") >= 2
    pcm = b"".join(f for f in frames if isinstance(f, bytes))
    assert_speech(decode(pcm, "pcm", RATE), text)

    # A voice agent: text arrives in pieces, audio per sentence; and one that barges in.
    with connect(ws_url(live, "/ws/v1/tts/text")) as ws:
        ws.send(json.dumps({"model": "hibari"}))
        for piece in ("Tokens arrive ", "one by one. ", "Then the end."):
            ws.send(json.dumps({"text": piece}))
        ws.send(json.dumps({"type": "end"}))
        pcm, last = b"", None
        while last is None or last["type"] not in ("done", "error", "cancelled"):
            frame = ws.recv()
            if isinstance(frame, bytes):
                pcm += frame
            else:
                last = json.loads(frame)
    assert last["type"] == "done", last
    assert decode(pcm, "pcm", RATE).duration > 1.5
    long_text = unique(" ".join([TEXT] * 30))
    with connect(ws_url(live, "/ws/v1/tts")) as ws:
        ws.send(json.dumps({"model": "hibari", "input": long_text}))
        assert json.loads(ws.recv())["type"] == "started"
        ws.send(json.dumps({"type": "cancel"}))
        while True:
            frame = ws.recv()
            if not isinstance(frame, bytes) and json.loads(frame)["type"] != "progress":
                message = json.loads(frame)
                if message["type"] in ("segment", "words"):
                    continue
                break
    assert message["type"] == "cancelled", message
    assert message["audio_ms"] < 30_000  # the text is minutes long


def test_lunavox_stream(live: LiveServer) -> None:
    text = unique()
    with connect(ws_url(live, "/v1/stream")) as ws:
        ws.send(json.dumps({"text": text, "voice": "base", "model": "hibari"}))
        pcm = b""
        while isinstance(frame := ws.recv(), bytes):
            pcm += frame
    last = json.loads(frame)
    assert last["done"] is True and last["sample_rate"] == RATE
    assert_speech(decode(pcm, "pcm", RATE), text)


def test_speed_keeps_the_asked_duration_ratio(live: LiveServer) -> None:
    """Within 5 % of the asked ratio, pauses between sentences included: the graph's own speed
    (made exact from its unrounded durations) up to 2.0, the time-stretch beyond."""
    text = unique()

    def seconds(speed: float) -> float:
        body = speech(live, input=text, response_format="pcm", speed=speed).content
        return decode(body, "pcm", RATE).duration

    normal = seconds(1.0)
    off = {speed: round(normal / seconds(speed) / speed - 1, 3) for speed in (0.6, 1.5, 3.0)}
    assert all(abs(error) <= 0.05 for error in off.values()), off


def test_a_voice_id_wins_over_the_openai_name_of_the_same_spelling(live: LiveServer) -> None:
    with live.client() as client:
        voices = client.get("/v1/audio/voices", params={"model": "hibari"}).json()["data"]
    assert {v["id"] for v in voices} == {"heart", "fable"}
    assert speech(live, input="Hello.", voice="fable").headers["x-voxmux-voice"] == "fable"
    assert speech(live, input="Hello.", voice="alloy").headers["x-voxmux-voice"] == "heart"
    # Other models still map the OpenAI name through their own tables.
    piper = speech(live, model="piper", input="Hello.", voice="fable")
    assert piper.headers["x-voxmux-voice"] == "en_US-joe-medium"


def test_a_voice_that_is_not_installed_says_where_to_put_it(live: LiveServer) -> None:
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={"model": "hibari", "input": "Hello.",
                                                         "voice": "kore"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("voice", "voice_not_found")
    assert "af_kore.int8.onnx" in error["message"] and "models/hibari/" in error["message"]


def test_heard_as_well_as_the_packages_own_audio(live: LiveServer) -> None:
    """The intelligibility sentences (numbers, a time, phone numbers, money), served as 24 kHz
    pcm, against `hibari.Hibari` called on the same sentences in this process."""
    from hibari import Hibari

    raw = Hibari()
    served = [wer(s, decode(speech(live, input=s, response_format="pcm").content, "pcm",
                            RATE).samples, RATE) for s in SENTENCES]
    package = [wer(s, raw(s, seed=0), RATE) for s in SENTENCES]
    report = {"served": [round(x, 2) for x in served], "raw": [round(x, 2) for x in package]}
    assert np.median(served) <= np.median(package) + 0.1, report
    assert np.mean(served) <= np.mean(package) + 0.1 and np.median(served) <= 0.2, report


def test_its_lane_runs_one_call_per_core(live: LiveServer) -> None:
    """A hibari call keeps one core busy (`cores_per_call`): at `VOXMUX_CONCURRENCY=1` its lane
    runs one per core, where a Piper call spreads over every core and runs alone."""
    from engines.base import Capabilities, lane_concurrency
    from engines.onnx import usable_cores

    registry = live.app.state.service.registry
    assert registry["hibari"].lane.concurrency == usable_cores()
    assert registry["piper"].lane.concurrency == 1
    assert lane_concurrency(2, Capabilities(cores_per_call=2), 8) == 8
    assert lane_concurrency(3, Capabilities(cores_per_call=4), 2) == 3


def test_a_stream_starts_with_its_whole_first_sentence(live: LiveServer) -> None:
    """hibari makes a sentence in tens of milliseconds: cutting the first one short for early
    audio would only cost a call (`Capabilities.whole_first_sentence`); Piper's is cut."""
    text = "The morning train left the station exactly on time. Passengers read in silence."
    assert live.segments("hibari", text)[0] == "The morning train left the station exactly on time."
    assert len(live.segments("piper", text)[0]) <= 30
