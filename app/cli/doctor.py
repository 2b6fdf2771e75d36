"""`voxmux doctor`: is this installation usable, and if not, why.

It reports Python, the onnxruntime build and the providers a session really gets, NVML, every
catalogue model with its installed voices (read without loading any model), the dirs VoxMux
writes, and the profile in force. A problem (the server could not serve something it is configured
to serve) makes the exit code 1; a warning (it serves, but not as configured: a GPU profile on CPU)
does too under `--strict`.
"""

from __future__ import annotations

import json
import logging
import platform
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.http.auth import KEY_FILE
from app.serving.catalogue import Catalogue
from app.serving.wiring import runtime_options
from app.settings import Settings, profiles_dir
from engines import kokoro
from engines.onnx import available_providers, probe_providers, runtime_package, runtime_version
from engines.plugin import build_engine
from engines.registry import ModelEntry

SAMPLE_VOICES = 5
KEY_SETTINGS = (
    "host", "port", "providers", "cuda_options", "intra_op_threads", "concurrency", "queue_size",
    "request_timeout", "idle_ttl", "model_ttl", "max_loaded", "preload", "log_level", "log_dir",
    "auth_scope",
)
"""Shown under the profile, with every `cache_*` budget; secrets never are."""
MIN_PYTHON = (3, 11)


@dataclass
class Findings:
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def collect(settings: Settings) -> dict[str, Any]:
    """The whole report as plain JSON-able data; `ok` is false when there is a problem."""
    found = Findings()
    report: dict[str, Any] = {
        "python": _python(found),
        "profile": _profile(settings),
        "onnxruntime": _onnxruntime(settings, found),
        "nvml": _nvml(settings, found),
        "models": _models(settings, found),
        "dirs": _dirs(settings, found),
    }
    report.update(ok=not found.problems, problems=found.problems, warnings=found.warnings)
    return report


def exit_code(report: dict[str, Any], strict: bool = False) -> int:
    return 1 if report["problems"] or (strict and report["warnings"]) else 0


def run(settings: Settings, as_json: bool = False, strict: bool = False) -> int:
    engines_log = logging.getLogger("engines")
    level = engines_log.level
    engines_log.setLevel(logging.ERROR)  # its fallback warnings are in the report already
    try:
        report = collect(settings)
    finally:
        engines_log.setLevel(level)
    print(json.dumps(report, indent=2) if as_json else render(report))
    return exit_code(report, strict)


def _python(found: Findings) -> dict[str, Any]:
    if sys.version_info[:2] < MIN_PYTHON:
        found.problems.append(f"Python {platform.python_version()} is older than "
                              f"{'.'.join(map(str, MIN_PYTHON))}")
    return {"version": platform.python_version(), "executable": sys.executable,
            "implementation": platform.python_implementation()}


def _profile(settings: Settings) -> dict[str, Any]:
    path = profiles_dir() / f"{settings.profile}.env"
    names = [*KEY_SETTINGS,
             *(n for n in Settings.model_fields if n.startswith("cache_") and n != "cache_dir")]
    shown = settings.model_dump(mode="json", include=set(names))
    keys = [k.get_secret_value().lower() for k in settings.api_keys]
    shown["api_keys"] = "auto" if keys == ["auto"] else f"{len(keys)} set" if keys else "none"
    return {"name": settings.profile, "file": str(path) if path.is_file() else None,
            "settings": {name: shown[name] for name in [*names, "api_keys"]}}


def _onnxruntime(settings: Settings, found: Findings) -> dict[str, Any]:
    runtime = runtime_options(settings)
    try:
        session_providers = probe_providers(runtime)
    except Exception as exc:
        found.problems.append(f"onnxruntime cannot open a session with the configured providers "
                              f"and options: {type(exc).__name__}: {exc}")
        session_providers = []
    found.warnings.extend(runtime.fallbacks)
    return {"version": runtime_version(), "package": runtime_package(),
            "available_providers": available_providers(),
            "requested_providers": list(settings.providers),
            "session_providers": session_providers, "fallbacks": list(runtime.fallbacks)}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_report() -> dict[str, Any]:
    """NVML's view: driver, CUDA version the driver supports, each GPU and its memory."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver or no library: the usual state of a CPU box
        return {"available": False, "detail": _text(exc) or type(exc).__name__, "driver": None,
                "cuda": None, "devices": []}
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()
        devices = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            devices.append({"index": index, "name": _text(pynvml.nvmlDeviceGetName(handle)),
                            "memory_total_mib": int(memory.total) // 2**20,
                            "memory_used_mib": int(memory.used) // 2**20})
        return {"available": True, "detail": "ok",
                "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
                "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}", "devices": devices}
    except Exception as exc:
        return {"available": True, "detail": f"query failed: {_text(exc)}", "driver": None,
                "cuda": None, "devices": []}


def _nvml(settings: Settings, found: Findings) -> dict[str, Any]:
    report = nvml_report()
    wants_gpu = any(p != "CPUExecutionProvider" for p in settings.providers)
    if not report["available"] and wants_gpu:
        found.warnings.append(f"NVML not available ({report['detail']}): no NVIDIA driver is "
                              "visible, VRAM is not measured")
    elif report["available"] and report["detail"] != "ok":
        found.warnings.append(f"NVML {report['detail']}")
    return report


def _models(settings: Settings, found: Findings) -> dict[str, Any]:
    try:
        catalogue = Catalogue.load(settings.catalogue_path)
    except Exception as exc:
        found.problems.append(f"catalogue {settings.catalogue_path} cannot be read: {exc}")
        return {}
    for model_id in settings.preload:
        if model_id not in catalogue.models:
            found.warnings.append(f"preload names '{model_id}', which the catalogue lacks")
    return {model_id: _model(entry, settings, found)
            for model_id, entry in catalogue.models.items()}


def _model(entry: ModelEntry, settings: Settings, found: Findings) -> dict[str, Any]:
    info: dict[str, Any] = {"engine": entry.engine, "installed": False, "voices": 0,
                            "sample_voices": [], "default_voice": entry.default_voice,
                            "voice_errors": {}, "weights": None, "error": None}
    try:
        engine = build_engine(entry.engine, settings, runtime_options(settings))
        voices = [voice.id for voice in engine.voices()]
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
        found.problems.append(f"model {entry.id}: {info['error']}")
        return info
    errors: dict[str, str] = dict(getattr(engine, "voice_errors", {}))
    info.update(installed=bool(voices), voices=len(voices), sample_voices=voices[:SAMPLE_VOICES],
                voice_errors=errors)
    for name, reason in errors.items():
        found.warnings.append(f"model {entry.id}: voice file {name} skipped: {reason}")
    if entry.default_voice not in voices:
        found.problems.append(f"model {entry.id}: default voice '{entry.default_voice}' is not "
                              "installed")
    if isinstance(engine, kokoro.KokoroEngine):
        info["weights"] = _kokoro_weights(entry.id, settings.cache_dir, found)
    return info


def _kokoro_weights(model_id: str, cache_dir: Path, found: Findings) -> str:
    target = cache_dir / kokoro.MODEL_FILE
    if target.is_file():
        return f"assembled: {target}"
    if _writable(cache_dir):
        return f"joined from the part packages into {cache_dir} on first load"
    found.problems.append(f"model {model_id}: weights are not assembled and {cache_dir} is not "
                          "writable")
    return "missing"


def _writable(path: Path) -> bool:
    """Whether a file can be created in `path`, or in the ancestor `mkdir -p` would start from;
    tried for real (a read-only mount passes `os.access` checks as root)."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return False
    try:
        with tempfile.NamedTemporaryFile(dir=probe, prefix=".voxmux-doctor-"):
            return True
    except OSError:
        return False


def _dirs(settings: Settings, found: Findings) -> dict[str, Any]:
    keys = [k.get_secret_value().lower() for k in settings.api_keys]
    needs_key_file = keys == ["auto"] and not (settings.credentials_dir / KEY_FILE).is_file()
    wanted: dict[str, tuple[Path | None, str]] = {
        "cache_dir": (settings.cache_dir, "warning"),
        "credentials_dir": (settings.credentials_dir,
                            "problem" if needs_key_file else "warning"),
        "models_dir": (settings.models_dir, "none"),
        "log_dir": (settings.log_dir, "problem"),
    }
    out: dict[str, Any] = {}
    for name, (path, severity) in wanted.items():
        if path is None:
            continue
        writable = _writable(path)
        out[name] = {"path": str(path), "exists": path.is_dir(), "writable": writable}
        if not writable and severity != "none":
            (found.problems if severity == "problem" else found.warnings).append(
                f"{name} {path} is not writable")
    return out


def _row(label: str, value: object) -> str:
    return f"  {label:<22}{value}"


def render(report: dict[str, Any]) -> str:
    profile, ort, nvml = report["profile"], report["onnxruntime"], report["nvml"]
    lines = [f"VoxMux doctor: profile {profile['name']} "
             f"({profile['file'] or 'no profile file; built-in defaults'})",
             _row("Python", f"{report['python']['version']} ({report['python']['executable']})"),
             _row("onnxruntime", f"{ort['version']} ({ort['package']}); available: "
                                 f"{', '.join(ort['available_providers'])}"),
             _row("requested", ", ".join(ort["requested_providers"])),
             _row("sessions get", ", ".join(ort["session_providers"]) or "(no session)")]
    if nvml["available"]:
        lines.append(_row("NVML", f"driver {nvml['driver']}, CUDA {nvml['cuda']}"))
        lines += [_row(f"  GPU {d['index']}", f"{d['name']}, {d['memory_used_mib']} of "
                                              f"{d['memory_total_mib']} MiB used")
                  for d in nvml["devices"]]
    else:
        lines.append(_row("NVML", f"not available ({nvml['detail']})"))
    lines.append("Settings")
    lines += [_row(name, json.dumps(value)) for name, value in profile["settings"].items()]
    lines.append("Models")
    for model_id, info in report["models"].items():
        if info["error"]:
            lines.append(_row(model_id, f"{info['engine']}: NOT USABLE: {info['error']}"))
            continue
        more = "" if info["voices"] <= len(info["sample_voices"]) else ", ..."
        lines.append(_row(model_id, f"{info['engine']}, voices: {info['voices']} "
                                    f"({', '.join(info['sample_voices'])}{more})"))
        if info["weights"]:
            lines.append(_row("", f"weights {info['weights']}"))
    lines.append("Directories")
    lines += [_row(name, f"{d['path']} ({'writable' if d['writable'] else 'NOT writable'})")
              for name, d in report["dirs"].items()]
    lines += [f"  WARNING {w}" for w in report["warnings"]]
    lines += [f"  PROBLEM {p}" for p in report["problems"]]
    verdict = "usable" if report["ok"] else f"NOT usable: {len(report['problems'])} problem(s)"
    extra = f", {len(report['warnings'])} warning(s)" if report["warnings"] else ""
    lines.append(f"Result: {verdict}{extra}")
    return "\n".join(lines)
