from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from app.audio.dsp import (
    fade_edges,
    pause,
    peak_limit,
    pitch_shift,
    resample,
    time_stretch,
    trim_silence,
)

RATE = 24000


def tone(seconds: float, freq: float = 440.0, amplitude: float = 0.5) -> npt.NDArray[np.float32]:
    t = np.arange(round(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def voice_like(seconds: float) -> npt.NDArray[np.float32]:
    """Harmonics of a gliding 110-150 Hz pitch under a syllable-rate envelope."""
    t = np.arange(round(seconds * RATE)) / RATE
    phase = 2 * np.pi * np.cumsum(130 + 20 * np.sin(2 * np.pi * 0.7 * t)) / RATE
    harmonics: npt.NDArray[np.float64] = np.stack([np.sin(h * phase) / h for h in range(1, 9)]).sum(
        axis=0
    )
    return (0.2 * harmonics * (0.3 + 0.7 * np.sin(2 * np.pi * 3 * t) ** 2)).astype(np.float32)


def dominant_frequency(samples: npt.NDArray[np.float32]) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.argmax(spectrum) * RATE / samples.size)


def rms(samples: npt.NDArray[np.float32]) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))


FACTORS = [0.5, 0.8, 1.5, 2.0, 2.5]


@pytest.mark.parametrize("factor", FACTORS)
def test_time_stretch_changes_length_by_the_factor(factor: float) -> None:
    samples = voice_like(3.0)

    stretched = time_stretch(samples, factor, RATE)

    assert stretched.dtype == np.float32
    assert abs(stretched.size - samples.size / factor) <= 1


@pytest.mark.parametrize("factor", FACTORS)
@pytest.mark.parametrize("freq", [180.0, 440.0])
def test_time_stretch_keeps_pitch_and_level(factor: float, freq: float) -> None:
    samples = tone(2.0, freq)

    stretched = time_stretch(samples, factor, RATE)

    assert dominant_frequency(stretched) == pytest.approx(freq, rel=0.02)
    # Misaligned overlap-add cancels partly and shows up as level dips.
    middle = stretched[RATE // 10 : -RATE // 10]
    assert rms(middle) == pytest.approx(rms(samples), rel=0.03)
    assert np.max(np.abs(middle)) < 0.5 * 1.05


@pytest.mark.parametrize("factor", FACTORS)
def test_time_stretch_moves_events_in_time(factor: float) -> None:
    samples = np.zeros(3 * RATE, dtype=np.float32)
    samples[RATE : RATE + RATE // 5] = tone(0.2, 300.0)

    stretched = time_stretch(samples, factor, RATE)

    loud = np.flatnonzero(np.abs(stretched) > 0.25)
    assert loud[0] / RATE == pytest.approx(1.0 / factor, abs=0.03)
    assert loud[-1] / RATE == pytest.approx(1.2 / factor, abs=0.03)


def test_time_stretch_of_one_and_edge_cases() -> None:
    samples = voice_like(0.5)
    original = samples.copy()

    assert np.array_equal(time_stretch(samples, 1.0, RATE), samples)
    time_stretch(samples, 1.7, RATE)
    assert np.array_equal(samples, original)
    assert time_stretch(np.zeros(0, dtype=np.float32), 2.0, RATE).size == 0
    assert time_stretch(samples[:50], 0.5, RATE).size == 100
    with pytest.raises(ValueError):
        time_stretch(samples, 0.0, RATE)


def test_trim_silence_keeps_a_short_margin() -> None:
    sound = voice_like(1.0)
    noise = np.random.default_rng(1).normal(0, 1e-4, RATE).astype(np.float32)
    samples = np.concatenate([noise[: RATE // 2], sound, noise[: RATE * 7 // 10]])

    trimmed = trim_silence(samples, RATE, keep_ms=30)

    assert trimmed.dtype == np.float32
    assert sound.size <= trimmed.size <= sound.size + round(0.07 * RATE)
    start = int(np.flatnonzero(np.abs(trimmed) > 0.01)[0])
    assert 0.02 * RATE <= start <= 0.04 * RATE


def test_trim_silence_never_empties_sound_and_leaves_silence_alone() -> None:
    click = np.zeros(RATE, dtype=np.float32)
    click[5000:5048] = 0.5
    silent = np.zeros(RATE, dtype=np.float32)

    trimmed = trim_silence(click, RATE, keep_ms=0)

    assert 48 <= trimmed.size <= 48 + 2 * round(0.005 * RATE)
    assert np.max(trimmed) == pytest.approx(0.5)
    assert trim_silence(silent, RATE).size == RATE
    assert trim_silence(np.zeros(0, dtype=np.float32), RATE).size == 0


def test_fade_edges_starts_and_ends_at_zero() -> None:
    samples = np.full(RATE, 0.8, dtype=np.float32)

    faded = fade_edges(samples, RATE, ms=5.0)

    assert faded.size == samples.size
    assert faded[0] == 0.0
    assert abs(faded[-1]) < 1e-6
    assert np.all(np.diff(faded[:120]) >= 0)
    assert np.array_equal(faded[120:-120], samples[120:-120])
    assert np.all(samples == np.float32(0.8))
    assert fade_edges(np.ones(3, dtype=np.float32), RATE).size == 3


def test_pause_is_silence_of_the_given_length() -> None:
    gap = pause(RATE, 250)

    assert gap.dtype == np.float32
    assert gap.size == RATE // 4
    assert not np.any(gap)
    assert pause(RATE, 0).size == 0
    with pytest.raises(ValueError):
        pause(RATE, -1)


def test_peak_limit_scales_without_clipping() -> None:
    loud = tone(0.1, amplitude=1.5)

    limited = peak_limit(loud)

    assert np.max(np.abs(limited)) == pytest.approx(0.98, abs=1e-6)
    assert np.allclose(limited, loud * (0.98 / np.max(np.abs(loud))), atol=1e-6)
    assert np.max(np.abs(loud)) == pytest.approx(1.5, abs=1e-3)
    quiet = tone(0.1, amplitude=0.5)
    assert np.array_equal(peak_limit(quiet), quiet)
    assert peak_limit(np.zeros(0, dtype=np.float32)).size == 0


@pytest.mark.parametrize("factor", [0.75, 0.88, 1.12, 1.25, 1.5])
@pytest.mark.parametrize("freq", [150.0, 220.0])
def test_pitch_shift_moves_the_pitch_and_keeps_the_length(factor: float, freq: float) -> None:
    samples = tone(2.0, freq)

    shifted = pitch_shift(samples, factor, RATE)

    assert shifted.dtype == np.float32
    assert abs(shifted.size - samples.size) <= samples.size * 0.002
    assert dominant_frequency(shifted) == pytest.approx(freq * factor, rel=0.02)
    middle = shifted[RATE // 10 : -RATE // 10]
    assert rms(middle) == pytest.approx(rms(samples), rel=0.05)


def test_pitch_shift_of_one_is_the_input() -> None:
    samples = voice_like(1.0)
    assert np.array_equal(pitch_shift(samples, 1.0, RATE), samples)


@pytest.mark.parametrize(("source", "target"), [(22050, 24000), (24000, 22050), (16000, 48000)])
def test_resample_keeps_pitch_and_duration(source: int, target: int) -> None:
    t = np.arange(2 * source) / source
    samples = (0.5 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)

    out = resample(samples, source, target)

    assert out.dtype == np.float32 and abs(out.size - 2 * target) <= 2
    spectrum = np.abs(np.fft.rfft(out * np.hanning(out.size)))
    assert np.argmax(spectrum) * target / out.size == pytest.approx(300, rel=0.01)
