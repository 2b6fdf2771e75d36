"""Sample-level helpers for joining synthesized segments: tempo, pitch, rate, silence, fades,
limiting.

Every function takes mono samples, returns float32 and never mutates its input; where nothing
needs to change the input itself may be returned (as float32).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import soxr

Samples = npt.NDArray[np.float32]

AUDIO_REVISION = 2
"""Bump with any change here (or in how segments are joined) that changes rendered samples: it
is part of every cache key, so audio cached by an older VoxMux is not served after it. 2: a
segment before an SSML break ends where its sound does, and edge breaks are in the audio."""

_FRAME_MS = 24.0
_TOLERANCE_MS = 8.0
"""WSOLA search radius: at least one pitch period of a low voice (~125 Hz)."""


def _mono(samples: npt.ArrayLike) -> Samples:
    return np.asarray(samples, dtype=np.float32).reshape(-1)


def resample(samples: npt.ArrayLike, from_rate: int, to_rate: int) -> Samples:
    """One whole clip from `from_rate` to `to_rate` (soxr, high quality)."""
    audio = _mono(samples)
    if from_rate == to_rate or not len(audio):
        return audio
    return np.asarray(soxr.resample(audio, from_rate, to_rate, quality="HQ"), dtype=np.float32)


def pitch_shift(samples: npt.ArrayLike, factor: float, sample_rate: int) -> Samples:
    """Raise (`factor` > 1) or lower the pitch, keeping the duration: the clip is made `factor`
    times longer at its own pitch (`time_stretch`), then read `factor` times faster (soxr), which
    scales the pitch by `factor` and brings the length back."""
    audio = _mono(samples)
    if abs(factor - 1.0) < 1e-3 or not len(audio):
        return audio
    longer = time_stretch(audio, 1.0 / factor, sample_rate)
    return np.asarray(soxr.resample(longer, sample_rate * factor, sample_rate, quality="HQ"),
                      dtype=np.float32)


def time_stretch(samples: npt.ArrayLike, factor: float, sample_rate: int) -> Samples:
    """Change tempo by `factor` (> 1 is faster) keeping pitch; output length ~ len / factor.

    WSOLA: Hann frames are overlap-added at a fixed output hop while the read position advances
    `factor` times faster; each frame is shifted by up to `_TOLERANCE_MS` to the offset whose
    waveform best continues the previous frame, so periods line up and no phasing is heard.
    """
    if not factor > 0:
        raise ValueError(f"stretch factor must be positive, got {factor}")
    x = _mono(samples)
    if factor == 1.0 or x.size == 0:
        return x
    hop = max(8, round(sample_rate * _FRAME_MS / 2000))
    size = 2 * hop
    radius = max(1, round(sample_rate * _TOLERANCE_MS / 1000))
    in_hop = hop * factor
    out_len = round(x.size / factor)
    frames = -(-out_len // hop) + 1
    # Frame k is centred on input sample k * in_hop; the front pad puts frame 0's start at `radius`.
    lead = hop + radius
    needed = round((frames - 1) * in_hop) + 2 * radius + size + hop + 1
    padded = np.zeros(max(needed, lead + x.size), dtype=np.float32)
    padded[lead : lead + x.size] = x

    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(size) / size)).astype(np.float32)
    span = size + 2 * radius
    nfft = 1 << (span - 1).bit_length()
    out = np.zeros(frames * hop + size, dtype=np.float32)
    pos = radius
    for k in range(frames):
        if k:
            template = padded[pos + hop : pos + hop + size] * window
            start = round(k * in_hop)  # = nominal start of frame k minus the search radius
            region = padded[start : start + span]
            spectrum = np.fft.rfft(region, nfft) * np.conj(np.fft.rfft(template, nfft))
            scores = np.fft.irfft(spectrum, nfft)[: 2 * radius + 1]
            energy = np.cumsum(np.square(region, dtype=np.float64))
            energy = energy[size - 1 :] - np.concatenate(([0.0], energy[:-size]))
            pos = start + int(np.argmax(scores / np.sqrt(energy + 1e-9)))
        out[k * hop : k * hop + size] += padded[pos : pos + size] * window
    return out[hop : hop + out_len]


KEEP_MS = 30.0
"""Silence `trim_silence` keeps around the sound by default."""


def trim_silence(
    samples: npt.ArrayLike, sample_rate: int, threshold: float = 0.003, keep_ms: float = KEEP_MS
) -> Samples:
    """Cut leading and trailing silence, keeping `keep_ms` around the sound.

    Silence is judged on 5 ms blocks whose RMS is below `threshold`, so a stray sample of noise
    does not count as sound. All-silent input comes back unchanged.
    """
    x = _mono(samples)
    start, end = voiced_span(x, sample_rate, threshold, keep_ms)
    return x if (start, end) == (0, x.size) else x[start:end].copy()


def voiced_span(
    samples: npt.ArrayLike, sample_rate: int, threshold: float = 0.003, keep_ms: float = KEEP_MS
) -> tuple[int, int]:
    """(start, end) of what `trim_silence` keeps; (0, len) for all-silent input."""
    x = _mono(samples)
    block = max(1, round(sample_rate * 0.005))
    count = -(-x.size // block)
    padded = np.zeros(count * block, dtype=np.float32)
    padded[: x.size] = x
    rms = np.sqrt(np.mean(np.square(padded.reshape(count, block)), axis=1))
    loud = np.flatnonzero(rms >= threshold)
    if loud.size == 0:
        return 0, x.size
    keep = round(sample_rate * keep_ms / 1000)
    start = max(0, int(loud[0]) * block - keep)
    end = min(x.size, (int(loud[-1]) + 1) * block + keep)
    return start, end


def fade_edges(samples: npt.ArrayLike, sample_rate: int, ms: float = 5.0) -> Samples:
    """Raised-cosine fade in and out, so the first and last samples are zero."""
    x = _mono(samples).copy()
    length = min(round(sample_rate * ms / 1000), x.size // 2)
    if length <= 0:
        return x
    ramp = (0.5 - 0.5 * np.cos(np.pi * np.arange(length) / length)).astype(np.float32)
    x[:length] *= ramp
    x[x.size - length :] *= ramp[::-1]
    return x


def pause(sample_rate: int, ms: float) -> Samples:
    """Silence lasting `ms` milliseconds."""
    if ms < 0:
        raise ValueError(f"pause length must not be negative, got {ms}")
    return np.zeros(round(sample_rate * ms / 1000), dtype=np.float32)


def peak_limit(samples: npt.ArrayLike, ceiling: float = 0.98) -> Samples:
    """Scale the whole clip down so its peak is at most `ceiling`; quieter clips are unchanged."""
    x = _mono(samples)
    peak = float(np.max(np.abs(x))) if x.size else 0.0
    if peak <= ceiling:
        return x
    return x * np.float32(ceiling / peak)
