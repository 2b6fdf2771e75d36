"""Budgets, from a client's side: a request that would cost too much is refused (before any
audio where its input shows it) or ended when its audio reaches the budget, on every route and
protocol, with a 400 `over_budget` naming the budget's setting; a batch whose client has gone
stops rendering."""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize, SynthesizeTextFormat, SynthesizeVoice

from tests.app.protocols.test_websocket import Received, ws_connect
from tests.conftest import LiveServer, decode, free_port, start_server, test_settings

BREAK_FLOOD = "<speak>hi" + '<break time="10s"/>' * 200 + "bye</speak>"
"""3,820 characters that ask for 2,000 s of silence (33 minutes)."""
SILENCE = "VOXMUX_MAX_SSML_SILENCE_SECONDS"
AUDIO = "VOXMUX_MAX_AUDIO_SECONDS"
BUDGET_S = 6
LONG = "Hello there. " + "The 1987 report counted 2468 visitors and 7531 guests. " * 3
"""Few letters (under the budget at the fastest reading) and many seconds of speech (numbers
read out): only rendering shows it is over the budget."""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, int]]:
    port = free_port()
    server = start_server(test_settings(
        tmp_path_factory.mktemp("budgets"), preload=["espeak"], idle_ttl=-1, cache_max_items=0,
        max_audio_seconds=BUDGET_S, batch_max_audio_seconds=5, wyoming_port=port,
        max_request_bytes=200_000))
    yield server, port
    server.stop()


def _over(body: dict[str, Any], setting: str) -> None:
    error = body["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "over_budget", body
    assert setting in error["message"], error["message"]


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


# -- silence asked by SSML: refused before any audio, on every route -------------------------

HTTP_FLOODS: list[tuple[str, str, dict[str, Any]]] = [
    ("speech pcm", "/v1/audio/speech", {"model": "espeak", "input": BREAK_FLOOD,
                                        "response_format": "pcm"}),
    ("speech sse", "/v1/audio/speech", {"model": "espeak", "input": BREAK_FLOOD,
                                        "stream_format": "sse"}),
    ("captioned", "/v1/audio/captioned_speech", {"model": "espeak", "input": BREAK_FLOOD}),
    ("native", "/v1/synth", {"model": "espeak", "input": BREAK_FLOOD}),
    ("elevenlabs", "/elevenlabs/v1/text-to-speech/espeak/with-timestamps"
                   "?output_format=pcm_44100", {"text": BREAK_FLOOD}),
]


@pytest.mark.parametrize(("route", "path", "body"), HTTP_FLOODS, ids=[f[0] for f in HTTP_FLOODS])
def test_a_break_flood_is_refused_at_once(live: tuple[LiveServer, int], route: str, path: str,
                                          body: dict[str, Any]) -> None:
    before = _rss()
    started = time.monotonic()
    with live[0].client() as client:
        response = client.post(path, json=body)
    assert response.status_code == 400, response.text[:300]
    assert time.monotonic() - started < 2
    assert _rss() - before < 100 * 2**20
    if route == "elevenlabs":  # ElevenLabs' own error shape carries the same message
        assert SILENCE in response.text and "over_budget" in response.text
    else:
        _over(response.json(), SILENCE)


def test_a_break_flood_on_the_legacy_get_route_is_refused(live: tuple[LiveServer, int]) -> None:
    with live[0].client() as client:
        response = client.get("/api/tts", params={"text": BREAK_FLOOD, "model": "espeak"})
    assert response.status_code == 400
    _over(response.json(), SILENCE)


def test_each_batch_item_of_a_break_flood_is_refused(live: tuple[LiveServer, int]) -> None:
    items = [{"model": "espeak", "input": BREAK_FLOOD, "response_format": "pcm"}] * 6
    with live[0].client() as client:
        response = client.post("/v1/audio/batch", json={"items": items})
    assert response.status_code == 200
    assert len(response.content) < 10_000  # a manifest of errors, no audio
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        manifest = json.loads(archive.read("manifest.json"))
    assert [entry["file"] for entry in manifest["items"]] == [None] * 6
    for entry in manifest["items"]:
        _over({"error": entry["error"]}, SILENCE)


def test_a_break_flood_over_websocket_and_wyoming_is_an_error(
        live: tuple[LiveServer, int]) -> None:
    with ws_connect(live[0]) as conn:
        conn.send(json.dumps({"model": "espeak", "input": BREAK_FLOOD}))
        got = Received().read(conn)
    assert got.kinds == ["error"], got.kinds
    _over(got.frames[0], SILENCE)

    async def wyoming() -> Error:
        async with AsyncTcpClient("127.0.0.1", live[1]) as client:
            await client.write_event(Synthesize(
                text=BREAK_FLOOD, voice=SynthesizeVoice(name="espeak"),
                text_format=SynthesizeTextFormat.SSML).event())
            event = await asyncio.wait_for(client.read_event(), 10)
            assert event is not None and Error.is_type(event.type), event
            return Error.from_event(event)

    error = asyncio.run(wyoming())
    assert error.code == "over_budget" and SILENCE in error.text


# -- audio made: a request ends when it reaches the budget -------------------------------------

def test_more_letters_than_the_budget_can_hold_are_refused_up_front(
        live: tuple[LiveServer, int]) -> None:
    text = "Words and more words. " * 20  # 340 letters: at least 8.5 s at the fastest reading
    with live[0].client() as client:
        response = client.post("/v1/audio/speech", json={"model": "espeak", "input": text})
    assert response.status_code == 400
    _over(response.json(), AUDIO)
    assert "at least" in response.json()["error"]["message"]


def test_a_whole_file_over_the_budget_is_a_400(live: tuple[LiveServer, int]) -> None:
    with live[0].client() as client:
        response = client.post("/v1/synth", json={"model": "espeak", "input": LONG})
        shorter = client.post("/v1/synth", json={"model": "espeak", "input": "Hello there."})
    assert response.status_code == 400
    _over(response.json(), AUDIO)
    assert shorter.status_code == 200  # a request within it is served as ever
    assert decode(shorter.content, "wav").duration < BUDGET_S


def test_a_stream_ends_with_the_budgets_error_when_it_reaches_it(
        live: tuple[LiveServer, int]) -> None:
    body = {"model": "espeak", "input": LONG, "response_format": "pcm"}
    with live[0].client() as client:
        events = []
        with client.stream("POST", "/v1/audio/speech",
                           json={**body, "stream_format": "sse"}) as response:
            assert response.status_code == 200
            events = [json.loads(line[6:]) for line in response.iter_lines()
                      if line.startswith("data: ")]
        # A raw audio stream cannot carry an error: it stops unterminated, never looks whole.
        received = b""
        with pytest.raises(httpx.RemoteProtocolError), client.stream(
                "POST", "/v1/audio/speech", json=body) as response:
            assert response.status_code == 200
            for data in response.iter_bytes():
                received += data
    assert events[0]["type"] == "speech.audio.delta" and events[-1]["type"] == "error"
    _over(events[-1], AUDIO)
    rate = 24_000
    assert 0.3 < len(received) / 2 / rate <= BUDGET_S


def test_a_text_in_session_ends_when_its_audio_reaches_the_budget(
        live: tuple[LiveServer, int]) -> None:
    with ws_connect(live[0], "/ws/v1/tts/text") as conn:
        conn.send(json.dumps({"model": "espeak"}))
        for _ in range(4):
            conn.send(json.dumps({"text": "The 1987 report counted 2468 visitors and 7531 "
                                          "guests. "}))
        conn.send(json.dumps({"type": "end"}))
        got = Received().read(conn)
    assert got.kinds[-1] == "error", got.kinds
    _over(got.last, AUDIO)
    assert len(got.audio) / 2 / 22_050 <= BUDGET_S


def test_wyoming_ends_with_the_budgets_error(live: tuple[LiveServer, int]) -> None:
    async def synthesize() -> list[Any]:
        events = []
        async with AsyncTcpClient("127.0.0.1", live[1]) as client:
            await client.write_event(Synthesize(text=LONG,
                                                voice=SynthesizeVoice(name="espeak")).event())
            while True:
                event = await asyncio.wait_for(client.read_event(), 30)
                assert event is not None
                events.append(event)
                if Error.is_type(event.type) or event.type == "audio-stop":
                    return events

    events = asyncio.run(synthesize())
    assert Error.is_type(events[-1].type), [e.type for e in events]
    error = Error.from_event(events[-1])
    assert error.code == "over_budget" and AUDIO in error.text


# -- batches -------------------------------------------------------------------------------------

def test_a_batch_stops_at_its_audio_budget(live: tuple[LiveServer, int]) -> None:
    item = {"model": "espeak", "input": "Good morning to every one of you.",
            "response_format": "wav"}
    with live[0].client() as client:
        response = client.post("/v1/audio/batch", json={"items": [item] * 5})
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
        manifest = json.loads(archive.read("manifest.json"))["items"]
        spoken = [decode(archive.read(e["file"]), "wav").duration for e in manifest
                  if e["file"]]
    refused = [e for e in manifest if e["error"]]
    assert spoken and refused and len(spoken) + len(refused) == 5
    assert sum(spoken) <= 5
    assert manifest.index(refused[0]) == len(spoken)  # in order: the ones past it
    for entry in refused:
        _over({"error": entry["error"]}, "VOXMUX_BATCH_MAX_AUDIO_SECONDS")


def test_a_batch_whose_client_hung_up_stops_rendering(tmp_path: Any) -> None:
    live = start_server(test_settings(tmp_path, preload=["piper"], idle_ttl=-1,
                                      cache_max_items=0))
    try:
        request_id = f"gone-{uuid.uuid4().hex[:8]}"
        text = ("The morning train left the station exactly on time, and passengers read "
                "their papers in comfortable silence as the fields went by. ")
        items = [{"model": "piper", "input": f"{n}. {text * 2}", "response_format": "wav"}
                 for n in range(8)]
        with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=live.url,
                                                            timeout=1.0) as client:
            client.post("/v1/audio/batch", json={"items": items},
                        headers={"X-Request-ID": request_id})
        service = live.app.state.service
        deadline = time.monotonic() + 10
        while any(j.plan.request_id.startswith(request_id) for j in service.running()):
            assert time.monotonic() < deadline, "the batch went on rendering"
            time.sleep(0.05)
        time.sleep(1.0)  # nothing starts after the hang-up
        with live.client() as client:
            records = [r for r in client.get("/requests").json()["data"]
                       if r["id"].startswith(request_id)]
        assert 1 <= len(records) < len(items), [r["status"] for r in records]
        assert records[0]["status"] == "cancelled", records[0]
    finally:
        live.stop()


def test_a_voice_of_twenty_thousand_blend_parts_is_refused(
        live: tuple[LiveServer, int]) -> None:
    """100,000 parts held the loop 8 s while each was checked, and were echoed in a 900 KB
    header; 5,000 in a 45 KB one."""
    with live[0].client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": "kokoro", "input": "こんにちは。", "voice": "+".join(["jf_alpha"] * 20_000)})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "voice"
    assert len(response.headers.get("x-voxmux-voice", "")) <= 200
