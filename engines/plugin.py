"""How a catalogue entry names its engine: by import path, `module:Class`.

An engine is one module: a class satisfying `engines.base.Engine` with a classmethod
`from_settings(settings, runtime)` that builds it from VoxMux's settings (where its files are)
and the onnxruntime options. A catalogue entry `engine = "engines.hibari:HibariEngine"` (or a
module of the user's own on the import path) is all that wires it in; nothing else names it.
The three first engines' short names (`kokoro`, `piper`, `espeak`) still work in catalogues
written before import paths.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol, cast

from engines.base import Engine, EngineSettings
from engines.onnx import RuntimeOptions

SHORT_NAMES = {
    "kokoro": "engines.kokoro:KokoroEngine",
    "piper": "engines.piper:PiperEngine",
    "espeak": "engines.espeak:EspeakEngine",
}
"""Names catalogues used before engines were named by import path; no engine is added here."""


class EngineClass(Protocol):
    def from_settings(self, settings: EngineSettings, runtime: RuntimeOptions) -> Engine: ...


class UnknownEngine(LookupError):
    """A catalogue entry names no importable engine class."""


def engine_class(spec: str) -> EngineClass:
    """The class `spec` names (`package.module:Class`, or a short name)."""
    path = SHORT_NAMES.get(spec, spec)
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise UnknownEngine(f"unknown engine '{spec}': name it as module:Class "
                            f"(e.g. engines.hibari:HibariEngine) or one of "
                            f"{', '.join(SHORT_NAMES)}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UnknownEngine(f"unknown engine '{spec}': {exc}") from exc
    found: Any = getattr(module, attribute, None)
    if found is None:
        raise UnknownEngine(f"unknown engine '{spec}': {module_name} has no {attribute}")
    if not callable(getattr(found, "from_settings", None)):
        raise UnknownEngine(f"engine '{spec}' has no from_settings(settings, runtime)")
    return cast(EngineClass, found)


def build_engine(spec: str, settings: EngineSettings, runtime: RuntimeOptions) -> Engine:
    return engine_class(spec).from_settings(settings, runtime)
