"""Word timings from the engines themselves: the duration tensors exposed in the Kokoro and
Piper graphs (the edited graph speaks exactly as the original), eSpeak NG's events, and the
spans the text front end keeps through normalization."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engines import align
from engines.base import SynthesisRequest, TimedAudio, WordTiming
from engines.espeak import EspeakEngine
from engines.frontend import en, ja, prepare_spanned, zh
from engines.frontend.spans import Spanned
from engines.hibari import HibariEngine
from engines.kokoro import DURATIONS as KOKORO_DURATIONS
from engines.kokoro import KokoroEngine, assemble_model, prepare_model
from engines.onnx import RuntimeOptions
from engines.piper import PiperEngine
from tests.conftest import CACHE_DIR

SENTENCE = "The quick brown fox jumps over the lazy dog, and 42 birds sing."
WORDS = re.findall(r"\w+", SENTENCE)


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.enable_mem_pattern = False
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_kokoro_timed_graph_speaks_the_same_samples_and_sums_to_the_audio() -> None:
    engine = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
    phonemes = engine.phonemize("The quick brown fox jumps.", "jf_alpha")  # any text will do
    tokens = [engine._vocab[c] for c in phonemes if c in engine._vocab]
    style = engine._style_table("jf_alpha")[len(tokens) - 1].reshape(1, 256)
    untimed, timed = _session(assemble_model(CACHE_DIR)), _session(prepare_model(CACHE_DIR))
    for speed in (1.0, 1.6):
        feeds = {"tokens": np.array([[0, *tokens, 0]], dtype=np.int64), "style": style,
                 "speed": np.array([speed], dtype=np.float32)}
        original = untimed.run(None, feeds)
        audio, frames = timed.run(None, feeds)
        assert [o.name for o in timed.get_outputs()] == ["audio", KOKORO_DURATIONS]
        assert np.array_equal(original[0], audio)  # the edit changes no sample
        assert frames.size == len(tokens) + 2
        assert int(frames.sum()) * 600 == audio.size  # frames x hop = the audio, exactly


def test_piper_timed_graph_speaks_the_same_samples_and_sums_to_the_audio(tmp_path: Path
                                                                       ) -> None:
    engine = PiperEngine(None, RuntimeOptions(), cache_dir=tmp_path)
    engine.load()
    model = engine._embedded
    assert model.timed and tmp_path in Path(model.session._model_path).parents
    ids = model.phoneme_ids("ðə kwˈɪk bɹˈaʊn fˈɑːks")
    feeds = {"input": np.array([ids], dtype=np.int64),
             "input_lengths": np.array([len(ids)], dtype=np.int64),
             "scales": np.array([0.667, 1.0, 0.8], dtype=np.float32)}
    # VITS draws noise from the session's generator: compare the first run of fresh sessions.
    original = _session(model.path).run(None, feeds)[0]
    audio, frames, scaled = _session(Path(model.session._model_path)).run(None, feeds)
    assert np.array_equal(original, audio)
    assert frames.size == len(ids)
    assert int(frames.sum()) * 256 == audio.size
    assert np.array_equal(np.ceil(scaled.reshape(-1)), frames.reshape(-1))


def _check(words: tuple[WordTiming, ...], text: str, seconds: float) -> None:
    assert [w.word for w in words] == [text[w.char_start:w.char_end] for w in words]
    starts = [w.start for w in words]
    assert starts == sorted(starts)
    assert all(0 <= w.start <= w.end <= seconds + 1e-6 for w in words)
    assert all(b.start >= a.end - 1e-6 for a, b in itertools.pairwise(words))
    for w in words:
        chars = w.character_times()
        assert len(chars) == len(w.word)
        assert chars[0][0] == pytest.approx(w.start) and chars[-1][1] == pytest.approx(w.end)


def _timed(engine: object, voice: str, text: str = SENTENCE) -> TimedAudio:
    chunks = list(engine.stream_timed(  # type: ignore[attr-defined]
        SynthesisRequest(text=text, voice=voice, timings=True)))
    assert len(chunks) == 1
    return chunks[0]


@pytest.mark.parametrize("name", ["kokoro", "piper", "hibari", "espeak"])
def test_every_engine_times_every_word_of_the_input(name: str) -> None:
    if name == "kokoro":
        engine: object = KokoroEngine(CACHE_DIR, None, RuntimeOptions())
        voice = "jf_alpha"
    elif name == "piper":
        engine = PiperEngine(None, RuntimeOptions(), cache_dir=CACHE_DIR)
        voice = "en_US-joe-medium"
    elif name == "hibari":
        engine, voice = HibariEngine(None, RuntimeOptions(), CACHE_DIR), "heart"
    else:
        engine, voice = EspeakEngine(), "en-us"
    engine.load()  # type: ignore[attr-defined]
    chunk = _timed(engine, voice)
    rate = engine.sample_rate  # type: ignore[attr-defined]
    _check(chunk.words, SENTENCE, len(chunk.audio) / rate)
    assert [w.word for w in chunk.words] == WORDS  # "42" is one word, spoken "forty-two"
    number = next(w for w in chunk.words if w.word == "42")
    assert number.end - number.start > 0.25  # two words' worth of speech
    # Without timings nothing is aligned, and the chunk carries no words.
    plain = list(engine.stream_timed(  # type: ignore[attr-defined]
        SynthesisRequest(text=SENTENCE, voice=voice)))
    assert all(c.words == () for c in plain)


def test_espeak_events_change_no_sample_and_mark_word_starts() -> None:
    engine = EspeakEngine()
    engine.load()
    chunk = _timed(engine, "en-us", "Hello world, this is it.")
    plain = engine.synthesize(SynthesisRequest(text="Hello world, this is it.", voice="en-us"))
    # eSpeak's output varies by a few samples from call to call; the words do not move.
    assert abs(len(plain) - len(chunk.audio)) < 50
    world, this = chunk.words[1], chunk.words[2]
    assert this.start - world.end > 0.05  # the comma's pause belongs to no word


def test_normalization_keeps_the_span_of_every_replacement() -> None:
    text = "Dr. Smith paid $5.50 at 3:30 pm on 1/2/2024 for 42 km."
    spanned = en.normalize_spanned(Spanned.of(text))
    assert spanned.text == en.normalize(text)
    words = align.words_of(spanned, "en")
    by_source = {}
    for word in words:
        by_source.setdefault(text[word.start:word.end].strip(), []).append(word.text)
    assert by_source["Dr."] == ["Doctor"]
    assert by_source["$5.50"] == ["five", "dollars", "and", "fifty", "cents"]
    assert by_source["42 km"] == ["forty", "two", "kilometers"]
    assert by_source["3:30 pm"] == ["three", "thirty", "P", "M"]


@pytest.mark.parametrize("module", [en, zh, ja], ids=["en", "zh", "ja"])
def test_every_rule_keeps_spans_generically(module: object) -> None:
    """Each rule of a rule list, run through `Spanned.sub`, writes exactly what `re.sub` does,
    and every replaced character spans the text its match covered: a rule added later (phone
    numbers) needs nothing more."""
    samples = ["Call 555-123-4567 at 10:05 or 7 pm, 3-5 days, #4, 50% of $12 or 12kg.",
               "1990s, '80s, 4K, 3rd, 1/2, 2024-01-31, 12/25/2024, -3, Mt. Fuji & co.",
               "３月１日、１２．５％と￥３００、15:30、3～5、1,000人、2個。"]
    rules = module._RULES  # type: ignore[attr-defined]
    for sample in samples:
        current = Spanned.of(sample)
        for pattern, replace in rules:
            expected = pattern.sub(replace, current.text)
            after = current.sub(pattern, replace)
            assert after.text == expected
            for match in pattern.finditer(current.text):
                replacement = replace(match)
                if replacement == match[0] or not replacement:
                    continue
                low, high = current.source_span(*match.span())
                k = after.text.find(replacement, match.start())
                assert after.source_span(k, k + len(replacement)) == (low, high)
                break
            current = after


def test_runs_keep_spans_in_the_whole_text() -> None:
    text = "It costs 42 yen. 今日は3日です。"
    runs = prepare_spanned(text, default="en-us")
    for run in runs:
        start, end = run.text.source_span(0, len(run.text))
        assert 0 <= start < end <= len(text)
    assert runs[0].text.text.startswith("It costs forty-two")


def test_owners_follow_words_that_espeak_joined() -> None:
    # eSpeak reads "of the" as one word, ʌvðə; each half goes to its own word.
    owners = align.owners("wˈʌn ʌvðə bˈɛst", ["wˌʌn", "ʌv", "ðə", "bˈɛst"])
    assert owners[:4] == [0, 0, 0, 0] and owners[4] == -1
    assert owners[5:7] == [1, 1] and owners[7:9] == [2, 2] and owners[10:] == [3] * 5
