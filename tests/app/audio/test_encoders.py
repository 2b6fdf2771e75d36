from __future__ import annotations

import io
import struct
from typing import Any

import av
import numpy as np
import numpy.typing as npt
import pytest
import soundfile as sf

from app.audio.encoders import (
    CONTENT_TYPES,
    FORMATS,
    TELEPHONY,
    StreamEncoder,
    content_type,
    encode_whole,
    to_pcm16,
)

F0 = 220.0
LOSSLESS = ("wav", "flac", "pcm")
# Samples a decoder may add beyond the input: encoder delay plus the last partial frame.
CODEC_SLACK = {"mp3": 2 * 1152, "aac": 2 * 1024}


def voice_like(seconds: float, rate: int) -> npt.NDArray[np.float32]:
    """Harmonic tone with a syllable-rate amplitude envelope, silent at both ends."""
    t = np.arange(round(seconds * rate)) / rate
    tone: npt.NDArray[np.float64] = np.stack(
        [np.sin(2 * np.pi * F0 * h * t) / h for h in range(1, 6)]
    ).sum(axis=0)
    envelope = np.sin(np.pi * t / seconds) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))
    return (0.4 * tone * envelope).astype(np.float32)


def chunks(samples: npt.NDArray[np.float32]) -> list[npt.NDArray[np.float32]]:
    return np.split(samples, [37, 4000, 4001, 23000, 47000])


def stream_encode(fmt: str, samples: npt.NDArray[np.float32], rate: int) -> tuple[bytes, int]:
    encoder = StreamEncoder(fmt, rate)
    parts = [encoder.encode(chunk) for chunk in chunks(samples)]
    parts.append(encoder.finish())
    return b"".join(parts), encoder.output_sample_rate


def decode_av(data: bytes) -> tuple[npt.NDArray[np.float32], int]:
    with av.open(io.BytesIO(data), "r") as container:
        stream = container.streams.audio[0]
        frames = [frame.to_ndarray().reshape(-1) for frame in container.decode(stream)]
        rate = stream.codec_context.sample_rate
    raw: npt.NDArray[Any] = np.concatenate(frames) if frames else np.zeros(0, dtype=np.float32)
    scale = 32768.0 if raw.dtype == np.int16 else 1.0
    return (raw / scale).astype(np.float32), rate


def decode_lossless(data: bytes, fmt: str, rate: int) -> tuple[npt.NDArray[np.int16], int]:
    if fmt == "pcm":
        return np.frombuffer(data, dtype="<i2"), rate
    pcm, decoded_rate = sf.read(io.BytesIO(data), dtype="int16")
    return pcm, decoded_rate


def dominant_frequency(samples: npt.NDArray[np.float32], rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(samples.size)))
    return float(np.argmax(spectrum) * rate / samples.size)


def rms(samples: npt.NDArray[np.floating]) -> float:
    return float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))


def test_every_format_has_a_content_type() -> None:
    assert set(CONTENT_TYPES) == set(FORMATS) | set(TELEPHONY)
    assert CONTENT_TYPES["mp3"] == "audio/mpeg"
    assert CONTENT_TYPES["opus"] == "audio/ogg"


@pytest.mark.parametrize("rate", [24000, 22050])
@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac"])
def test_lossy_stream_decodes_to_the_same_sound(fmt: str, rate: int) -> None:
    samples = voice_like(2.5, rate)
    data, output_rate = stream_encode(fmt, samples, rate)

    decoded, decoded_rate = decode_av(data)

    assert decoded_rate == output_rate == (48000 if fmt == "opus" else rate)
    duration = decoded.size / decoded_rate
    expected = samples.size / rate
    slack = CODEC_SLACK.get(fmt, 0) / rate
    assert expected - 0.06 <= duration <= expected + 0.06 + slack
    assert rms(decoded) == pytest.approx(rms(samples), rel=0.15)
    assert dominant_frequency(decoded, decoded_rate) == pytest.approx(F0, rel=0.02)


@pytest.mark.parametrize("rate", [24000, 22050])
@pytest.mark.parametrize("fmt", LOSSLESS)
def test_lossless_stream_is_sample_exact(fmt: str, rate: int) -> None:
    samples = voice_like(2.0, rate)
    data, output_rate = stream_encode(fmt, samples, rate)

    pcm, decoded_rate = decode_lossless(data, fmt, output_rate)

    assert decoded_rate == rate
    assert np.array_equal(pcm, np.frombuffer(to_pcm16(samples), dtype="<i2"))


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_lossless_stream_also_decodes_with_ffmpeg(fmt: str) -> None:
    samples = voice_like(1.0, 24000)
    data, _ = stream_encode(fmt, samples, 24000)

    decoded, rate = decode_av(data)

    assert rate == 24000
    assert decoded.size == samples.size
    assert np.max(np.abs(decoded - samples)) < 1e-4


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "wav"])
def test_stream_also_decodes_with_libsndfile(fmt: str) -> None:
    samples = voice_like(2.0, 24000)
    data, output_rate = stream_encode(fmt, samples, 24000)

    decoded, rate = sf.read(io.BytesIO(data), dtype="float32")

    assert rate == output_rate
    assert 1.94 <= decoded.size / rate <= 2.06 + CODEC_SLACK.get(fmt, 0) / 24000
    assert dominant_frequency(decoded, rate) == pytest.approx(F0, rel=0.02)


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "wav", "pcm"])
def test_streaming_formats_return_bytes_before_finish(fmt: str) -> None:
    encoder = StreamEncoder(fmt, 24000)
    first = encoder.encode(voice_like(1.0, 24000))

    assert encoder.incremental
    assert len(first) > 1000


def test_flac_holds_its_bytes_until_finish() -> None:
    encoder = StreamEncoder("flac", 24000)

    assert not encoder.incremental
    assert encoder.encode(voice_like(1.0, 24000)) == b""
    assert encoder.finish().startswith(b"fLaC")


def test_streamed_wav_header_comes_first_with_unknown_sizes() -> None:
    encoder = StreamEncoder("wav", 22050)

    header = encoder.encode(np.zeros(0, dtype=np.float32))

    assert len(header) == 44
    riff, riff_size, wave = struct.unpack("<4sI4s", header[:12])
    channels, rate, byte_rate, align, bits = struct.unpack("<HIIHH", header[22:36])
    assert (riff, wave, header[36:40]) == (b"RIFF", b"WAVE", b"data")
    assert riff_size == struct.unpack("<I", header[40:])[0] == 0xFFFFFFFF
    assert (channels, rate, byte_rate, align, bits) == (1, 22050, 44100, 2, 16)
    assert encoder.encode(np.array([0.5], dtype=np.float32)) == struct.pack("<h", 16384)


def test_whole_wav_has_exact_sizes_and_matches_the_stream() -> None:
    samples = voice_like(1.5, 24000)
    whole = encode_whole(samples, 24000, "wav")
    streamed, _ = stream_encode("wav", samples, 24000)

    riff_size, data_size = struct.unpack("<I", whole[4:8])[0], struct.unpack("<I", whole[40:44])[0]
    assert data_size == samples.size * 2
    assert riff_size == len(whole) - 8
    with sf.SoundFile(io.BytesIO(whole)) as f:
        assert f.frames == samples.size
    assert np.array_equal(sf.read(io.BytesIO(whole))[0], sf.read(io.BytesIO(streamed))[0])
    assert whole[44:] == streamed[44:]


@pytest.mark.parametrize("fmt", FORMATS)
def test_encode_whole_decodes_at_the_right_rate_and_length(fmt: str) -> None:
    samples = voice_like(2.0, 24000)

    data = encode_whole(samples, 24000, fmt)

    if fmt in LOSSLESS:
        pcm, rate = decode_lossless(data, fmt, 24000)
        assert rate == 24000
        assert np.array_equal(pcm, np.frombuffer(to_pcm16(samples), dtype="<i2"))
    else:
        decoded, rate = decode_av(data)
        assert rate == (48000 if fmt == "opus" else 24000)
        slack = CODEC_SLACK.get(fmt, 0) / 24000
        assert 1.94 <= decoded.size / rate <= 2.06 + slack
        assert dominant_frequency(decoded, rate) == pytest.approx(F0, rel=0.02)


def test_whole_mp3_carries_its_exact_length() -> None:
    samples = voice_like(2.0, 24000)

    decoded, _ = decode_av(encode_whole(samples, 24000, "mp3"))

    assert decoded.size == samples.size


@pytest.mark.parametrize(("fmt", "expected"), [("mp3", 22050), ("aac", 22050), ("opus", 48000)])
def test_unsupported_codec_rates_are_resampled(fmt: str, expected: int) -> None:
    samples = voice_like(1.0, 20000)
    data, output_rate = stream_encode(fmt, samples, 20000)

    decoded, rate = decode_av(data)

    assert rate == output_rate == expected
    assert dominant_frequency(decoded, rate) == pytest.approx(F0, rel=0.02)


def test_to_pcm16_clips_and_rounds_little_endian() -> None:
    samples = np.array([0.0, 1.0, -1.0, 2.0, -3.0, 0.5, np.nan, np.inf, -np.inf],
                       dtype=np.float32)
    pcm = to_pcm16(samples)

    assert struct.unpack("<9h", pcm) == (0, 32767, -32767, 32767, -32767, 16384, 0, 32767, -32767)
    assert np.isnan(samples[6])  # the caller's samples are left as they were


def test_encode_after_finish_is_an_error() -> None:
    encoder = StreamEncoder("mp3", 24000)
    encoder.encode(voice_like(0.2, 24000))
    encoder.finish()

    with pytest.raises(RuntimeError):
        encoder.encode(voice_like(0.2, 24000))
    with pytest.raises(RuntimeError):
        encoder.finish()


def test_unknown_format_and_bad_input_are_rejected() -> None:
    with pytest.raises(ValueError, match="unknown audio format"):
        StreamEncoder("ogg", 24000)
    with pytest.raises(ValueError, match="unknown audio format"):
        encode_whole(np.zeros(10, dtype=np.float32), 24000, "m4a")
    with pytest.raises(ValueError, match="mono"):
        StreamEncoder("pcm", 24000).encode(np.zeros((2, 10), dtype=np.float32))


@pytest.mark.parametrize("size", [0, 1, 10])
@pytest.mark.parametrize("fmt", FORMATS)
def test_empty_or_tiny_stream_is_still_a_file(fmt: str, size: int) -> None:
    encoder = StreamEncoder(fmt, 24000)

    data = encoder.encode(np.full(size, 0.1, dtype=np.float32)) + encoder.finish()

    if fmt == "pcm":
        assert len(data) == 2 * size
    else:
        decoded, rate = decode_av(data)
        assert rate == encoder.output_sample_rate
        assert decoded.size / rate < 0.1


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
@pytest.mark.parametrize("rate", [22050, 16000])
def test_stream_resampled_to_another_rate_keeps_pitch_and_length(fmt: str, rate: int) -> None:
    samples = voice_like(1.5, rate)
    encoder = StreamEncoder(fmt, rate, 24000)
    data = b"".join(encoder.encode(chunk) for chunk in chunks(samples)) + encoder.finish()
    assert encoder.output_sample_rate == 24000 and encoder.resampling
    pcm, decoded_rate = decode_lossless(data, fmt, 24000)
    assert decoded_rate == 24000
    assert abs(pcm.size - samples.size * 24000 / rate) <= 2
    assert dominant_frequency(pcm.astype(np.float32) / 32768, 24000) == pytest.approx(F0, abs=2)


def test_resampling_chunk_by_chunk_equals_resampling_the_whole() -> None:
    """The resampler's state runs across chunks: no click, gap or repeat at any join."""
    samples = voice_like(1.5, 22050)
    whole = StreamEncoder("pcm", 22050, 24000)
    one = np.frombuffer(whole.encode(samples) + whole.finish(), dtype="<i2").astype(np.int32)
    split = StreamEncoder("pcm", 22050, 24000)
    parts = [split.encode(chunk) for chunk in chunks(samples)] + [split.finish()]
    many = np.frombuffer(b"".join(parts), dtype="<i2").astype(np.int32)
    assert many.size == one.size
    assert np.max(np.abs(many - one)) <= 1  # float rounding only
    # and the joins themselves are smooth: no sample-to-sample jump beyond the signal's own
    assert np.max(np.abs(np.diff(many))) <= np.max(np.abs(np.diff(one))) + 2


def test_same_rate_does_not_resample() -> None:
    encoder = StreamEncoder("pcm", 24000, 24000)
    assert not encoder.resampling
    samples = voice_like(0.2, 24000)
    assert encoder.encode(samples) + encoder.finish() == to_pcm16(samples)


def test_pcm_content_type_names_its_rate() -> None:
    assert content_type("pcm", 24000) == "audio/pcm;rate=24000"
    assert content_type("mp3", 24000) == "audio/mpeg"
