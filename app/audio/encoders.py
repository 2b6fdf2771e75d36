"""Audio encoders: mono float32 samples in, response bytes out, one incremental encoder per stream.

The bytes returned by `StreamEncoder.encode` and `finish`, concatenated, form one valid file.
Compressed formats go through PyAV muxers. Streamed ones write into `_Sink`, which is not seekable,
so a muxer never rewrites bytes already sent (MP3 then has no Xing header, which is valid).
FLAC is the exception: with an unknown length in STREAMINFO libsndfile cannot read the file
to its end, so its encoder keeps a seekable buffer and hands the whole file out in `finish`.

A stream may be asked for a rate other than its input's (OpenAI's `pcm` is always 24 kHz):
`_Resampler` converts it chunk by chunk with soxr, whose filter state runs across chunks, so the
joins are exactly what one conversion of the whole clip would give (no clicks, no gaps).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass, field, replace
from fractions import Fraction
from functools import cache
from typing import IO, Any, cast

import av
import numpy as np
import numpy.typing as npt
import soxr
from av.audio.stream import AudioStream

FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
PCM_RATE = 24_000
"""The rate of OpenAI's `pcm` response format (raw samples: no header says their rate)."""
TELEPHONY = ("ulaw",)
"""Raw G.711 mu-law (telephony stacks' 8 kHz audio): ElevenLabs' `ulaw_8000`, not an OpenAI
format."""
CONTENT_TYPES: dict[str, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
    "ulaw": "audio/basic",
}


def content_type(fmt: str, sample_rate: int) -> str:
    """The media type of `fmt`; raw pcm names its rate (`audio/pcm;rate=24000`)."""
    return f"{CONTENT_TYPES[fmt]};rate={sample_rate}" if fmt == "pcm" else CONTENT_TYPES[fmt]

_UNKNOWN_SIZE = 0xFFFFFFFF


@dataclass(frozen=True)
class _Spec:
    container: str
    codec: str
    bit_rate: int = 0
    rate: int = 0
    """Fixed output rate; 0 keeps the input rate where the codec supports it."""
    codec_format: str = "fltp"
    frame_format: str = "flt"
    container_options: dict[str, str] = field(default_factory=dict)
    lossy: bool = True
    incremental: bool = True
    """False: the muxer must seek back to finish its header, so bytes come out only at the end."""


_SPECS: dict[str, _Spec] = {
    # No ID3 tag: the response is a bare frame stream that can be cut or concatenated.
    "mp3": _Spec("mp3", "libmp3lame", 128_000, container_options={"id3v2_version": "0"}),
    "aac": _Spec("adts", "aac", 96_000),
    # The Ogg muxer holds a finished page until the next one completes; short pages keep the
    # audio held back at the end of each chunk to ~0.1 s instead of ~2 s.
    "opus": _Spec(
        "ogg", "libopus", 48_000, 48_000, "flt", container_options={"page_duration": "60000"}
    ),
    # Fed int16 so FLAC stores exactly `to_pcm16` of the input, like wav and pcm.
    "flac": _Spec(
        "flac", "flac", codec_format="s16", frame_format="s16", lossy=False, incremental=False
    ),
    "ulaw": _Spec("mulaw", "pcm_mulaw", codec_format="s16", frame_format="s16", lossy=False),
}


def to_pcm16(samples: npt.ArrayLike) -> bytes:
    """Clip to [-1, 1] and convert to signed 16-bit little-endian PCM."""
    return _pcm16(np.asarray(samples, dtype=np.float32)).astype("<i2", copy=False).tobytes()


def _pcm16(samples: npt.NDArray[np.float32]) -> npt.NDArray[np.int16]:
    # In place on one new array, NaN (left alone by clip) zeroed last: less than half the time
    # of nan_to_num first, and pcm is converted on the event loop.
    scaled: npt.NDArray[np.float32] = np.clip(samples, -1.0, 1.0)
    scaled *= np.float32(32767.0)
    np.rint(scaled, out=scaled)
    nan = np.isnan(scaled)
    if nan.any():
        scaled[nan] = 0.0
    return scaled.astype(np.int16)


def _wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    data = _UNKNOWN_SIZE if data_bytes is None else min(data_bytes, _UNKNOWN_SIZE - 36)
    riff = _UNKNOWN_SIZE if data_bytes is None else data + 36
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF", riff, b"WAVE",
        b"fmt ", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16,
        b"data", data,
    )  # fmt: skip


@cache
def _codec_rate(codec: str, rate: int) -> int:
    rates = av.Codec(codec, "w").audio_rates
    if not rates or rate in rates:
        return rate
    return min((r for r in rates if r >= rate), default=max(rates))


class _Sink:
    """Write-only file object whose bytes are taken out as they arrive; deliberately unseekable."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def write(self, data: bytes) -> int:
        self._buffer += data
        return len(data)

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def take(self) -> bytes:
        data = bytes(self._buffer)
        self._buffer.clear()
        return data


class _AvPipeline:
    """One PyAV codec context and muxer, kept for the whole stream."""

    def __init__(self, spec: _Spec, sample_rate: int, file: IO[bytes] | _Sink) -> None:
        self.output_rate = spec.rate or _codec_rate(spec.codec, sample_rate)
        self._spec = spec
        self._rate = sample_rate
        self._pts = 0
        self._fed = 0
        self._container = av.open(file, "w", format=spec.container, options=spec.container_options)
        stream = cast(AudioStream, self._container.add_stream(spec.codec, rate=self.output_rate))
        stream.layout = "mono"
        stream.format = spec.codec_format
        if spec.bit_rate:
            stream.bit_rate = spec.bit_rate
        self._stream = stream
        self._resampler = (
            av.AudioResampler(format=spec.frame_format, layout="mono", rate=self.output_rate)
            if self.output_rate != sample_rate
            else None
        )

    def write(self, samples: npt.NDArray[np.float32]) -> None:
        if not samples.size:
            return
        frame = self._frame(samples, self._rate, self._pts)
        self._pts += samples.size
        self._encode([frame] if self._resampler is None else self._resampler.resample(frame))

    def close(self) -> None:
        if self._resampler is not None:
            self._encode(self._resampler.resample(None))
        if not self._fed and self._spec.lossy:
            # A lossy stream without a single frame has no header either, so it is no file.
            self._encode([self._frame(np.zeros(1, dtype=np.float32), self.output_rate, 0)])
        self._container.mux(self._stream.encode(None))
        self._container.close()

    def _frame(self, samples: npt.NDArray[np.float32], rate: int, pts: int) -> av.AudioFrame:
        s16 = self._spec.frame_format == "s16"
        data: npt.NDArray[Any] = _pcm16(samples) if s16 else np.clip(samples, -1.0, 1.0)
        frame = av.AudioFrame.from_ndarray(
            data.reshape(1, -1), format=self._spec.frame_format, layout="mono"
        )
        frame.sample_rate = rate
        frame.time_base = Fraction(1, rate)
        frame.pts = pts
        return frame

    def _encode(self, frames: list[av.AudioFrame]) -> None:
        for frame in frames:
            self._fed += frame.samples
            self._container.mux(self._stream.encode(frame))


def _mono(samples: npt.ArrayLike) -> npt.NDArray[np.float32]:
    array = np.asarray(samples, dtype=np.float32)
    if array.ndim != 1:
        raise ValueError(f"expected mono samples (1-D), got shape {array.shape}")
    return array


def _check(fmt: str, sample_rate: int) -> None:
    if fmt not in FORMATS and fmt not in TELEPHONY:
        raise ValueError(f"unknown audio format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if sample_rate <= 0:
        raise ValueError(f"sample rate must be positive, got {sample_rate}")


class _Resampler:
    """Streaming sample-rate conversion (soxr, high quality): state carries across chunks; the
    filter's delay is held back and comes out at `flush`."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")

    def convert(self, samples: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if not samples.size:
            return samples
        out = self._stream.resample_chunk(np.ascontiguousarray(samples), last=False)
        return np.asarray(out, dtype=np.float32)

    def flush(self) -> npt.NDArray[np.float32]:
        out = self._stream.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return np.asarray(out, dtype=np.float32)


class StreamEncoder:
    """Encoder for one response; `encode` returns whatever bytes are ready now, maybe none.

    For wav the streaming header (sizes 0xFFFFFFFF) comes first: `encode` of an empty array
    returns just the header. `incremental` is False for flac, whose bytes all come from `finish`.
    `rate`: the rate the output must carry; the input is resampled to it when it differs
    (`resampling`). Otherwise the format decides: the input's rate, or one its codec supports.
    """

    def __init__(self, fmt: str, sample_rate: int, rate: int | None = None,
                 bit_rate: int | None = None) -> None:
        """`bit_rate`: a lossy codec's, instead of the format's own (mp3 128 kbps)."""
        _check(fmt, sample_rate)
        if rate is not None:
            _check(fmt, rate)
        self.format = fmt
        self.sample_rate = sample_rate
        feed_rate = rate or sample_rate
        self._resampler = _Resampler(sample_rate, feed_rate) if feed_rate != sample_rate else None
        spec = _SPECS.get(fmt)
        if spec is not None and bit_rate:
            spec = replace(spec, bit_rate=bit_rate)
        self.incremental = spec is None or spec.incremental
        self._sink: _Sink | io.BytesIO = _Sink() if self.incremental else io.BytesIO()
        self._av = _AvPipeline(spec, feed_rate, self._sink) if spec else None
        self.output_sample_rate = self._av.output_rate if self._av else feed_rate
        self._header = _wav_header(self.output_sample_rate, None) if fmt == "wav" else b""
        self._finished = False

    @property
    def resampling(self) -> bool:
        return self._resampler is not None

    def encode(self, samples: npt.ArrayLike) -> bytes:
        if self._finished:
            raise RuntimeError("encoder already finished")
        mono = _mono(samples)
        if self._resampler is not None:
            mono = self._resampler.convert(mono)
        return self._write(mono)

    def finish(self) -> bytes:
        if self._finished:
            raise RuntimeError("encoder already finished")
        tail = self._write(self._resampler.flush()) if self._resampler is not None else b""
        self._finished = True
        if self._av is not None:
            self._av.close()
            rest = self._sink.take() if isinstance(self._sink, _Sink) else self._sink.getvalue()
            return tail + rest
        return tail + self._header

    def _write(self, mono: npt.NDArray[np.float32]) -> bytes:
        if self._av is not None:
            self._av.write(mono)
            return self._sink.take() if isinstance(self._sink, _Sink) else b""
        data = self._header + to_pcm16(mono)
        self._header = b""
        return data


def output_rate(fmt: str, sample_rate: int) -> int:
    """The sample rate `fmt` carries audio at, given input at `sample_rate`."""
    _check(fmt, sample_rate)
    spec = _SPECS.get(fmt)
    return (spec.rate or _codec_rate(spec.codec, sample_rate)) if spec else sample_rate


def encode_whole(samples: npt.ArrayLike, sample_rate: int, fmt: str) -> bytes:
    """Encode a complete clip; seekable output lets MP3 carry a Xing header with its length."""
    _check(fmt, sample_rate)
    mono = _mono(samples)
    if fmt == "pcm":
        return to_pcm16(mono)
    if fmt == "wav":
        return _wav_header(sample_rate, mono.size * 2) + to_pcm16(mono)
    buffer = io.BytesIO()
    pipeline = _AvPipeline(_SPECS[fmt], sample_rate, buffer)
    pipeline.write(mono)
    pipeline.close()
    return buffer.getvalue()
