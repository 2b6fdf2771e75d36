"""The GPU check's Kokoro precision sweep runs on CPU too (as the GPU machine will run it, on
other providers) and reports what its docstring promises."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import pytest

from app.settings import Settings
from bench import gpu_check, gpu_sweep
from tests.conftest import CACHE_DIR


def test_the_sweep_measures_every_level_and_renders(tmp_path: Path) -> None:
    settings = Settings(cache_dir=CACHE_DIR, models_dir=tmp_path)
    # The sweep's bookkeeping is the subject: a short text and one first-audio run (not the
    # best of three) spare Kokoro runs that check nothing more.
    result = gpu_sweep.measure(settings, "int8", [1, 2], rounds=1, text="On time.",
                               first_audio_tries=1)
    assert result.providers == ["CPUExecutionProvider"] and not result.error
    assert [level.concurrency for level in result.levels] == [1, 2]
    assert [level.requests for level in result.levels] == [1, 2]
    for level in result.levels:
        # "On time." measured 1.6 s of Kokoro's speech (padding included), per request
        assert level.audio_s > 1.2 * level.requests
        assert 0 < level.rtf <= level.request_rtf_max * 1.01
    assert result.first_audio_s is not None and result.first_audio_s > 0
    fields = set(asdict(result))
    for promised in ("precision", "providers", "fallbacks", "build_s", "load_s", "first_audio_s",
                     "levels", "vram_process_mib", "vram_device_delta_mib", "error"):
        assert promised in fields and promised in (gpu_check.__doc__ or "")
    table = gpu_sweep.render([result])
    assert "int8" in table and "RTF@2" in table
    markdown = gpu_sweep.markdown([result]).splitlines()
    assert len({line.count("|") for line in markdown}) == 1  # header, rule and rows line up


def test_the_batch_sweep_compares_piper_batching_off_and_on(tmp_path: Path) -> None:
    # A wait long enough for the two threads to meet on a busy machine (a full run does not
    # wait): 5 ms missed once under a load of 15.
    settings = Settings(cache_dir=CACHE_DIR, models_dir=tmp_path, engine_batch_wait_ms=500)
    off, on = gpu_sweep.piper_batching(settings, [1, 2], [2], rounds=1, text="On time.")
    assert not off.error and not on.error
    assert off.mean_run == 1.0 and on.mean_run is not None and on.mean_run > 1.0  # they met
    for result in (off, on):
        (level,) = result.levels
        assert level.requests == 2 and level.audio_s > 0.5
    assert "piper_batching" in (gpu_check.__doc__ or "")
    markdown = gpu_sweep.batch_markdown([off, on]).splitlines()
    assert len({line.count("|") for line in markdown}) == 1


def test_the_instances_sweep_writes_a_cell_per_setting_in_the_promised_shape(
        tmp_path: Path) -> None:
    """The GPU check's instances x concurrency sweep, tiny, on CPU (the GPU machine runs the
    same code on CUDA): each cell is an object other tools can read by these names."""
    import json

    settings = Settings(cache_dir=CACHE_DIR, models_dir=tmp_path)
    cells, notes = gpu_sweep.instances_sweep(
        settings, [gpu_sweep.SweepTarget("piper", "CPUExecutionProvider")], [1, 2], [1, 2],
        requests=2, segments=["On time.", "The train left."])
    assert notes == []
    assert [(c.instances, c.concurrency) for c in cells] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for cell in json.loads(json.dumps([asdict(c) for c in cells])):
        assert cell["model"] == "piper" and cell["requests"] == 2
        assert isinstance(cell["instances"], int) and isinstance(cell["concurrency"], int)
        for name in ("x_realtime", "first_audio_s", "first_audio_p95_s"):
            assert isinstance(cell[name], float) and cell[name] > 0, name
        assert cell["first_audio_s"] <= cell["first_audio_p95_s"]
        # two segments of about a second each: the first is heard before the whole request
        assert cell["audio_s"] > 1.0 and cell["providers"] == ["CPUExecutionProvider"]
        assert cell["vram_per_instance_mib"] is None
    for promised in ("model", "instances", "concurrency", "x_realtime", "first_audio_s",
                     "first_audio_p95_s"):
        assert promised in (gpu_check.__doc__ or "")
    table = gpu_sweep.cells_markdown(cells).splitlines()
    assert len(table) == 4 and len({line.count("|") for line in table}) == 1
    late, skipped = gpu_sweep.instances_sweep(
        settings, [gpu_sweep.SweepTarget("piper", "CPUExecutionProvider")], [1], [1],
        deadline=0.0)
    assert late == [] and skipped == ["piper CPUExecutionProvider x1: out of time"]


@pytest.mark.parametrize("bad", [
    ["--instances", "1,x"], ["--instances", "0"], ["--instances", "1,99"],
    ["--piper-batch", "8,abc"], ["--piper-batch", "0"],
    ["--sweep-targets", "piper@TPU"], ["--sweep-targets", "piper"],
])
def test_a_bad_sweep_argument_is_refused_before_any_model_runs(
        bad: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    """A device call is minutes: a typo in the sweep's arguments is a usage error at once, not a
    traceback after every model was checked."""
    def checked(*args: object) -> None:
        raise AssertionError("a model was checked before the arguments were")

    monkeypatch.setattr(gpu_check, "check_model", checked)
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--models", "piper", "--precisions", "none", "--kokoro-batch", "off",
                        *bad])
    assert exit_.value.code == 2
    assert "error: argument " + bad[0] in capsys.readouterr().err
