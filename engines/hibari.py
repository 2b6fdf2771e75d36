"""hibari: English voices distilled from Kokoro-82M (`hibari-tts`), 24 kHz, about 130x real time.

The `heart` voice ships inside the wheel; every further voice is an ONNX file a user drops in
`models/hibari/`: named as the package names it (`bf_emma.int8.onnx` is `emma`) or by the voice
it is (`emma.onnx`, `mine.onnx`). VoxMux never downloads one (the package would, on first use):
a voice the package knows of but that is not on disk is an error that says where to put it.

Text is read through VoxMux's English front end (`engines.frontend.en`: numbers, phone numbers,
money, units, dates, e-mail addresses, URLs), as every English engine reads it, each character
keeping its span in the request; then through the package's G2P (its tokenizer, tagger, lexicons
and out-of-vocabulary net, not its own normalizer), sentence by sentence as the package cuts
them, and the phonemes through the voice's graph in VoxMux's own onnxruntime session,
so a cancel stops a running inference (`RunOptions.terminate`) and the graph's per-token frame
counts (`/Clip_output_0`, the rounded durations its `CumSum` expands) time every word. The
package's DSP turns the graph's spectra into samples, with its noise drawn from a generator
seeded per request, so the same request is the same audio.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from engines import align
from engines.base import (
    Audio,
    Capabilities,
    EngineSettings,
    InvalidParameter,
    LoadFailed,
    SynthesisRequest,
    TimedAudio,
    Voice,
    VoiceNotFound,
    WordTiming,
    concatenate,
    describe,
)
from engines.frontend import base_language, en
from engines.frontend.ipa import INLINE, to_engine
from engines.frontend.spans import Spanned
from engines.onnx import RuntimeOptions, open_session, run, session_providers, with_outputs
from engines.signature import digest, file_digest, package_versions
from engines.voicescan import VoiceChanges, diff

log = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
HOP = 300
"""Samples per frame of the graph's spectra (12.5 ms)."""
DURATION_UNIT = 2 * HOP
"""Samples per unit of `DURATIONS` (25 ms, Kokoro's frame: each is two spectral frames)."""
DURATIONS = "/Clip_output_0"
"""Units per phoneme id (the predicted durations over the speed, rounded and clipped): what the
graph's `CumSum` expands, so their sum times `DURATION_UNIT` is the audio's length."""
RAW_DURATIONS = "/Div_40_output_0"
"""The same durations before they are rounded (the predictor's over the speed): from them the
engine finds the speed that gives the asked tempo once the graph has rounded every phoneme."""
DEFAULT_VOICE = "heart"
SEED = 0
"""The DSP's noise generator is seeded per request: the same request is the same audio."""
LINKED = 5
"""The rating the package's G2P gives a `[word](/ipa/)` link: its reading is the client's IPA."""
RENDERING = 3
"""Raised when a change here alters the audio of an unchanged request, so the audio cache, which
keys voices by `fingerprint`, serves none rendered before (2: a client's IPA in misaki's
symbols; 3: English read through VoxMux's front end, not the package's normalizer)."""
FOLDER_HINT = "models/hibari/ (VOXMUX_MODELS_DIR/hibari)"


def _registry() -> dict[str, dict[str, Any]]:
    """The package's voice table (name -> file, sha256, language, gender, british)."""
    text = (files("hibari") / "assets" / "voices.json").read_text(encoding="utf-8")
    table: dict[str, dict[str, Any]] = json.loads(text)
    return table


@dataclass
class HibariVoice:
    """One voice file; its session exists while the engine is loaded."""

    name: str
    path: Path
    british: bool
    language: str
    gender: str = ""
    content: str = ""
    """A digest of the file's content: the audio cache keys the voice by it."""
    session: Any = None
    timed: bool = False
    """Whether the open session also outputs `DURATIONS` (word timings) and `RAW_DURATIONS`
    (the exact tempo)."""

    def open(self, runtime: RuntimeOptions, cache_dir: Path | None,
             threads: int) -> None:
        path = self.path
        self.timed = False
        if cache_dir is not None:
            timed = cache_dir / "hibari" / f"{self.name}-{self.content}.timed.onnx"
            try:
                if with_outputs(self.path, timed, (DURATIONS, RAW_DURATIONS), self.content):
                    path, self.timed = timed, True
                else:
                    log.info("hibari voice %s has no %s: no word timings", self.name, DURATIONS)
            except OSError as exc:
                log.warning("hibari voice %s: no word timings (%s)", self.name, exc)
        self.session = open_session(path, runtime, intra_op_threads=threads)


def scan_voice_dir(folder: Path | None, registry: dict[str, dict[str, Any]]
                   ) -> tuple[dict[str, HibariVoice], dict[str, str]]:
    """`*.onnx` in `folder` -> (voices by name, errors by file name). A file named as the
    package names a voice (`bf_emma.int8.onnx`) is that voice; any other is named by its stem,
    and a known name's accent and gender come from the package's table."""
    voices: dict[str, HibariVoice] = {}
    errors: dict[str, str] = {}
    if not folder or not folder.is_dir():
        return voices, errors
    by_file = {entry["file"]: name for name, entry in registry.items()}
    for path in sorted(folder.glob("*.onnx")):
        if path.name.endswith(".timed.onnx"):
            continue
        name = by_file.get(path.name) or path.name.removesuffix(".onnx")
        entry = registry.get(name, {})
        british = bool(entry.get("british", False))
        try:
            content = file_digest(path)
        except OSError as exc:
            errors[path.name] = describe(exc)
            continue
        voices[name] = HibariVoice(
            name, path, british, "en-gb" if british else "en-us", str(entry.get("gender", "")),
            content)
    return voices, errors


# -- the text front end, with spans ------------------------------------------------------------

def read_english(text: str) -> Spanned:
    """`text` as VoxMux's English front end reads it, each character with its span in `text`.

    A `[word](/ipa/)` link stays as written for the package's tokenizer, which takes its
    reading; the text around it is normalized (the rules never see the IPA)."""
    spoken = Spanned("", (), ())
    position = 0
    for match in INLINE.finditer(text):
        spoken += en.normalize_spanned(Spanned.of(text[position:match.start()], position))
        spoken += Spanned.of(match[0], match.start())
        position = match.end()
    return spoken + en.normalize_spanned(Spanned.of(text[position:], position))


@dataclass
class Chunk:
    """One inference: a phoneme string, each character's word (-1: none), the words."""

    phonemes: str
    owners: list[int]


@dataclass
class Reading:
    """A text as the package reads it: its inferences in order, and the words they speak."""

    chunks: list[Chunk]
    words: list[align.Word]


def _chunks(phonemes: str, owners: list[int], limit: int, clause: re.Pattern[str]
            ) -> list[Chunk]:
    """The package's cut of an over-long sentence at clause marks, owners carried along."""
    if len(phonemes) <= limit:
        return [Chunk(phonemes, owners)]
    out: list[Chunk] = []
    current = Chunk("", [])
    position = 0
    parts: list[tuple[str, list[int]]] = []
    for match in clause.finditer(phonemes):
        parts.append((phonemes[position:match.start()], owners[position:match.start()]))
        position = match.end()
    parts.append((phonemes[position:], owners[position:]))
    for text, owned in parts:
        if current.phonemes and len(current.phonemes) + len(text) + 1 > limit:
            out.append(current)
            current = Chunk(text, list(owned))
        elif current.phonemes:
            current = Chunk(f"{current.phonemes} {text}", [*current.owners, -1, *owned])
        else:
            current = Chunk(text, list(owned))
    if current.phonemes:
        out.append(current)
    return out


class Reader:
    """VoxMux's English front end, then the package's G2P (its `Hibari.phonemize` without its
    normalizer), each phoneme with the word of the request it reads."""

    def __init__(self, british: bool) -> None:
        from hibari.g2p import G2P

        self.g2p = G2P(british=british)
        self.g2p.oov("warm")  # the out-of-vocabulary net loads now, not in the first request

    def read(self, text: str, timings: bool) -> Reading:
        from hibari import tts

        spoken = read_english(text)
        chunks: list[Chunk] = []
        words: list[align.Word] = []
        cursor = 0
        for sentence in tts.Hibari.split_sentences(spoken.text):
            start = spoken.text.find(sentence, cursor)
            if start < 0:  # not a slice of the text after all: read it with coarse spans
                low, high = spoken.source_span(cursor, len(spoken))
                piece = Spanned.made_from(sentence, low, high)
            else:
                piece = spoken[start:start + len(sentence)]
                cursor = start + len(sentence)
            phonemes, owners = self._sentence(piece, words if timings else None)
            if phonemes:
                chunks += _chunks(phonemes, owners, tts.MAX_PHONEMES, tts._CLAUSE)
        return Reading(chunks, words)

    def _sentence(self, sentence: Spanned, words: list[align.Word] | None
                  ) -> tuple[str, list[int]]:
        """The package's `G2P.__call__` on one sentence, each phoneme with its word (`words`
        None: no timings, every owner -1)."""
        text = sentence.text
        tokens = self.g2p.phonemize_tokens(self.g2p.tokenize(text))
        phonemes, owners = "", []
        cursor = 0
        for token in tokens:
            said = self.g2p.unk if token.phonemes is None else token.phonemes
            if token.rating == LINKED and said:  # a client's `[word](/ipa/)`: misaki's symbols
                said = to_engine(said, "misaki").phonemes
            owner = -1
            if words is not None:
                at = text.find(token.text, cursor)
                if at >= 0:
                    cursor = at + len(token.text)
                    if token.rating == LINKED:  # past the link's reading, no word inside it
                        cursor = max(cursor, text.find(")", cursor) + 1)
                    core = re.search(r"[^\W_](?:.*[^\W_])?", token.text)  # "M." ends a sentence
                    if core is not None:
                        low, high = sentence.source_span(at + core.start(), at + core.end())
                        owner = len(words)
                        words.append(align.Word(token.text, low, high))
            phonemes += said
            owners += [owner] * len(said)
            if token.whitespace:
                phonemes += " "
                owners.append(-1)
        # `.strip()`, as the package does, with the owners kept in step.
        start = len(phonemes) - len(phonemes.lstrip())
        end = start + len(phonemes.strip())
        return phonemes[start:end], owners[start:end]


def graph_speed(durations: Any, speed: float) -> float:
    """The `speed` input that makes the graph's rounded durations (each `max(round(d / s), 1)`
    units) last 1/`speed` of what they last at 1.0, from the unrounded ones at 1.0.

    The graph rounds every phoneme to whole 25 ms units, at least one, so dividing by the speed
    itself comes out up to 5 % off at 0.9 and 9 % at 2.0; the count only falls as the speed
    rises, so halving the interval finds it. Give it the spoken phonemes' durations only: the
    silences at either end (a third of a short sentence) scale exactly and are trimmed anyway,
    and counted in they hid 7 % on the words at 1.5."""
    raw = np.asarray(durations, dtype=np.float64).reshape(-1)

    def units(s: float) -> float:
        return float(np.maximum(np.round(raw / s), 1).sum())

    target = units(1.0) / speed
    low, high = speed / 4, speed * 4
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if units(middle) > target else (low, middle)
    return min((low, high), key=lambda s: abs(units(s) - target))


class HibariEngine:
    name = "hibari"
    phoneme_set = "misaki"
    sample_rate = SAMPLE_RATE
    capabilities = Capabilities(
        # The graph divides each phoneme's duration by the speed and rounds it to whole 25 ms
        # units (at least one); `graph_speed` finds the speed input whose rounded units give the
        # asked tempo. Past 2.0 most phonemes are one unit already: the time-stretch does that.
        speed_range=(0.5, 2.0),
        languages=("en-gb", "en-us"),
        max_segment_chars=400,
        # One inference takes a few milliseconds: split over threads it waits on them more than
        # it gains, and the package's DSP between inferences is single-threaded numpy. A call
        # keeps one core busy, so the lane runs one call per core (bench/results/hibari.md).
        cores_per_call=1,
        whole_first_sentence=True,
    )

    def __init__(self, voices_dir: Path | None, runtime: RuntimeOptions,
                 cache_dir: Path | None = None) -> None:
        """`cache_dir`: where the timed copies of the graphs go; None: no word timings."""
        self._voices_dir = voices_dir
        self._runtime = runtime
        self._cache_dir = cache_dir
        # "Let onnxruntime decide" means one thread here, as in the package (`cores_per_call`).
        self._threads = runtime.intra_op_threads or 1
        self._lock = threading.Lock()  # load, unload and rescan change the voice table
        self._registry = _registry()
        bundled = self._registry[DEFAULT_VOICE]
        heart = Path(str(files("hibari") / "assets" / bundled["file"]))
        self._embedded = HibariVoice(DEFAULT_VOICE, heart, False, "en-us",
                                     str(bundled.get("gender", "")), file_digest(heart))
        self._voices: dict[str, HibariVoice] = {}
        self._readers: dict[bool, Reader] = {}
        self._loaded = False
        self.voice_errors: dict[str, str] = {}
        self.rescan()

    @classmethod
    def from_settings(cls, settings: EngineSettings, runtime: RuntimeOptions) -> HibariEngine:
        return cls(settings.models_dir / "hibari", runtime, settings.cache_dir)

    @property
    def loaded(self) -> bool:
        return self._loaded

    def providers(self) -> tuple[str, ...]:
        return session_providers(v.session for v in list(self._voices.values()))

    def voices(self) -> list[Voice]:
        return [Voice(id=v.name, name=v.name, model=self.name, language=v.language,
                      gender=v.gender) for v in self._voices.values()]

    def rescan(self) -> VoiceChanges:
        """Re-read the user dir; unchanged voices keep their sessions, new ones open if loaded.
        A user file named `heart` is skipped: the package's own voice keeps that name."""
        found, errors = scan_voice_dir(self._voices_dir, self._registry)
        with self._lock:
            before = dict(self._voices)
            voices = {DEFAULT_VOICE: self._embedded}
            for name, voice in found.items():
                if name == DEFAULT_VOICE:
                    errors[voice.path.name] = "the package's own voice is named 'heart'"
                    continue
                old = self._voices.get(name)
                if old is not None and old.content == voice.content and old.path == voice.path:
                    voice = old  # same file: keep its session
                elif self._loaded:
                    self._open(voice, errors)
                    if voice.session is None:
                        continue
                voices[name] = voice
            self._voices, self.voice_errors = voices, errors
            return diff(before, voices, lambda a, b: a is b)

    def _open(self, voice: HibariVoice, errors: dict[str, str]) -> None:
        try:
            voice.open(self._runtime, self._cache_dir, self._threads)
            self._reader(voice.british)
        except Exception as exc:
            voice.session = None
            errors[voice.path.name] = describe(exc)
            log.warning("hibari voice %s failed to load: %s", voice.name, exc)

    def _reader(self, british: bool) -> Reader:
        reader = self._readers.get(british)
        if reader is None:
            reader = self._readers[british] = Reader(british)
        return reader

    def load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            try:
                self._embedded.open(self._runtime, self._cache_dir, self._threads)
                self._reader(False)
            except Exception as exc:
                self._embedded.session = None
                raise LoadFailed(f"hibari failed to load: {exc}") from exc
            errors = dict(self.voice_errors)
            for name, voice in list(self._voices.items()):
                if voice is not self._embedded:
                    self._open(voice, errors)
                    if voice.session is None:
                        del self._voices[name]
            self.voice_errors = errors
            self._loaded = True

    def unload(self) -> None:
        with self._lock:
            for voice in self._voices.values():
                voice.session = None
            self._readers.clear()
            self._loaded = False

    def _resolve(self, name: str) -> HibariVoice:
        voice = self._voices.get(name)
        if voice is not None:
            return voice
        known = self._registry.get(name)
        if known is not None:
            raise VoiceNotFound(
                f"hibari voice '{name}' is not installed; VoxMux never downloads: put its file "
                f"{known['file']} (or {name}.onnx) in {FOLDER_HINT}", param="voice")
        reason = next((why for file, why in self.voice_errors.items()
                       if file.removesuffix(".onnx") == name), None)
        detail = f" ({reason})" if reason else f"; add one as {name}.onnx in {FOLDER_HINT}"
        raise VoiceNotFound(f"hibari has no voice '{name}'{detail}", param="voice")

    def fingerprint(self, voice: str) -> str:
        found = self._voices.get(voice)
        content = found.content if found is not None else "?"
        british = str(found.british) if found is not None else "?"
        return digest(content, voice, british, str(SEED), str(RENDERING),
                      package_versions("hibari-tts", "scipy"))

    def validate(self, req: SynthesisRequest) -> None:
        self._resolve(req.voice)
        if req.language and base_language(req.language) != "en":
            raise InvalidParameter(f"hibari speaks English only, not '{req.language}'",
                                   param="language")

    def stream(self, req: SynthesisRequest) -> Iterator[Audio]:
        for chunk in self.stream_timed(req):
            yield chunk.audio

    def stream_timed(self, req: SynthesisRequest) -> Iterator[TimedAudio]:
        from hibari import dsp

        voice = self._resolve(req.voice)
        session = voice.session
        reader = self._readers.get(voice.british)
        if session is None or reader is None:
            raise LoadFailed("hibari is not loaded")
        timings = req.timings and voice.timed
        reading = reader.read(req.text, timings)
        vocab = _vocab()
        rng = np.random.default_rng(SEED)
        for chunk in reading.chunks:
            kept = [(vocab[c], owner) for c, owner in zip(chunk.phonemes, chunk.owners,
                                                          strict=True) if c in vocab]
            if not kept:
                continue
            ids = np.array([[0, *(i for i, _ in kept), 0]], dtype=np.int64)
            speed = req.speed
            spoken = [k + 1 for k, c in enumerate(c for c in chunk.phonemes if c in vocab)
                      if c.isalpha()]
            if speed != 1.0 and voice.timed and spoken:  # the predictor's nodes only
                raw = run(session, {"ids": ids, "speed": np.array([1.0], dtype=np.float32)},
                          req.cancel, [RAW_DURATIONS])[0]
                speed = graph_speed(np.asarray(raw).reshape(-1)[spoken[0]:spoken[-1] + 1],
                                    speed)
            outputs = run(session, {"ids": ids, "speed": np.array([speed], dtype=np.float32)},
                          req.cancel)
            lh, theta, ln, lr, phi, f0 = (o[0] for o in outputs[:6])
            audio = np.asarray(dsp.synth(lh, theta, ln, lr, phi, f0, rng), dtype=np.float32)
            req.cancel.check()
            words: tuple[WordTiming, ...] = ()
            if timings:
                owners = [-1, *(owner for _, owner in kept), -1]
                words = _timings(req.text, reading.words, owners,
                                 np.asarray(outputs[6], dtype=np.float64).reshape(-1),
                                 len(audio))
            yield TimedAudio(audio, words)

    def synthesize(self, req: SynthesisRequest) -> Audio:
        return concatenate(self.stream(req))


def _timings(source: str, words: list[align.Word], owners: list[int], frames: Any,
             samples: int) -> tuple[WordTiming, ...]:
    """The words of one inference, from its phonemes' owners and frame counts."""
    voiced = [o for o in owners if o >= 0]
    if not voiced or frames.size != len(owners) or not frames.sum():
        return ()
    low, high = min(voiced), max(voiced)
    hop = samples / float(frames.sum())
    units = align.units_from_durations([o - low if o >= 0 else -1 for o in owners],
                                       frames * hop, SAMPLE_RATE)
    return align.timings(source, words[low:high + 1], units)


@functools.cache
def _vocab() -> dict[str, int]:
    text = (files("hibari") / "assets" / "vocab.json").read_text(encoding="utf-8")
    vocab: dict[str, int] = json.loads(text)
    return vocab
