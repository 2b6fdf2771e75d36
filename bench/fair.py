"""Fair streaming on the fast engines: requests sent at once, and one long Piper text.

    .venv/bin/python -m bench.fair            # writes bench/results/fair.json and fair.md
    .venv/bin/python -m bench.fair --quick    # a smoke test; numbers not meant

The Kokoro rows of the same two measurements are in `bench.kokoro` (with its peers). Systems:
- `voxmux` / `voxmux_espeak`: `voxmux serve` at the cpu profile's defaults (one engine call per
  model at a time), `POST /v1/audio/speech` as pcm, read as a stream, on `piper` and `espeak`;
- `raw`: VoxMux's Piper adapter in this process, one call per VoxMux segment;
- `piper_tts`: piper-tts 1.8.0's `PiperVoice.synthesize` in a process of its own (the peer venv
  of `bench.peer`), timed inside that process: its first audio is its first sentence's chunk.
Phases, interleaved round by round:
1. first audio of each of 1, 4 and 8 requests sent at once (five sentences each);
2. one long text (30 sentences) on Piper, whole time, each round's ratio to piper-tts.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any

from app.settings import load_settings
from bench import load
from bench.common import (
    ROOT,
    process_server,
    run_benchmark,
    timed_phase,
    voxmux_process,
)
from bench.peer import ensure_venv, voice_path
from bench.systems import HttpSystem, RawPiper, Sample, System, VoxMuxClient

VOXMUX_ENV = {"VOXMUX_PRELOAD": "piper,espeak", "VOXMUX_CACHE_MAX_ITEMS": "0",
              "VOXMUX_IDLE_TTL": "-1", "VOXMUX_QUEUE_SIZE": "64"}


class PiperTtsClient(HttpSystem):
    """The peer's own times (`X-First-Seconds`, `X-Seconds`) from inside its process."""

    name = "piper_tts"

    def request(self, text: str) -> Sample:
        response, _, size = self.post("/synthesize", {"text": text}, time.perf_counter())
        rate = int(response.headers["x-sample-rate"])
        return Sample(float(response.headers["x-first-seconds"]),
                      float(response.headers["x-seconds"]), size / 2 / rate)


def measure(quick: bool) -> dict[str, Any]:
    logs = ROOT / "var" / "bench"
    phases: dict[str, Any] = {}
    result: dict[str, Any] = {"quick": quick, "voxmux_env": VOXMUX_ENV, "phases": phases}
    with ExitStack() as stack:
        raw = RawPiper(load_settings("cpu"))
        vox = stack.enter_context(voxmux_process(VOXMUX_ENV))
        peer = stack.enter_context(process_server(
            [str(ensure_venv()), str(ROOT / "bench" / "peers" / "piper_server.py"),
             str(voice_path()), "{port}"], "/", logs / "piper_tts.log", cwd=ROOT / "var"))
        piper, espeak = (VoxMuxClient(vox.url, name="voxmux", model="piper"),
                         VoxMuxClient(vox.url, name="voxmux_espeak", model="espeak"))
        piper_tts = PiperTtsClient(peer.url)
        for client in (piper, espeak, piper_tts):
            stack.callback(client.close)
        systems: list[System] = [piper, espeak, piper_tts]
        for system in systems:  # warm up: first-run costs belong to no figure
            system.request(load.text(1, 0))
        with timed_phase("simultaneous", phases):
            result["simultaneous"] = {"sentences": 5, "systems": load.simultaneous(
                systems, (1, 4) if quick else (1, 4, 8), 5, 1 if quick else 3)}
        with timed_phase("long_text", phases):
            result["long_text"] = load.long_text([raw, piper, piper_tts], 8 if quick else 30,
                                                 1 if quick else 3, reference="piper_tts")
    return result


def summary(result: dict[str, Any]) -> str:
    machine = result["machine"]
    lines = ["# Fair streaming: Piper and eSpeak NG", "",
             f"{machine['cpu_model']}, {machine['cpus']} CPUs, {machine['date']}. Voice "
             "en_US-joe-medium (Piper), en-us (eSpeak NG). Reproduce: "
             "`.venv/bin/python -m bench.fair`. Kokoro's rows: `kokoro.md`.", "",
             "Share of the machine other processes took during each phase: " + ", ".join(
                 f"{k} {v['other_work']['others']:.0%}" for k, v in result["phases"].items())
             + ".", "",
             "## Requests sent at once (five sentences each): first audio (s)", "",
             "piper-tts in-process yields one chunk per sentence; its first audio is that "
             "chunk, timed inside its process.", "",
             "| requests | VoxMux Piper median | VoxMux Piper last | VoxMux eSpeak NG median "
             "| VoxMux eSpeak NG last | piper-tts median | piper-tts last |",
             "|---|---|---|---|---|---|---|"]
    sim = result["simultaneous"]["systems"]
    for count in sim["voxmux"]:
        cells = [f"{sim[name][count][key]:.3f}" for name in ("voxmux", "voxmux_espeak",
                                                               "piper_tts")
                 for key in ("ttfa_median_s", "ttfa_last_s")]
        lines.append(f"| {count} | " + " | ".join(cells) + " |")
    lines += load.long_text_table(result["long_text"], "One long Piper text", "piper-tts")
    return "\n".join(lines) + "\n"


def main() -> None:
    run_benchmark("fair", __doc__.splitlines()[0], measure, summary)


if __name__ == "__main__":
    main()
