"""Metric labels stay bounded whatever voices clients send: a catalogue voice is labelled by its
id, every Kokoro blend as `blend`, anything else as `other`."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from app.serving.metrics import voice_label
from tests.conftest import LiveServer


def label_values(server: LiveServer, label: str) -> set[str]:
    with server.client() as http:
        text = http.get("/metrics").text
    return {sample.labels[label] for family in text_string_to_metric_families(text)
            for sample in family.samples if label in sample.labels}


def test_many_blends_add_one_voice_label(server: LiveServer) -> None:
    before = label_values(server, "voice")
    blends = [f"jf_alpha({i + 1})+jm_kumo(1)" for i in range(7)]
    blends += [f" jf_alpha ( {i + 1} ) +  jf_nezumi" for i in range(6)]  # spacing differs
    with server.client() as http:
        for voice in blends:
            reply = http.post("/v1/audio/speech", json={
                "model": "kokoro", "input": "Hi.", "voice": voice, "response_format": "pcm"})
            assert reply.status_code == 200, reply.text
        plain = http.post("/v1/audio/speech", json={
            "model": "kokoro", "input": "Hi.", "voice": "jf_alpha", "response_format": "pcm"})
        assert plain.status_code == 200
    added = label_values(server, "voice") - before
    assert added <= {"blend", "jf_alpha"}
    assert "blend" in label_values(server, "voice")
    assert "jf_alpha" in label_values(server, "voice")  # a catalogue voice keeps its id


def test_voice_label() -> None:
    known = {"jf_alpha", "jm_kumo", "en-us"}
    assert voice_label("jf_alpha", known) == "jf_alpha"
    assert voice_label("jf_alpha(2)+jm_kumo(1)", known) == "blend"
    assert voice_label(" jm_kumo ( 0.5 ) + jf_alpha", known) == "blend"
    assert voice_label("en-us+f3", known) == "other"  # an eSpeak variant: no catalogue id
    assert voice_label("jf_alpha+" + "x" * 500, known) == "other"
    assert voice_label("/some/file.wav", known) == "other"
    assert voice_label("", known) == "other"
