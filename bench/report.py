"""`run.json` -> `summary.md` (targets, ratio tables) and PNG plots beside it.

Run again on a finished result without measuring: `.venv/bin/python -m bench.report [RUN_JSON]`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from bench.common import RESULTS

NAMES = {"raw": "raw engine", "voxmux": "VoxMux", "voxmux_mp3": "VoxMux mp3",
         "voxmux_c1": "VoxMux (concurrency 1)", "peer": "piper-tts server"}
COLORS = {"raw": "#7f7f7f", "voxmux": "#1f77b4", "voxmux_mp3": "#aec7e8", "voxmux_c1": "#17becf",
          "peer": "#ff7f0e"}
LABELS = {"short": "short (1 sentence)", "medium": "medium (5)", "long": "long (20)"}

THROUGHPUT_MIN = 0.95
OVERHEAD_MAX = 0.05
TTFA_SHARE_MAX = 0.2
UNLOAD_MAX_MB = 50
SOAK_MAX_MB = 20


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}" if b else "n/a"


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def targets(result: dict[str, Any]) -> list[tuple[str, str, bool]]:
    rows: list[tuple[str, str, bool]] = []
    compare = result.get("compare")
    if compare:
        systems = compare["throughput"]["systems"]
        ratios = {int(c): systems["voxmux"][c]["audio_s_per_s"] / row["audio_s_per_s"]
                  for c, row in systems["raw"].items()}
        worst = min(ratios, key=lambda c: ratios[c])
        shown = ", ".join(f"{c}: {r:.2f}" for c, r in sorted(ratios.items()))
        rows.append((f"throughput >= {THROUGHPUT_MIN} x raw at every concurrency",
                     f"{shown} (worst at {worst})", ratios[worst] >= THROUGHPUT_MIN))
        latency = compare["latency"]
        over = {k: latency[k]["voxmux"]["total_ms"]["p50"] / latency[k]["raw"]["total_ms"]["p50"]
                - 1 for k in latency}
        shown = ", ".join(f"{k} {v:+.1%}" for k, v in over.items())
        rows.append((f"single-request latency overhead < {OVERHEAD_MAX:.0%} (p50)", shown,
                     max(over.values()) < OVERHEAD_MAX))
        long = latency["long"]
        share = long["voxmux"]["ttfa_ms"]["p50"] / long["peer"]["total_ms"]["p50"]
        rows.append((f"TTFA on 20 sentences < {TTFA_SHARE_MAX:g} x the peer's whole response",
                     f"{long['voxmux']['ttfa_ms']['p50']:.0f} ms / "
                     f"{long['peer']['total_ms']['p50']:.0f} ms = {share:.3f}",
                     share < TTFA_SHARE_MAX))
    mem = result.get("memory")
    if mem:
        parts = [f"{m} {row['after_unload_mb'] - row['before_mb']:+.1f} MB"
                 for m, row in mem["models"].items()]
        delta = mem["after_unload_delta_mb"]
        rows.append((f"RSS after idle unload within {UNLOAD_MAX_MB} MB of the pre-load baseline",
                     f"all models {delta:+.1f} MB (per model: {', '.join(parts)})",
                     delta <= UNLOAD_MAX_MB))
        soaks = mem["soaks"]
        rows.append((f"soak growth < {SOAK_MAX_MB} MB",
                     "; ".join(f"{s['growth_mb']:+.1f} MB over {s['requests']} {s['model']} "
                               f"requests" for s in soaks),
                     all(s["growth_mb"] < SOAK_MAX_MB for s in soaks)))
    return rows


def _machine(result: dict[str, Any]) -> str:
    m = result["machine"]
    text = (f"{m.get('cpu_model', '?')}, {m['cpus']} CPUs, {m['platform']}, "
            f"Python {m['python']}, {m['date']}")
    phases = result.get("phases", {})
    if phases:
        text += (". Share of the machine's CPU taken by other processes and by the hypervisor "
                 "(steal) during each phase: " + "; ".join(
                     f"{name} at {p['at']}: {_other_work(p)}" for name, p in phases.items()))
    return text


def _other_work(phase: dict[str, Any]) -> str:
    other = phase.get("other_work")
    if other is None:  # a phase kept from a run made before this was measured
        return "not measured"
    return f"others {other['others']:.1%}, steal {other['steal']:.1%}"


def summary(result: dict[str, Any]) -> str:
    lines = ["# VoxMux benchmark summary", ""]
    if result.get("quick"):
        lines += ["**Quick run: a smoke test of the harness, too few requests for the numbers "
                  "to mean anything.**", ""]
    lines += [f"Machine: {_machine(result)}.", "",
              "Same machine, same Piper voice (en_US-joe-medium), same texts. raw = VoxMux's "
              "Piper adapter called in-process, one `synthesize` per VoxMux segment; VoxMux = "
              "`voxmux serve` over HTTP, `response_format: pcm`, cache off; peer = piper-tts "
              "1.8.0's own server (`POST /synthesize`, one WAV).", "",
              "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    lines += [f"| {name} | {value} | {_yes(ok)} |" for name, value, ok in targets(result)]
    compare = result.get("compare")
    if compare:
        lines += ["", *_latency_table(compare), "", *_ttfa_table(compare), "",
                  *_throughput_table(compare), *_cpu_table(compare)]
    if result.get("cache"):
        lines += ["", *_cache_table(result["cache"])]
    if result.get("memory"):
        lines += ["", *_memory_table(result["memory"], compare)]
    return "\n".join(lines) + "\n"


def _latency_table(compare: dict[str, Any]) -> list[str]:
    latency = compare["latency"]
    names = list(next(iter(latency.values())))
    mp3 = "voxmux_mp3" in names
    lines = ["## Latency, whole response (ms)", "",
             "VoxMux as pcm unless marked mp3 (OpenAI's default format: the same audio plus "
             "the mp3 encoding).", "",
             "| text | n | raw p50 | VoxMux p50 | " + ("VoxMux mp3 p50 | " if mp3 else "")
             + "peer p50 | VoxMux / raw | " + ("VoxMux mp3 / raw | " if mp3 else "")
             + "VoxMux / peer |", "|---|---|---|---|---|---|---|" + ("---|---|" if mp3 else "")]
    for key, row in latency.items():
        p50 = {n: row[n]["total_ms"]["p50"] for n in names}
        cells = [LABELS[key], row["voxmux"]["total_ms"]["n"], f"{p50['raw']:.0f}",
                 f"{p50['voxmux']:.0f}", *([f"{p50['voxmux_mp3']:.0f}"] if mp3 else []),
                 f"{p50['peer']:.0f}", _ratio(p50["voxmux"], p50["raw"]),
                 *([_ratio(p50["voxmux_mp3"], p50["raw"])] if mp3 else []),
                 _ratio(p50["voxmux"], p50["peer"])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "Tails (ms, p95 / p99; with n requests p99 is the slowest but one or the "
              "slowest):", "", "| text | " + " | ".join(NAMES[n] for n in names) + " |",
              "|---|" + "---|" * len(names)]
    for key, row in latency.items():
        cells = [f"{row[n]['total_ms']['p95']:.0f} / {row[n]['total_ms']['p99']:.0f}"
                 for n in names]
        lines.append(f"| {LABELS[key]} | " + " | ".join(cells) + " |")
    return lines


def _ttfa_table(compare: dict[str, Any]) -> list[str]:
    lines = ["## Time to first audio (ms, p50)", "",
             "VoxMux streams each segment as it is done; the peer answers once the whole text "
             "is synthesized, so its first byte comes with its last.", "",
             "| text | VoxMux first audio | raw first segment | VoxMux whole | peer whole "
             "| VoxMux first audio / peer whole |", "|---|---|---|---|---|---|"]
    for key, row in compare["latency"].items():
        vox_first = row["voxmux"]["ttfa_ms"]["p50"]
        peer_total = row["peer"]["total_ms"]["p50"]
        lines.append(
            f"| {LABELS[key]} | {vox_first:.0f} | {row['raw']['ttfa_ms']['p50']:.0f} | "
            f"{row['voxmux']['total_ms']['p50']:.0f} | {peer_total:.0f} | "
            f"{_ratio(vox_first, peer_total)} |")
    return lines


def _throughput_table(compare: dict[str, Any]) -> list[str]:
    systems = compare["throughput"]["systems"]
    others = [s for s in ("voxmux_c1",) if s in systems]
    head = ["concurrency", "raw", "VoxMux", *[NAMES[s] for s in others], "peer",
            "VoxMux / raw", *[f"{NAMES[s]} / raw" for s in others], "VoxMux / peer"]
    lines = [f"## Throughput (audio seconds per wall second, "
             f"{compare['throughput']['sentences']}-sentence requests)", "",
             "Audio seconds are the raw engine's length for each text, so every system is "
             "credited alike for the same work.", *_noise_note(systems), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for level, raw in systems["raw"].items():
        value = {s: systems[s][level]["audio_s_per_s"] for s in systems}
        cells = [level, f"{value['raw']:.1f}", f"{value['voxmux']:.1f}",
                 *[f"{value[s]:.1f}" for s in others], f"{value['peer']:.1f}",
                 _ratio(value["voxmux"], raw["audio_s_per_s"]),
                 *[_ratio(value[s], raw["audio_s_per_s"]) for s in others],
                 _ratio(value["voxmux"], value["peer"])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def _cpu_table(compare: dict[str, Any]) -> list[str]:
    """CPU per audio second beside the throughput: the hypervisor's steal does not inflate it."""
    systems = compare["throughput"]["systems"]
    if "cpu_s_per_audio_s" not in next(iter(systems["raw"].values())):
        return []  # a run made before this was measured
    lines = ["", "CPU seconds per audio second in the same rounds (the benchmark's process and "
             "every process under it: the raw engine or the HTTP client, and the servers). "
             "Time the host gives to other machines stretches the wall clock, not this, so "
             "VoxMux's cost over raw reads here without that noise.", "",
             "| concurrency | raw | VoxMux | peer | VoxMux / raw |", "|---|---|---|---|---|"]
    for level, raw in systems["raw"].items():
        cpu = {s: systems[s][level]["cpu_s_per_audio_s"] for s in ("raw", "voxmux", "peer")}
        lines.append(f"| {level} | {cpu['raw']:.4f} | {cpu['voxmux']:.4f} | {cpu['peer']:.4f} | "
                     f"{_ratio(cpu['voxmux'], raw['cpu_s_per_audio_s'])} |")
    return lines


def _noise_note(systems: dict[str, Any]) -> list[str]:
    """At one request at a time the two VoxMux servers are the same setup: their gap is noise."""
    if "voxmux_c1" not in systems:
        return []
    a = systems["voxmux"]["1"]["audio_s_per_s"] if "1" in systems["voxmux"] else None
    b = systems["voxmux_c1"]["1"]["audio_s_per_s"] if "1" in systems["voxmux_c1"] else None
    if not a or not b:
        return []
    return [f"Noise floor: at concurrency 1 both VoxMux servers do exactly the same thing, and "
            f"they differ by {abs(a / b - 1):.1%} in this run."]


def _cache_table(cache: dict[str, Any]) -> list[str]:
    lines = ["## Cache hit against miss (Piper, ms, median)", "",
             "| sentences | format | miss whole | hit first byte | hit whole | speed-up |",
             "|---|---|---|---|---|---|"]
    for row in cache["rows"]:
        lines.append(f"| {row['sentences']} | {row['format']} | {row['miss_total_ms']:.0f} | "
                     f"{row['hit_ttfb_ms']:.1f} | {row['hit_total_ms']:.1f} | "
                     f"{row['speedup_total']}x |")
    return lines


def _memory_table(mem: dict[str, Any], compare: dict[str, Any] | None) -> list[str]:
    lines = ["## Memory (RSS of the server process, MB)", "",
             f"Pre-load baseline (nothing loaded, routes warmed): {mem['baseline_mb']:.0f} MB. "
             f"Models loaded one after another by one short request each, then unloaded by a "
             f"{mem['idle_ttl_s']:g} s idle TTL.", "",
             "| model | before | loaded | model's share | after idle unload | left behind "
             "| loaded again | after a second unload |", "|---|---|---|---|---|---|---|---|"]
    for model, row in mem["models"].items():
        lines.append(f"| {model} | {row['before_mb']:.0f} | {row['loaded_mb']:.0f} | "
                     f"{row['model_mb']:+.0f} | {row['after_unload_mb']:.0f} | "
                     f"{row['after_unload_mb'] - row['before_mb']:+.1f} | "
                     f"{row['second_loaded_mb']:.0f} | {row['second_after_unload_mb']:.0f} |")
    lines += ["", f"After every model unloaded: {mem['after_unload_mb']:.0f} MB "
              f"({mem['after_unload_delta_mb']:+.1f} MB against the baseline).", ""]
    lines += [f"Soak: {s['requests']} short {s['model']} requests, one after another, after "
              f"{s['warmup']} warm-up, in {s['wall_s']:.0f} s: growth {s['growth_mb']:+.1f} MB "
              f"({s['growth_statistic']}); first sample {s['start_mb']:.0f} MB, last "
              f"{s['end_mb']:.0f} MB, range {s['min_mb']:.0f}-{s['max_mb']:.0f} MB."
              for s in mem["soaks"]]
    if compare:
        rss = compare["rss"]
        lines += ["", f"With the Piper voice loaded, after the comparison runs: VoxMux "
                  f"{rss['voxmux_piper_loaded_mb']:.0f} MB (all three engines' code, Piper "
                  f"loaded), piper-tts's server {rss['peer_loaded_mb']:.0f} MB."]
    return lines


def plot_latency(compare: dict[str, Any], path: Path) -> None:
    latency = compare["latency"]
    fig = Figure(figsize=(11, 3.6))
    axes = fig.subplots(1, len(latency))
    for ax, (key, row) in zip(axes, latency.items(), strict=True):
        names = list(row)
        p50 = [row[n]["total_ms"]["p50"] for n in names]
        p95 = [row[n]["total_ms"]["p95"] for n in names]
        ax.bar(range(len(names)), p50, color=[COLORS[n] for n in names],
               yerr=[[0] * len(names), [b - a for a, b in zip(p50, p95, strict=True)]],
               capsize=4)
        ttfa = row["voxmux"]["ttfa_ms"]["p50"]
        ax.hlines(ttfa, names.index("voxmux") - 0.4, names.index("voxmux") + 0.4,
                  colors="black", linestyles="dashed", label="VoxMux first audio")
        ax.set_xticks(range(len(names)), [NAMES[n].replace(" ", "\n", 1) for n in names],
                      fontsize=8)
        ax.set_title(LABELS[key])
        ax.set_ylabel("ms (bar p50, whisker p95)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_throughput(compare: dict[str, Any], path: Path) -> None:
    systems = compare["throughput"]["systems"]
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    for name, levels in systems.items():
        xs = [int(c) for c in levels]
        ax.plot(xs, [levels[c]["audio_s_per_s"] for c in levels], marker="o",
                color=COLORS[name], label=NAMES[name])
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("audio seconds per wall second")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_memory(mem: dict[str, Any], path: Path) -> None:
    fig = Figure(figsize=(11, 3.6))
    left, right = fig.subplots(1, 2)
    steps = [("baseline", mem["baseline_mb"])]
    for model, row in mem["models"].items():
        steps += [(f"{model}\nloaded", row["loaded_mb"]), (f"{model}\nunloaded",
                                                           row["after_unload_mb"])]
    left.bar(range(len(steps)), [v for _, v in steps], color="#1f77b4")
    left.axhline(mem["baseline_mb"] + UNLOAD_MAX_MB, color="red", linestyle="dashed",
                 label=f"baseline + {UNLOAD_MAX_MB} MB")
    left.set_xticks(range(len(steps)), [k for k, _ in steps], fontsize=7)
    left.set_ylabel("RSS (MB)")
    left.set_title("load and idle unload")
    left.legend(fontsize=8)
    lows, highs = [], []
    for soak in mem["soaks"]:
        xs, ys = zip(*soak["samples"], strict=True)
        start = ys[0]
        growth = [y - start for y in ys]
        right.plot(xs, growth, marker=".",
                   label=f"{soak['model']} (from {start:.0f} MB): {soak['growth_mb']:+.1f} MB")
        lows.append(min(growth))
        highs.append(max(growth))
    right.axhline(SOAK_MAX_MB, color="red", linestyle="dashed", label=f"+{SOAK_MAX_MB} MB")
    right.set_xlabel("requests")
    right.set_ylabel("RSS growth since the first sample (MB)")
    right.set_title("soak")
    right.set_ylim(min(lows) - 5, max(*highs, SOAK_MAX_MB) + 5)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write(run_json: Path, folder: Path) -> None:
    result = json.loads(run_json.read_text())
    (folder / "summary.md").write_text(summary(result))
    if result.get("compare"):
        plot_latency(result["compare"], folder / "latency.png")
        plot_throughput(result["compare"], folder / "throughput.png")
    if result.get("memory"):
        plot_memory(result["memory"], folder / "memory.png")


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else RESULTS / "run.json"
    write(source, source.parent)
    print((source.parent / "summary.md").read_text())
