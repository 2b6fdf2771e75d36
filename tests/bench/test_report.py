"""The committed benchmark result renders into the README's tables and plots, and each target's
verdict follows the numbers."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import report
from bench.common import RESULTS


@pytest.fixture
def result() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RESULTS / "run.json").read_text())
    return data


def verdicts(result: dict[str, Any]) -> dict[str, bool]:
    return {name.split(" ")[0]: ok for name, _, ok in report.targets(result)}


def test_the_committed_run_renders_its_tables_and_plots(tmp_path: Path) -> None:
    shutil.copy(RESULTS / "run.json", tmp_path / "run.json")
    report.write(tmp_path / "run.json", tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    for heading in ("## Targets", "## Latency", "## Time to first audio", "## Throughput",
                    "CPU seconds per audio second", "## Cache hit", "## Memory"):
        assert heading in summary
    assert "steal" in summary  # the host's share is stated with the machine
    for plot in ("latency.png", "throughput.png", "memory.png"):
        data = (tmp_path / plot).read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000


def test_each_target_is_judged_on_its_own_numbers(result: dict[str, Any]) -> None:
    assert set(verdicts(result)) == {"throughput", "single-request", "TTFA", "RSS", "soak"}

    slow = copy.deepcopy(result)
    systems = slow["compare"]["throughput"]["systems"]
    systems["voxmux"]["8"]["audio_s_per_s"] = systems["raw"]["8"]["audio_s_per_s"] * 0.94
    assert verdicts(slow)["throughput"] is False

    late = copy.deepcopy(result)
    latency = late["compare"]["latency"]["long"]
    latency["voxmux"]["total_ms"]["p50"] = latency["raw"]["total_ms"]["p50"] * 1.06
    assert verdicts(late)["single-request"] is False

    leaky = copy.deepcopy(result)
    leaky["memory"]["after_unload_delta_mb"] = report.UNLOAD_MAX_MB + 1
    leaky["memory"]["soaks"][0]["growth_mb"] = report.SOAK_MAX_MB
    assert verdicts(leaky)["RSS"] is False and verdicts(leaky)["soak"] is False

    first = copy.deepcopy(result)
    long = first["compare"]["latency"]["long"]
    long["voxmux"]["ttfa_ms"]["p50"] = long["peer"]["total_ms"]["p50"] * report.TTFA_SHARE_MAX
    assert verdicts(first)["TTFA"] is False
