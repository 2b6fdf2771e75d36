"""Requests of one model share it segment by segment, and a text's first segment is short.

Four clients stream two-sentence texts from Kokoro at once, at the default settings (one engine
call per core): each hears audio before any of them has its whole answer (a scheduler that ran whole
requests in turn would finish the first before the fourth heard anything). A first segment cut
inside a sentence joins the rest without a seam a listener hears: Whisper hears the sentence
whole, with no gap at the cut longer than between two words.
"""

from __future__ import annotations

import threading
import time

import pytest

from app.text.split import split_text
from engines.base import SynthesisRequest
from tests.conftest import LiveServer, decode
from tests.hearing import hear, word_error_rate

TEXTS = [
    "The morning train left the station exactly on time. Passengers read their papers in "
    "comfortable silence.",
    "Near the window, a small child pointed at the hills. The pale sun rose higher over the "
    "quiet valley.",
    "A gray cat slept on the warm stone wall. Two boys raced their bikes along the river.",
    "Clouds gathered slowly over the northern hills. The farmer looked up and called his dogs.",
]
"""Two sentences each: two segments a stream (30 characters first, then the rest packed), so
four streams taking turns overlap for most of their length."""


@pytest.fixture
def kokoro(server: LiveServer) -> LiveServer:
    """The session's server: Kokoro preloaded, the default concurrency (one call per core)."""
    assert server.app.state.settings.concurrency == 1
    return server


def test_four_simultaneous_streams_each_hear_audio_before_any_finishes(kokoro: LiveServer
                                                                       ) -> None:
    first: dict[int, float] = {}
    done: dict[int, float] = {}
    sizes: dict[int, int] = {}
    start = threading.Barrier(len(TEXTS))

    def listen(k: int) -> None:
        with kokoro.client() as client:
            start.wait()
            with client.stream("POST", "/v1/audio/speech", json={
                "model": "kokoro", "input": TEXTS[k], "response_format": "pcm"}) as response:
                assert response.status_code == 200
                size = 0
                for chunk in response.iter_bytes():
                    if chunk and k not in first:
                        first[k] = time.monotonic()
                    size += len(chunk)
            done[k] = time.monotonic()
            sizes[k] = size

    threads = [threading.Thread(target=listen, args=(k,)) for k in range(len(TEXTS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert sorted(done) == list(range(len(TEXTS)))
    assert max(first.values()) < min(done.values()), (first, done)
    for k, size in sizes.items():  # and each got its whole text: ~5 s of speech at 24 kHz
        assert size / 2 / 24_000 > len(TEXTS[k]) / 22


def test_a_first_segment_cut_inside_a_sentence_joins_without_a_seam(kokoro: LiveServer
                                                                     ) -> None:
    text = TEXTS[0]
    settings = kokoro.app.state.settings
    first = split_text(text, max_chars=300, first_max_chars=settings.first_segment_chars)[0]
    assert not first.endswith("."), "the first sentence fits: nothing is cut inside it"
    with kokoro.client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": "kokoro", "input": text, "response_format": "wav"})
    assert response.status_code == 200
    audio = decode(response.content, "wav")
    heard = hear(audio.samples, audio.sample_rate)
    engine = kokoro.app.state.service.registry["kokoro"].engine
    raw = engine.synthesize(SynthesisRequest(text=text, voice="jf_alpha"))
    raw_wer = word_error_rate(text, hear(raw, engine.sample_rate).text)
    assert word_error_rate(text, heard.text) <= raw_wer + 0.1, (heard.text, raw_wer)
    cut_word = first.split()[-1].strip(",").lower()
    words = [w for w in heard.words if w.word.strip(" ,.").lower()]
    at = next(i for i, w in enumerate(words) if w.word.strip(" ,.").lower() == cut_word)
    gap = words[at + 1].start - words[at].end
    assert gap < 0.25, (cut_word, gap)
