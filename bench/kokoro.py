"""Kokoro: VoxMux against the engine in-process and the two Kokoro peers, in one run.

    .venv/bin/python -m bench.kokoro            # writes bench/results/kokoro.json and kokoro.md
    .venv/bin/python -m bench.kokoro --quick    # a smoke test; numbers not meant

Same machine, same int8 Kokoro weights (the file VoxMux assembles), same voice (jf_alpha, written
into a voices file for the peers), same English texts. Systems:
- `raw`: VoxMux's own Kokoro adapter in this process, on the text cut the way VoxMux cuts it, one
  call per segment: the engine's cost and nothing else (the limit VoxMux is measured against).
- `voxmux`: `voxmux serve` at the cpu profile's defaults, `POST /v1/audio/speech` as pcm, read
  as a stream.
- `voxmux_whole`: the same with `VOXMUX_FIRST_SEGMENT_CHARS=450` (no short first segment: a
  deployment for clients that want whole files), in the throughput and long-text phases.
- `kokoro_onnx`: kokoro-onnx 0.6.1's `Kokoro.create` in a process of its own (its timing is
  taken inside that process, so no HTTP is counted against it); each request a thread.
- `fastkokoro`: fastkokoro 0.7.0's OpenAI-compatible server, `stream: true`, pcm.
The peers live in `var/kokoro-peer-venv` (made on first use from PyPI), so nothing of theirs
leaks into VoxMux's environment. Phases, interleaved round by round:
1. throughput at concurrency 1, 4, 8 (five-sentence texts), with CPU seconds per audio second;
2. latency and first audio for one request of 1, 5 and 20 sentences;
3. first audio of each of 1, 4 and 8 requests sent at once (the last one's is the figure);
4. one long text (30 sentences), whole time, five rounds.
Every phase records the share of the machine other processes took while it ran.
"""

from __future__ import annotations

import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from app.serving.wiring import runtime_options
from app.settings import load_settings
from app.text.split import split_text
from bench import load
from bench.common import (
    ROOT,
    process_server,
    run_benchmark,
    timed_phase,
    voxmux_process,
)
from bench.systems import HttpSystem, Sample, System, VoxMuxClient
from engines.base import SynthesisRequest
from engines.kokoro import SAMPLE_RATE, KokoroEngine, assemble_model

VENV = ROOT / "var" / "kokoro-peer-venv"
REQUIREMENTS = ("kokoro-onnx==0.6.1", "fastkokoro==0.7.0")
"""Pinned: the request shapes below were read from these versions."""
VOICE = "jf_alpha"
PEER_VOICE = "af_alpha"
"""The same style vectors under an English name: fastkokoro refuses a voice whose prefix names
another language than the text's (`j` is Japanese)."""
VOXMUX_ENV = {"VOXMUX_PRELOAD": "kokoro", "VOXMUX_CACHE_MAX_ITEMS": "0", "VOXMUX_IDLE_TTL": "-1",
              "VOXMUX_QUEUE_SIZE": "64"}
WHOLE_ENV = {**VOXMUX_ENV, "VOXMUX_FIRST_SEGMENT_CHARS": "450"}
"""The first segment as large as the later ones: fewer engine calls, first audio later."""


def peer_python() -> Path:
    python = VENV / "bin" / "python"
    check = [str(python), "-c", "import kokoro_onnx, fastkokoro"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"creating {VENV} with {' '.join(REQUIREMENTS)}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *REQUIREMENTS], check=True)
    return python


def voices_file(engine: KokoroEngine, folder: Path) -> Path:
    """The voice as kokoro-onnx reads voice packs: one (rows, 1, 256) array per name."""
    path = folder / "voices-bench.npz"
    table = engine._style_table(VOICE)
    np.savez(path, **{PEER_VOICE: table.reshape(-1, 1, 256)})  # type: ignore[arg-type]
    return path


class RawKokoro:
    name = "raw"

    def __init__(self) -> None:
        self.settings = load_settings("cpu")
        self.engine = KokoroEngine(self.settings.cache_dir, self.settings.models_dir / "kokoro",
                                   runtime_options(self.settings))
        self.engine.load()

    def request(self, text: str) -> Sample:
        segments = split_text(text, max_chars=self.engine.capabilities.max_segment_chars,
                              first_max_chars=self.settings.first_segment_chars,
                              growth=self.settings.segment_growth)
        started = time.perf_counter()
        first = 0.0
        samples = 0
        for segment in segments:
            audio = self.engine.synthesize(SynthesisRequest(text=segment, voice=VOICE))
            samples += len(audio)
            first = first or time.perf_counter() - started
        return Sample(first, time.perf_counter() - started, samples / SAMPLE_RATE)

    def close(self) -> None:
        self.engine.unload()


class KokoroOnnxClient(HttpSystem):
    """The peer's own time: `X-Seconds` from inside its process. It answers once the whole text
    is made (`create`), so its first audio is its total."""

    name = "kokoro_onnx"

    def request(self, text: str) -> Sample:
        started = time.perf_counter()
        response, _, size = self.post("/synthesize", {"text": text, "voice": PEER_VOICE},
                                      started)
        seconds = float(response.headers["x-seconds"])
        return Sample(seconds, seconds, size / 4 / SAMPLE_RATE)


class FastKokoroClient(HttpSystem):
    name = "fastkokoro"

    def request(self, text: str) -> Sample:
        started = time.perf_counter()
        body = {"model": "kokoro", "input": text, "voice": PEER_VOICE, "response_format": "pcm",
                "stream": True}
        _, first, size = self.post("/v1/audio/speech", body, started)
        return Sample(first, time.perf_counter() - started, size / 2 / SAMPLE_RATE)


def measure(quick: bool) -> dict[str, Any]:
    python = str(peer_python())
    logs = ROOT / "var" / "bench"
    logs.mkdir(parents=True, exist_ok=True)  # (a fresh checkout has no var/bench)
    phases: dict[str, Any] = {}
    result: dict[str, Any] = {"quick": quick, "voice": VOICE, "voxmux_env": VOXMUX_ENV,
                              "peers": list(REQUIREMENTS), "phases": phases}
    with ExitStack() as stack:
        raw = RawKokoro()
        stack.callback(raw.close)
        model = assemble_model(raw.settings.cache_dir).resolve()
        voices = voices_file(raw.engine, logs)
        vox = stack.enter_context(voxmux_process(VOXMUX_ENV))
        vox_whole = stack.enter_context(voxmux_process(WHOLE_ENV))
        onnx_peer = stack.enter_context(process_server(
            [python, str(ROOT / "bench" / "peers" / "kokoro_onnx_server.py"), str(model),
             str(voices), "{port}"], "/", logs / "kokoro_onnx.log", cwd=VENV))
        fast_env = {"FASTKOKORO_MODEL_PATH": str(model), "FASTKOKORO_VOICES_PATH": str(voices),
                    "FASTKOKORO_CACHE_DIR": str(logs / "fastkokoro-cache"),
                    "FASTKOKORO_DEFAULT_VOICE": PEER_VOICE, "FASTKOKORO_HOST": "127.0.0.1",
                    "FASTKOKORO_PORT": "{port}", "HF_HUB_OFFLINE": "1"}
        fast = stack.enter_context(process_server([str(VENV / "bin" / "fastkokoro")], "/health",
                                                  logs / "fastkokoro.log", cwd=VENV,
                                                  env=fast_env))
        voxmux = VoxMuxClient(vox.url, model="kokoro")
        whole = VoxMuxClient(vox_whole.url, name="voxmux_whole", model="kokoro")
        peer_onnx = KokoroOnnxClient(onnx_peer.url)
        peer_fast = FastKokoroClient(fast.url)
        for client in (voxmux, whole, peer_onnx, peer_fast):
            stack.callback(client.close)
        systems: list[System] = [raw, voxmux, peer_onnx, peer_fast]
        result["rss_mb"] = {"voxmux": round(vox.rss() / 1e6, 1),
                            "kokoro_onnx": round(onnx_peer.rss() / 1e6, 1),
                            "fastkokoro": round(fast.rss() / 1e6, 1)}

        levels = (1, 2) if quick else (1, 4, 8)
        with timed_phase("throughput", phases):
            reference = load.reference_lengths(raw, 5, 8, repeats=1)
            result["throughput"] = {"sentences": 5, "systems": load.throughput_levels(
                [raw, voxmux, whole, peer_onnx, peer_fast], levels, 5, per_worker=1,
                minimum=2 if quick else 4, per_level=2 if quick else 8, reference=reference)}
        with timed_phase("latency", phases):
            result["latency"] = {}
            for label, n in load.LENGTHS.items():
                rounds = 1 if quick else {"short": 5, "medium": 3, "long": 1}[label]
                print(f"latency {label} ({n} sentences, {rounds} rounds)", flush=True)
                result["latency"][label] = load.latency(systems, n, rounds)
        with timed_phase("simultaneous", phases):
            result["simultaneous"] = {"sentences": 5, "systems": load.simultaneous(
                systems[1:], (1, 4) if quick else (1, 4, 8), 5, 1)}
        with timed_phase("long_text", phases):
            result["long_text"] = load.long_text([raw, voxmux, whole, peer_onnx],
                                                  8 if quick else 30, 1 if quick else 5,
                                                  reference="kokoro_onnx")
    return result


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def summary(result: dict[str, Any]) -> str:
    """The Markdown tables of `kokoro.md` (ratios first: they survive a noisy machine)."""
    lines = ["# Kokoro benchmark", "",
             f"{result['machine']['cpu_model']}, {result['machine']['cpus']} CPUs, "
             f"{result['machine']['date']}. Voice {result['voice']}, int8 weights. "
             "Reproduce: `.venv/bin/python -m bench.kokoro`.", ""]
    phases = result["phases"]
    lines += ["Share of the machine other processes took during each phase: " + ", ".join(
        f"{k} {v['other_work']['others']:.0%}" for k, v in phases.items()) + ".", ""]
    systems = result["throughput"]["systems"]
    lines += ["## Throughput (audio seconds per wall second, five-sentence texts)", "",
              "| concurrency | raw | VoxMux | kokoro-onnx | fastkokoro | VoxMux / raw "
              "| VoxMux / kokoro-onnx | VoxMux / fastkokoro | CPU s per audio s (VoxMux) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for level in systems["voxmux"]:
        row = {name: systems[name][level]["audio_s_per_s"] for name in systems}
        lines.append(
            f"| {level} | {row['raw']:.2f} | {row['voxmux']:.2f} | {row['kokoro_onnx']:.2f} "
            f"| {row['fastkokoro']:.2f} | {_ratio(row['voxmux'], row['raw'])} "
            f"| {_ratio(row['voxmux'], row['kokoro_onnx'])} "
            f"| {_ratio(row['voxmux'], row['fastkokoro'])} "
            f"| {systems['voxmux'][level]['cpu_s_per_audio_s']:.3f} |")
    if "voxmux_whole" in systems:
        lines += ["", "Same rounds, VoxMux with `VOXMUX_FIRST_SEGMENT_CHARS=450` (no short first "
                  "segment, for clients that want whole files):", "",
                  "| concurrency | VoxMux (whole) | / raw | / kokoro-onnx | / fastkokoro "
                  "| CPU s per audio s |", "|---|---|---|---|---|---|"]
        for level, row in systems["voxmux_whole"].items():
            rate = row["audio_s_per_s"]
            lines.append(
                f"| {level} | {rate:.2f} "
                f"| {_ratio(rate, systems['raw'][level]['audio_s_per_s'])} "
                f"| {_ratio(rate, systems['kokoro_onnx'][level]['audio_s_per_s'])} "
                f"| {_ratio(rate, systems['fastkokoro'][level]['audio_s_per_s'])} "
                f"| {row['cpu_s_per_audio_s']:.3f} |")
    lines += ["", "## One request: first audio and whole time, p50 (ms)", "",
              "| text | VoxMux first audio | raw first segment | fastkokoro first audio "
              "| VoxMux total | raw total | kokoro-onnx total | fastkokoro total |",
              "|---|---|---|---|---|---|---|---|"]
    for label, rows in result["latency"].items():
        lines.append(
            f"| {label} | {rows['voxmux']['ttfa_ms']['p50']:.0f} "
            f"| {rows['raw']['ttfa_ms']['p50']:.0f} | {rows['fastkokoro']['ttfa_ms']['p50']:.0f} "
            f"| {rows['voxmux']['total_ms']['p50']:.0f} | {rows['raw']['total_ms']['p50']:.0f} "
            f"| {rows['kokoro_onnx']['total_ms']['p50']:.0f} "
            f"| {rows['fastkokoro']['total_ms']['p50']:.0f} |")
    sim = result["simultaneous"]["systems"]
    lines += ["", "## Requests sent at once (five sentences each): first audio (s)", "",
              "| requests | VoxMux median | VoxMux last | fastkokoro median | fastkokoro last "
              "| kokoro-onnx last (whole text) |", "|---|---|---|---|---|---|"]
    for count in sim["voxmux"]:
        lines.append(
            f"| {count} | {sim['voxmux'][count]['ttfa_median_s']:.2f} "
            f"| {sim['voxmux'][count]['ttfa_last_s']:.2f} "
            f"| {sim['fastkokoro'][count]['ttfa_median_s']:.2f} "
            f"| {sim['fastkokoro'][count]['ttfa_last_s']:.2f} "
            f"| {sim['kokoro_onnx'][count]['ttfa_last_s']:.2f} |")
    lines += load.long_text_table(result["long_text"], "One long text", "kokoro-onnx")
    return "\n".join(lines) + "\n"


def main() -> None:
    run_benchmark("kokoro", __doc__.splitlines()[0], measure, summary)


if __name__ == "__main__":
    main()
