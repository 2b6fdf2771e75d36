"""Routes that answer with one file (`/v1/synth`, `/api/tts`, captioned speech without `stream`)
make their clip in as few engine calls as the engine's limit allows: nothing plays before the
whole clip is there, so no segment is kept short for early audio. The streamed routes keep it."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from engines.base import SynthesisRequest
from tests.conftest import LiveServer, decode
from tests.hearing import hear, word_error_rate

SENTENCES = (
    "The morning train left the station exactly on time. Passengers read their papers in "
    "comfortable silence. Outside, the wide fields were covered in a thin frost. A conductor "
    "walked slowly down the narrow aisle. He checked every single ticket with great care."
)


def text() -> str:
    """The five sentences and a sixth nobody asked for before (the cache replays nothing)."""
    return f"{SENTENCES} It was number {uuid.uuid4().int % 90 + 10}."


def post(server: LiveServer, method: str, path: str, **kwargs: Any) -> tuple[int, bytes]:
    with server.client() as http:
        response = http.request(method, path, **kwargs)
    assert response.status_code == 200, response.text
    return int(response.headers["x-voxmux-segments"]), response.content


@pytest.mark.parametrize("route", ["synth", "legacy", "captioned"])
def test_a_whole_file_route_packs_its_text_into_one_call(server: LiveServer, route: str) -> None:
    said = text()
    segments, body = {
        "synth": lambda: post(server, "POST", "/v1/synth",
                              json={"text": said, "model": "piper"}),
        "legacy": lambda: post(server, "GET", "/api/tts",
                               params={"text": said, "model": "piper"}),
        "captioned": lambda: post(server, "POST", "/v1/audio/captioned_speech",
                                  json={"input": said, "model": "piper",
                                        "response_format": "wav", "stream": False}),
    }[route]()
    assert len(said) < 400  # Piper's limit: the whole text fits one call
    assert segments == 1
    if route == "captioned":
        return  # JSON around base64 audio; its audio is checked in test_timestamps
    audio = decode(body, "wav")
    engine = server.app.state.service.registry["piper"].engine
    # Piper samples its durations, so each render is heard a little differently (twelve renders
    # of this text here: WER 0.02 to 0.11): the worse of two raw renders is the reference.
    raw_wer = max(word_error_rate(said, hear(engine.synthesize(SynthesisRequest(
        text=said, voice=engine.default_voice)), engine.sample_rate).text) for _ in range(2))
    assert word_error_rate(said, hear(audio.samples, audio.sample_rate).text) <= raw_wer + 0.1


def test_the_streamed_routes_keep_a_short_first_segment(server: LiveServer) -> None:
    said = text()
    speech, _ = post(server, "POST", "/v1/audio/speech",
                     json={"input": said, "model": "piper", "response_format": "pcm"})
    stream, _ = post(server, "GET", "/api/tts/stream", params={"text": said, "model": "piper"})
    assert speech == stream >= 3  # "The morning train left" first, then packed
