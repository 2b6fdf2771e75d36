"""Helper processes: the Japanese reader runs out of process, lives while an engine that reads
Japanese is loaded, and a helper that dies, hangs or cannot start fails one call cleanly."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines import ja_reader
from engines.base import LoadFailed, SynthesisFailed, SynthesisRequest
from engines.espeak import EspeakEngine
from engines.frontend import ja, zh
from engines.helper import HelperProcess
from engines.kokoro import KokoroEngine
from engines.onnx import RuntimeOptions
from tests.conftest import CACHE_DIR, LiveServer, decode

READY = 'print(\'{"ready": true}\', flush=True)'


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[HelperProcess]:
    """A Japanese reader of the test's own, in place of the process-wide one."""
    helper = HelperProcess("engines.ja_reader", what="the Japanese reader")
    monkeypatch.setattr(ja, "READER", helper)
    yield helper
    helper.stop()


def test_readings_through_the_helper_match_the_reader_in_process(reader: HelperProcess) -> None:
    texts = ["東京大学", "今日は、いい天気ですね。", ja.normalize("気温は20℃、湿度は50%です。")]
    for text in texts:
        assert ja.phonemes(text) == ja_reader.phonemes(text)
        assert ja.kana(text) == ja_reader.kana(text)
    assert reader.pid is not None and reader.pid != os.getpid()


def test_the_reader_lives_while_an_engine_reading_japanese_is_loaded(
        reader: HelperProcess) -> None:
    kokoro = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
    espeak = EspeakEngine()
    kokoro.load()
    pid = reader.pid
    assert pid is not None and alive(pid), "Kokoro's load starts the reader"
    espeak.load()
    audio = espeak.synthesize(SynthesisRequest(text="東京大学", voice="ja", speed=1.0,
                                               language=None))
    assert len(audio) > espeak.sample_rate // 2
    kokoro.unload()
    assert reader.pid == pid, "eSpeak still holds it"
    espeak.unload()
    assert reader.pid is None and not alive(pid), "the last engine out stops it"
    kokoro.unload()  # a second unload releases nothing twice
    assert reader.holders == 0


def test_espeak_starts_the_reader_only_for_japanese(reader: HelperProcess) -> None:
    espeak = EspeakEngine()
    espeak.load()
    try:
        espeak.synthesize(SynthesisRequest(text="Hello there.", voice="en-us", speed=1.0,
                                           language=None))
        assert reader.pid is None
        espeak.synthesize(SynthesisRequest(text="こんにちは", voice="en-us", speed=1.0,
                                           language=None))
        assert reader.pid is not None
    finally:
        espeak.unload()
    assert reader.pid is None


def test_a_reader_that_died_is_replaced_on_the_next_call(reader: HelperProcess) -> None:
    first = ja.kana("東京")
    pid = reader.pid
    assert pid is not None
    os.kill(pid, 9)
    deadline = time.monotonic() + 10
    while reader.pid is not None and time.monotonic() < deadline:  # the kill lands
        time.sleep(0.01)
    assert ja.kana("東京") == first
    assert reader.pid not in (None, pid)


def test_kokoro_load_fails_cleanly_when_the_reader_cannot_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    broken = HelperProcess("unused", what="the Japanese reader",
                           command=python("raise SystemExit(3)"))
    monkeypatch.setattr(ja, "READER", broken)
    kokoro = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
    with pytest.raises(LoadFailed, match="Japanese reader did not start"):
        kokoro.load()
    assert not kokoro.loaded and broken.holders == 0 and broken.pid is None


def test_a_helper_that_hangs_is_killed_and_the_call_fails() -> None:
    helper = HelperProcess("unused", what="a hanging helper", call_timeout=0.5,
                           command=python(f"import time; {READY}; time.sleep(60)"))
    helper.hold(start=True)
    pid = helper.pid
    assert pid is not None
    with pytest.raises(SynthesisFailed, match=r"no answer within 0\.5 s"):
        helper.call("kana", "x")
    assert helper.pid is None and not alive(pid)
    helper.release()


def test_errors_and_crashes_are_reported_per_call() -> None:
    code = (f"import json, os, sys; {READY}\n"
            "for line in sys.stdin:\n"
            "    text = json.loads(line)['text']\n"
            "    if text == 'crash': os._exit(7)\n"
            "    print(json.dumps({'error': 'bad ' + text} if text == 'bad' else {'ok': text}),"
            " flush=True)\n")
    helper = HelperProcess("unused", what="a test helper", command=python(code))
    assert helper.call("echo", "fine") == "fine"
    with pytest.raises(SynthesisFailed, match="a test helper failed: bad bad"):
        helper.call("echo", "bad")
    with pytest.raises(SynthesisFailed, match="exited with status 7"):
        helper.call("echo", "crash")
    assert helper.pid is None
    assert helper.call("echo", "again") == "again"
    helper.stop()


def test_a_helper_warm_up_error_is_the_start_error() -> None:
    helper = HelperProcess("unused", what="a test helper",
                           command=python('print(\'{"error": "no dictionary"}\', flush=True)'))
    with pytest.raises(SynthesisFailed, match="did not start: no dictionary"):
        helper.hold(start=True)
    assert helper.holders == 0


def test_kokoro_load_that_fails_later_gives_the_reader_back(
        reader: HelperProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(text: str) -> list[str]:
        raise OSError("jieba's dictionary is unreadable")

    monkeypatch.setattr(zh, "words", broken)
    kokoro = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
    with pytest.raises(LoadFailed, match="Chinese dictionary: jieba's dictionary is unreadable"):
        kokoro.load()
    assert not kokoro.loaded and reader.holders == 0 and reader.pid is None


def state(pid: int) -> str | None:
    """The process's state letter (`Z` for a zombie), None once it is gone (reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def zombie_children() -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == os.getpid():
            found.append(int(stat.parent.name))
    return found


def test_a_killed_reader_is_reaped_and_replaced(server: LiveServer) -> None:
    """The server's own reader, killed from outside: it does not stay a zombie, whether or not
    Japanese text comes next, and the next Japanese request is read by a new one."""
    def speak_japanese() -> None:
        with server.client() as http:
            reply = http.post("/v1/audio/speech", json={
                "model": "kokoro", "input": f"東京は{time.monotonic_ns() % 1000}度です。",
                "response_format": "wav"})
        assert reply.status_code == 200, reply.text
        assert decode(reply.content, "wav").duration > 0.5

    speak_japanese()
    for _ in range(2):
        pid = ja.READER.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while state(pid) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state(pid) is None, f"the killed reader {pid} is left as {state(pid)}"
        speak_japanese()
        assert ja.READER.pid not in (None, pid)
        assert state(pid) is None and pid not in zombie_children()
