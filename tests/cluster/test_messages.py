"""What an engine replica sends the ingress per segment: 16-bit PCM that decodes to exactly the
PCM the single process writes, in half the bytes float32 took."""

from __future__ import annotations

import pickle

import numpy as np

from app.audio.encoders import to_pcm16
from app.cluster.messages import Segment
from engines.base import WordTiming


def test_a_segment_travels_as_pcm16_and_arrives_as_the_same_pcm() -> None:
    rng = np.random.default_rng(7)
    chunks = [np.clip(rng.normal(0, 0.3, n), -1.2, 1.2).astype(np.float32)
              for n in (24_000, 1, 48_000)]
    words = (WordTiming("hello", 0.0, 0.4, 0, 5),)
    segment = Segment.of(chunks, "replica-1", words)
    arrived = pickle.loads(pickle.dumps(segment)).chunks()
    assert [len(c) for c in arrived] == [24_000, 1, 48_000]
    assert all(c.dtype == np.float32 for c in arrived)
    for sent, got in zip(chunks, arrived, strict=True):
        assert to_pcm16(got) == to_pcm16(sent)
        assert np.abs(got - np.clip(sent, -1, 1)).max() <= 0.5 / 32767 + 1e-7
    float_bytes = len(pickle.dumps(chunks))
    assert len(pickle.dumps(segment)) < 0.52 * float_bytes  # was all of it
    assert Segment.of([], "replica-1").chunks() == []
    arrived[0][0] = 0.5  # writable, an array of the ingress's own
