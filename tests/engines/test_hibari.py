"""hibari in-process: its voices (the wheel's and a user's files, never a download), audio that is
the package's own sample for sample on VoxMux's reading of the text, the graph's frame counts as
timings, speed, the front end."""

from __future__ import annotations

import shutil
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from app.audio.dsp import KEEP_MS, voiced_span
from engines.base import InvalidParameter, SynthesisRequest, VoiceNotFound
from engines.frontend import en
from engines.hibari import DURATION_UNIT, DURATIONS, HOP, SEED, HibariEngine, Reader
from engines.onnx import RuntimeOptions
from tests.conftest import CACHE_DIR
from tests.engines.test_frontend_en import ALL_NUMERALS

SENTENCES = ("The quick brown fox jumps over the lazy dog, and 42 birds sing.",
             "Call 555-123-4567 at 10:05 pm. It weighs 12kg and costs $3.50, said Dr. Smith.")


def heart_file() -> Path:
    from hibari.voices import voice_path

    return Path(voice_path("heart", download_missing=False))


@pytest.fixture(scope="module")
def hibari() -> Iterator[HibariEngine]:
    engine = HibariEngine(None, RuntimeOptions(), CACHE_DIR)
    engine.load()
    yield engine
    engine.unload()


def _package_g2p_without_its_normalizer(british: bool = False) -> Any:
    """The package's G2P that reads its text as given: VoxMux's front end has read it."""
    from hibari.g2p import G2P

    g2p = G2P(british=british)
    return lambda text: g2p(text, normalize_text=False)


def test_its_audio_is_the_packages_own_sample_for_sample(hibari: HibariEngine) -> None:
    """VoxMux's English front end, then the package's G2P, graph and DSP as `hibari.Hibari` runs
    them (one onnxruntime thread, the package's default and the engine's), the same seed: the
    same samples, sentence by sentence."""
    from hibari import Hibari

    raw = Hibari(threads=1, g2p=_package_g2p_without_its_normalizer())
    for text in SENTENCES:
        chunks = list(hibari.stream(SynthesisRequest(text=text, voice="heart")))
        expected = list(raw.stream(en.normalize(text), seed=SEED))
        assert len(chunks) == len(expected)
        for ours, theirs in zip(chunks, expected, strict=True):
            assert np.array_equal(ours, theirs)


@pytest.mark.parametrize("text", [
    "Please call 800-555-0199.", "Write to jane.doe@example.com today.",
    "Read www.example.org/docs first.", "It is 10:05:30 and 5° on Henry VIII's 3½ acres.",
])
def test_it_reads_english_through_voxmuxs_front_end(text: str) -> None:
    """hibari reads what piper and kokoro read (`engines.frontend.en`), not its package's own
    normalization ("eight hundred five hundred fifty five ..." for a phone number, "jane doe at
    examplecom" for an address); then the package's G2P makes its phonemes."""
    reading = Reader(british=False).read(text, timings=True)
    phonemes = " ".join(chunk.phonemes for chunk in reading.chunks)
    assert phonemes == _package_g2p_without_its_normalizer()(en.normalize(text))


def test_no_unicode_numeral_fails_the_reader() -> None:
    """The package's G2P raised on `⑴` and on `¹:00` (a 500 for the client); VoxMux's front end
    reads every numeral before it."""
    reader = Reader(british=False)
    for template in ("{c}", "{c}:00", "x{c} 4{c}."):
        for c in ALL_NUMERALS:
            for timings in (False, True):
                reading = reader.read(template.format(c=c), timings)
                assert reading.chunks, (template, c)


def test_the_timed_graph_speaks_the_same_samples_and_its_frames_are_the_audio(
        hibari: HibariEngine) -> None:
    voice = hibari._voices["heart"]
    assert voice.timed and CACHE_DIR in Path(voice.session._model_path).parents
    reading = hibari._readers[False].read(SENTENCES[0], timings=False)
    vocab = __import__("engines.hibari", fromlist=["_vocab"])._vocab()
    ids = [0, *(vocab[c] for c in reading.chunks[0].phonemes if c in vocab), 0]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    for speed in (1.0, 0.7):
        feeds = {"ids": np.array([ids], np.int64), "speed": np.array([speed], np.float32)}
        original = ort.InferenceSession(str(heart_file()), options).run(None, feeds)
        timed = ort.InferenceSession(voice.session._model_path, options)
        outputs = timed.run(None, feeds)
        assert timed.get_outputs()[6].name == DURATIONS
        assert all(np.array_equal(a, b) for a, b in zip(original, outputs[:6], strict=True))
        frames = outputs[6].reshape(-1)
        assert frames.size == len(ids)
        assert int(frames.sum()) * DURATION_UNIT == outputs[0].shape[-1] * HOP
    timed_audio = [c.audio for c in hibari.stream_timed(
        SynthesisRequest(text=SENTENCES[1], voice="heart", timings=True))]
    plain = list(hibari.stream(SynthesisRequest(text=SENTENCES[1], voice="heart")))
    assert all(np.array_equal(a, b) for a, b in zip(timed_audio, plain, strict=True))
    assert all(a.size % HOP == 0 for a in plain)


def test_words_keep_the_spans_the_front_end_rewrote(hibari: HibariEngine) -> None:
    text = SENTENCES[1]
    chunks = list(hibari.stream_timed(SynthesisRequest(text=text, voice="heart",
                                                       timings=True)))
    words = [w for c in chunks for w in c.words]
    # A rule's whole match is one word: the phone number's ten digits, the time with its "pm".
    assert [w.word for w in words] == ["Call", "555-123-4567", "at", "10:05 pm", "It",
                                       "weighs", "12kg", "and", "costs", "$3.50", "said", "Dr.",
                                       "Smith"]
    assert all(text[w.char_start:w.char_end] == w.word for w in words)
    phone = words[1]
    assert phone.end - phone.start > 2.0  # ten digits, read one by one


def test_it_keeps_the_asked_tempo_from_half_to_double(hibari: HibariEngine) -> None:
    """The graph rounds every phoneme to whole 25 ms units: its own speed input came out 5 % fast
    at 0.9 and 9 % slow at 2.0; the speed found from its unrounded durations is within 3 %."""
    assert hibari.capabilities.speed_range == (0.5, 2.0)
    texts = ("A small boat drifted across the quiet lake while the sun went down behind the hills.",
             "Please remember to bring your notes, a pencil and something to drink later.")

    def samples(speed: float) -> int:
        """The speech between the silences at either end, as VoxMux trims it."""
        total = 0
        for text in texts:
            audio = hibari.synthesize(SynthesisRequest(text, "heart", speed=speed))
            start, end = voiced_span(audio, hibari.sample_rate, keep_ms=KEEP_MS / speed)
            total += end - start
        return total

    normal = samples(1.0)
    off = {speed: round(normal / samples(speed) / speed - 1, 3)
           for speed in (0.5, 0.8, 0.9, 1.25, 1.5, 2.0)}
    assert all(abs(error) <= 0.03 for error in off.values()), off


def test_user_voices_by_name_and_by_the_packages_file_name(tmp_path: Path) -> None:
    shutil.copy(heart_file(), tmp_path / "fable.onnx")  # a user's own file named fable
    shutil.copy(heart_file(), tmp_path / "bf_emma.int8.onnx")  # the package's name for emma
    (tmp_path / "broken.onnx").write_bytes(b"not a model")
    engine = HibariEngine(tmp_path, RuntimeOptions(), CACHE_DIR)
    voices = {v.id: v for v in engine.voices()}
    assert set(voices) == {"heart", "fable", "emma", "broken"}
    assert (voices["emma"].language, voices["emma"].gender) == ("en-gb", "female")
    assert voices["fable"].language == "en-gb"  # the package's fable is British
    engine.load()
    try:
        assert "broken.onnx" in engine.voice_errors and "broken" not in {
            v.id for v in engine.voices()}
        emma = engine.synthesize(SynthesisRequest(text="I like tomatoes.", voice="emma"))
        assert emma.size > 0.5 * 24_000
        assert engine.fingerprint("fable") != engine.fingerprint("heart")  # another voice
        assert engine.fingerprint("emma") != engine.fingerprint("fable")  # British reading
        (tmp_path / "fable.onnx").unlink()
        changes = engine.rescan()
        assert changes.removed == ("fable",)
    finally:
        engine.unload()


def test_a_voice_not_on_disk_names_where_to_put_it_and_nothing_is_downloaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("hibari tried the network")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("HIBARI_HOME", str(tmp_path / "package-cache"))
    engine = HibariEngine(tmp_path / "models", RuntimeOptions(), CACHE_DIR)
    engine.load()
    try:
        for name, file in (("kore", "af_kore.int8.onnx"), ("fenrir", "am_fenrir_v2.int8.onnx")):
            with pytest.raises(VoiceNotFound, match=f"{file}.*models/hibari/") as caught:
                engine.validate(SynthesisRequest(text="Hello.", voice=name))
            assert "never downloads" in str(caught.value)
        with pytest.raises(VoiceNotFound, match=r"nobody\.onnx"):
            engine.validate(SynthesisRequest(text="Hello.", voice="nobody"))
        with pytest.raises(InvalidParameter, match="English"):
            engine.validate(SynthesisRequest(text="Hello.", voice="heart", language="ja"))
        assert engine.synthesize(SynthesisRequest(text="Still here.", voice="heart")).size
    finally:
        engine.unload()
    assert not (tmp_path / "package-cache").exists()


def test_a_clients_ipa_reaches_the_model_in_misakis_symbols() -> None:
    """`[word](/ipa/)` written the eSpeak way (`ː`, `oʊ`) and with the stress mark where
    dictionaries put it (before the syllable) is read in misaki's symbols and convention
    (stress before the vowel), the set hibari's voices were trained on (the package passes the
    link's text through as it is)."""
    from engines.frontend.ipa import _MISAKI

    reading = Reader(british=False).read("Say [tomato](/təˈmɑːtoʊ/) now.", timings=False)
    phonemes = "".join(chunk.phonemes for chunk in reading.chunks)
    assert "təmˈɑtO" in phonemes, phonemes
    assert set(phonemes) <= _MISAKI | set(".,!?"), set(phonemes) - _MISAKI
