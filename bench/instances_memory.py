"""Memory of each extra onnxruntime session of one graph (`VOXMUX_INSTANCES`), on CPU.

    python bench/instances_memory.py [--instances 4] [--precisions int8,fp32] [--out DIR]

For each Kokoro graph precision and each way of opening the sessions, a fresh process opens
sessions of the graph one by one, runs one short inference on each (its arena grows to what a
run needs) and reads its RSS (`/proc/self/status`, after `malloc_trim`) after each: the growth
over the process before the first session is what the instances cost.

Ways of opening:
- `plain` (what `engines.onnx.open_pool` does): each session reads the graph file on its own.
- `shared`: the graph's weights are read once (the `onnx` package) into arrays that every
  session is handed as its initializers (`SessionOptions.add_initializer`: onnxruntime uses the
  caller's buffer, no copy of its own); the arrays count from the first instance on.
- `shared-unpacked`: `shared` with `session.disable_prepacking`, so that no session keeps its own
  packed copy of the weights its matrix kernels reorder (onnxruntime's Python API has no
  `PrepackedWeightsContainer`, the C API's way to share those copies).

`--speed` also times one inference of a 100-token input per way (the best of 3), since the
packed copies are what make the fp32 graph's matrix products fast.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MODES = ("plain", "shared", "shared-unpacked")


def rss_mib() -> float:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def child(precision: str, mode: str, instances: int, cache_dir: str, speed: bool
          ) -> dict[str, object]:
    """In a process of its own: RSS growth after each instance's first run, in MiB."""
    import numpy as np
    import onnxruntime as ort

    from engines.kokoro import prepare_model

    path = prepare_model(Path(cache_dir), precision)  # type: ignore[arg-type]
    feeds = {"tokens": np.array([[0, *range(16, 66), 0]], dtype=np.int64),
             "style": np.zeros((1, 256), np.float32), "speed": np.ones(1, np.float32)}
    before = rss_mib()
    shared: dict[str, object] = {}
    source: str | bytes = str(path)
    if mode != "plain":
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(path))
        arrays = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        shared = {name: ort.OrtValue.ortvalue_from_numpy(a) for name, a in arrays.items()}
        source = model.SerializeToString()
        del model
    sessions = []
    growth = []
    for _ in range(instances):
        options = ort.SessionOptions()
        options.enable_mem_pattern = False
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        for name, value in shared.items():
            options.add_initializer(name, value)
        if mode == "shared-unpacked":
            options.add_session_config_entry("session.disable_prepacking", "1")
        session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
        session.run(None, feeds)
        sessions.append(session)
        growth.append(round(rss_mib() - before, 1))
    result: dict[str, object] = {"precision": precision, "mode": mode, "rss_growth_mib": growth}
    if speed:
        long = {**feeds, "tokens": np.array([[0, *range(16, 116), 0]], dtype=np.int64)}
        times = []
        for _ in range(3):
            start = time.perf_counter()
            sessions[0].run(None, long)
            times.append(time.perf_counter() - start)
        result["run_s"] = round(min(times), 3)
    return result


def measure(precision: str, mode: str, instances: int, cache_dir: Path, speed: bool
            ) -> dict[str, object]:
    code = ("import json; from bench.instances_memory import child; "
            f"print(json.dumps(child({precision!r}, {mode!r}, {instances}, {str(cache_dir)!r}, "
            f"{speed})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def markdown(rows: list[dict[str, object]]) -> str:
    count = max(len(row["rss_growth_mib"]) for row in rows)  # type: ignore[arg-type]
    lines = ["| graph | sessions opened | " + " | ".join(f"RSS {n} MiB" for n in
                                                        range(1, count + 1))
             + " | per extra instance MiB | 100-token run s |",
             "|---|---|" + "---|" * count + "---|---|"]
    for row in rows:
        growth: list[float] = row["rss_growth_mib"]  # type: ignore[assignment]
        extra = round((growth[-1] - growth[0]) / (len(growth) - 1), 1) if len(growth) > 1 else "-"
        lines.append(f"| {row['precision']} | {row['mode']} | "
                     + " | ".join(str(g) for g in growth)
                     + f" | {extra} | {row.get('run_s', '-')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--precisions", default="int8,fp32")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--cache-dir", type=Path, default=ROOT / "var" / "test-cache")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--out", type=Path, help="write instances_memory.json here")
    args = parser.parse_args(argv)
    rows = []
    for precision in args.precisions.split(","):
        for mode in args.modes.split(","):
            rows.append(measure(precision, mode, args.instances, args.cache_dir, args.speed))
            print(json.dumps(rows[-1]), flush=True)
    print(markdown(rows))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "instances_memory.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
