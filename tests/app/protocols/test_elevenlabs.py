"""ElevenLabs' API driven by its own Python SDK (`elevenlabs`), unchanged but for `base_url`:
convert and stream in the output formats it names (decoded by PyAV, or read raw, at exactly the
rate named; heard by Whisper), with-timestamps and its streamed form (every character sent,
aligned, word starts where Whisper hears them), voices, models, user, errors in its shape."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
from elevenlabs.client import ElevenLabs
from elevenlabs.core.api_error import ApiError

from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.hearing import hear, normalize

VOICE = "hibari:heart"
TEXT = "The kitchen lights are now off. Good night, and sleep well."


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    server = start_server(test_settings(tmp_path_factory.mktemp("elevenlabs"), preload=[],
                                        idle_ttl=-1, ws_text_idle_timeout=3,
                                        max_request_bytes=200_000))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live: LiveServer) -> ElevenLabs:
    return ElevenLabs(api_key="not-checked-on-an-open-server", base_url=live.url + "/elevenlabs")


def _mulaw(data: bytes) -> tuple[np.ndarray, int]:
    with av.open(io.BytesIO(data), format="mulaw", options={"sample_rate": "8000"}) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray().astype(np.float32).reshape(-1) for f in container.decode(stream)]
        return np.concatenate(frames) / 32768, stream.rate


def _heard(samples: np.ndarray, rate: int) -> set[str]:
    return set(normalize(hear(samples, rate).text))


@pytest.mark.parametrize(("output_format", "rate"), [
    ("mp3_44100_128", 44100), ("mp3_22050_32", 22050), ("pcm_16000", 16000),
    ("ulaw_8000", 8000), ("opus_48000_64", 48000)])
def test_convert_gives_the_format_named(client: ElevenLabs, output_format: str,
                                        rate: int) -> None:
    data = b"".join(client.text_to_speech.convert(
        VOICE, text=TEXT, model_id="eleven_multilingual_v2", output_format=output_format))
    if output_format.startswith("pcm"):
        samples, got = np.frombuffer(data, "<i2").astype(np.float32) / 32768, 16000
    elif output_format.startswith("ulaw"):
        samples, got = _mulaw(data)
    else:
        clip = decode(data, output_format.split("_")[0] if "mp3" in output_format else "opus")
        samples, got = clip.samples, clip.sample_rate
    assert got == rate
    assert 2.0 < len(samples) / rate < 8.0 and np.sqrt(np.mean(samples ** 2)) > 0.01
    if output_format in ("mp3_44100_128", "ulaw_8000"):  # the default, and the narrowest band
        assert {"kitchen", "lights", "night"} <= _heard(samples, rate)


def test_mp3_bit_rates_are_the_ones_named(client: ElevenLabs) -> None:
    sizes = {kbps: len(b"".join(client.text_to_speech.convert(
        VOICE, text=TEXT, output_format=f"mp3_44100_{kbps}"))) for kbps in (32, 128)}
    assert 3.0 < sizes[128] / sizes[32] < 5.0  # four times the bits for the same audio


def test_stream_comes_in_pieces_and_decodes(client: ElevenLabs) -> None:
    text = " ".join([TEXT] * 4)
    pieces = list(client.text_to_speech.stream(VOICE, text=text, output_format="mp3_44100_64"))
    assert len(pieces) > 1
    clip = decode(b"".join(pieces), "mp3")
    assert clip.sample_rate == 44100 and clip.duration > 8


def test_with_timestamps_aligns_every_character_sent(client: ElevenLabs) -> None:
    answer = client.text_to_speech.convert_with_timestamps(VOICE, text=TEXT,
                                                           output_format="pcm_24000")
    samples = np.frombuffer(base64.b64decode(answer.audio_base_64), "<i2").astype(np.float32)
    samples /= 32768
    alignment = answer.alignment
    assert alignment is not None and answer.normalized_alignment is not None
    assert "".join(alignment.characters) == TEXT
    starts, ends = alignment.character_start_times_seconds, alignment.character_end_times_seconds
    assert starts == sorted(starts) and all(a <= b for a, b in zip(starts, ends, strict=True))
    assert ends[-1] <= len(samples) / 24000 + 0.05
    heard = hear(samples, 24000).words
    for word in ("kitchen", "night"):  # a word starts where Whisper hears it
        ours = starts[TEXT.index(word)]
        theirs = next(w.start for w in heard if normalize(w.word) == [word])
        assert abs(ours - theirs) < 0.3, (word, ours, theirs)


def test_stream_with_timestamps_sends_each_segment_with_its_characters(
        client: ElevenLabs) -> None:
    chunks = list(client.text_to_speech.stream_with_timestamps(VOICE, text=TEXT,
                                                               output_format="pcm_24000"))
    aligned = [c.alignment for c in chunks if c.alignment is not None]
    assert len(aligned) >= 2
    assert "".join(ch for a in aligned for ch in a.characters) == TEXT  # spaces between too
    starts = [t for a in aligned for t in a.character_start_times_seconds]
    assert starts == sorted(starts)
    audio = b"".join(base64.b64decode(c.audio_base_64) for c in chunks if c.audio_base_64)
    assert len(audio) / 2 / 24000 > 2.0


def test_voices_models_and_user(client: ElevenLabs, live: LiveServer) -> None:
    voices = client.voices.get_all().voices
    ids = {v.voice_id for v in voices}
    assert {"hibari:heart", "piper:en_US-joe-medium", "espeak:en-us"} <= ids
    assert client.voices.get("hibari:heart").name
    models = {m.model_id for m in client.models.list()}
    assert {"hibari", "kokoro", "piper", "espeak"} <= models
    assert client.user.get().subscription.tier == "voxmux-local"
    with httpx.Client(base_url=live.url) as http:  # at the root too, but for /v1/models
        assert http.get("/v1/voices").json()["voices"]
        assert http.get("/v1/models").json()["object"] == "list"  # OpenAI's
        # A voice no model has is a missing resource, whatever part of its name is unknown.
        for missing in ("espeak:nosuch", "nosuchmodel:x", "nosuch"):
            answer = http.get(f"/elevenlabs/v1/voices/{missing}")
            assert answer.status_code == 404, (missing, answer.text)
            assert answer.json()["detail"]["status"] == "voice_not_found"


def test_voices_search_pages_through_the_same_voices(client: ElevenLabs, live: LiveServer
                                                     ) -> None:
    """The SDK's `voices.search()` (`GET /v2/voices`, a 404 before): page by page with its
    `next_page_token`, the same voices as `/v1/voices`; `search` finds by name or label."""
    every = {v.voice_id for v in client.voices.get_all().voices}
    seen: list[str] = []
    token: str | None = None
    while True:
        page = client.voices.search(page_size=3, next_page_token=token,
                                    include_total_count=True)
        assert len(page.voices) <= 3 and page.total_count == len(every)
        seen += [v.voice_id for v in page.voices]
        if not page.has_more:
            break
        token = page.next_page_token
    assert len(seen) == len(set(seen)) and set(seen) == every
    found = client.voices.search(search="JOE", page_size=100).voices
    assert found[0].voice_id == "piper:en_US-joe-medium"  # then the ElevenLabs ids it speaks
    assert all("joe" in v.model_dump_json().lower() for v in found) and len(found) < len(every)
    japanese = client.voices.search(search="ja", page_size=100).voices
    assert "kokoro:jf_alpha" in {v.voice_id for v in japanese}
    with httpx.Client(base_url=live.url) as http:
        for bad in ("page_size=0", "page_size=101", "page_size=x", "next_page_token=-1"):
            answer = http.get(f"/v2/voices?{bad}")
            assert answer.status_code == 400, (bad, answer.text)
            assert answer.json()["detail"]["status"]


RACHEL, ADAM = "21m00Tcm4TlvDq8ikWAM", "pNInz6obpgDQGcFmaJgB"


def test_elevenlabs_premade_ids_speak_through_the_catalogue_table(client: ElevenLabs) -> None:
    """Apps written against ElevenLabs send its premade ids: Rachel is hibari's heart, Adam is
    Piper's joe (config/models.toml), sample for sample, on every route that takes a voice id."""
    def pcm(voice_id: str) -> bytes:
        return b"".join(client.text_to_speech.convert(voice_id, text=TEXT,
                                                      output_format="pcm_22050"))
    rachel, adam = pcm(RACHEL), pcm(ADAM)
    assert rachel == pcm("hibari:heart") and adam == pcm("piper:en_US-joe-medium")
    assert rachel != adam
    listed = {v.voice_id: v for v in client.voices.get_all().voices}
    assert listed[RACHEL].name == "Rachel" and listed[ADAM].name == "Adam"
    assert listed[RACHEL].labels["voxmux_voice"] == "hibari:heart"
    assert client.voices.get(RACHEL).name == "Rachel"


def test_a_catalogue_alias_to_no_model_is_refused_at_start(tmp_path: Path) -> None:
    from app.serving.catalogue import Catalogue

    text = Path("config/models.toml").read_text(encoding="utf-8")
    path = tmp_path / "models.toml"
    path.write_text(text.replace('voice = "hibari:heart" }', 'voice = "nobody:heart" }', 1),
                    encoding="utf-8")
    with pytest.raises(ValueError, match=r"21m00Tcm4TlvDq8ikWAM.*nobody:heart"):
        Catalogue.load(path)
    assert Catalogue.load(Path("config/models.toml")).elevenlabs_voices[RACHEL].name == "Rachel"


def test_errors_are_in_elevenlabs_shape(client: ElevenLabs, live: LiveServer) -> None:
    with pytest.raises(ApiError) as raised:
        b"".join(client.text_to_speech.convert("nobody", text=TEXT))
    assert raised.value.status_code == 400
    assert raised.value.body["detail"]["status"] == "voice_not_found"
    with httpx.Client(base_url=live.url) as http:
        bad = http.post(f"/v1/text-to-speech/{VOICE}?output_format=wav_1", json={"text": "Hi."})
        empty = http.post(f"/v1/text-to-speech/{VOICE}", json={"text": ""})
    assert bad.status_code == 400 and "output_format" in bad.json()["detail"]["message"]
    assert empty.status_code == 400 and empty.json()["detail"]["status"]


@pytest.mark.parametrize("output_format", ["pcm_" + "9" * 5000, "opus_48000_" + "1" * 4400,
                                           "pcm_016000", "mp3_44100_0128", "pcm_١٦٠٠٠"])
def test_an_output_format_of_odd_digits_is_a_400(live: LiveServer, output_format: str) -> None:
    """Numbers too long for int() (a 500 before), leading zeros, digits of other scripts."""
    with httpx.Client(base_url=live.url) as http:
        answer = http.post(f"/v1/text-to-speech/{VOICE}",
                           params={"output_format": output_format}, json={"text": "Hi."})
    assert answer.status_code == 400, answer.text
    assert "output_format" in answer.json()["detail"]["message"]


def test_every_error_under_the_elevenlabs_paths_is_in_its_shape(live: LiveServer) -> None:
    """The framework's 404 and 405 and the body limit's 413 too; messages name `text`."""
    with httpx.Client(base_url=live.url) as http:
        answers = {
            404: http.get("/elevenlabs/v1/nothing"),
            405: http.get(f"/elevenlabs/v1/text-to-speech/{VOICE}"),
            413: http.post(f"/v1/text-to-speech/{VOICE}", content=b"x" * 300_000,
                           headers={"Content-Type": "application/json"}),
        }
        long = http.post(f"/v1/text-to-speech/{VOICE}", json={"text": "word " * 2000})
        ignored = http.post(f"/v1/text-to-speech/{RACHEL}?output_format=pcm_16000",
                            json={"text": "Hi.", "model_id": "piper"})
    for status, answer in answers.items():
        assert answer.status_code == status
        assert set(answer.json()["detail"]) == {"status", "message"}, answer.text
    assert long.status_code == 400 and "'text'" in long.json()["detail"]["message"]
    assert "model_id 'piper' ignored" in ignored.headers["X-VoxMux-Warnings"]


def test_settings_that_cannot_apply_are_named_and_speed_applies(live: LiveServer) -> None:
    with httpx.Client(base_url=live.url) as http:
        plain = http.post(f"/v1/text-to-speech/{VOICE}?output_format=pcm_24000",
                          json={"text": TEXT})
        fast = http.post(f"/v1/text-to-speech/{VOICE}?output_format=pcm_24000", json={
            "text": TEXT, "seed": 4, "voice_settings": {"stability": 0.5, "speed": 1.2}})
    assert "X-VoxMux-Warnings" not in plain.headers
    assert "seed" in fast.headers["X-VoxMux-Warnings"]
    assert "voice_settings.stability" in fast.headers["X-VoxMux-Warnings"]
    assert abs(len(plain.content) / len(fast.content) - 1.2) < 0.06


def test_a_keyed_server_takes_xi_api_key(tmp_path_factory: pytest.TempPathFactory) -> None:
    key = "el-test-key-0123456789abcdef"
    keyed = start_server(test_settings(tmp_path_factory.mktemp("elevenlabs-keyed"), preload=[],
                                       api_keys=[key], auth_scope="all"))
    try:
        body = {"text": "Hello."}
        with httpx.Client(base_url=keyed.url) as http:
            refused = http.post("/elevenlabs/v1/text-to-speech/espeak:en-us", json=body)
            taken = http.post("/elevenlabs/v1/text-to-speech/espeak:en-us", json=body,
                              headers={"xi-api-key": key})
        assert refused.status_code == 401
        assert refused.json()["detail"]["status"] == "invalid_api_key"
        assert taken.status_code == 200 and decode(taken.content, "mp3").duration > 0.3
        # A browser cannot set headers: its key comes in the stream-input's first message.
        url = (keyed.url.replace("http", "ws") + "/v1/text-to-speech/espeak:en-us/stream-input"
               "?output_format=pcm_16000")
        for sent, closed in ((key, 1000), ("wrong-key", 1008)):
            frames, code = _socket(url, [{"text": " ", "xi_api_key": sent},
                                         {"text": "Hello there. "}, {"text": ""}])
            assert code == closed, frames
            assert any(f.get("audio") for f in frames) == (closed == 1000)
    finally:
        keyed.stop()


def _socket(url: str, messages: list[dict[str, object]]) -> tuple[list[dict[str, Any]], int]:
    """Send the messages, read every frame until the server closes; (frames, close code)."""
    import json

    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    frames: list[dict[str, Any]] = []
    with connect(url) as ws:
        try:
            # The server may close before the last message (a refused key): what was not sent
            # then is not a failure, the close code says what happened.
            for message in messages:
                ws.send(json.dumps(message))
            while True:
                frames.append(json.loads(ws.recv(timeout=60)))
        except ConnectionClosed:
            pass
        assert ws.close_code is not None
        return frames, ws.close_code


def _pcm(frames: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(str(f["audio"])) for f in frames if f.get("audio"))


def test_stream_input_keeps_every_piece_of_text(live: LiveServer) -> None:
    """A first message's text then silence is spoken (the idle timeout ends the text); an empty
    `flush` flushes and does not end it; text after the end is an error, not dropped."""
    url = live.url.replace("http", "ws") + (f"/v1/text-to-speech/{VOICE}/stream-input"
                                            "?output_format=pcm_16000")
    quiet, code = _socket(url, [{"text": "Hello there, this is the first message. "}])
    assert code == 1000 and len(_pcm(quiet)) / 2 / 16000 > 1.0
    flushed, code = _socket(url, [{"text": " "}, {"text": "", "flush": True},
                                  {"text": "Hi there. "}, {"text": ""}])
    assert code == 1000 and len(_pcm(flushed)) / 2 / 16000 > 0.4
    late, _ = _socket(url, [{"text": " "}, {"text": "Hello there. "}, {"text": ""},
                            {"text": "Lost words here."}])
    assert any("ended" in str(f.get("message", "")) for f in late), late


def test_stream_with_timestamps_times_trailing_characters_after_the_words(
        client: ElevenLabs) -> None:
    text = "Hello there.  \n"
    chunks = list(client.text_to_speech.stream_with_timestamps(VOICE, text=text,
                                                               output_format="pcm_16000"))
    aligned = [c.alignment for c in chunks if c.alignment is not None]
    assert "".join(ch for a in aligned for ch in a.characters) == text
    starts = [t for a in aligned for t in a.character_start_times_seconds]
    assert starts == sorted(starts) and starts[-1] > 0.3


def test_stream_input_speaks_tokens_as_they_come(live: LiveServer) -> None:
    """The stream-input WebSocket as ElevenLabs' SDK drives it (its helper wants TLS, so the
    same messages go over a plain socket): a first sentence is heard before the text ends, each
    sentence's characters come with its first audio, `{"isFinal": true}` ends it."""
    import json

    from websockets.sync.client import connect

    url = (live.url.replace("http", "ws") + f"/elevenlabs/v1/text-to-speech/{VOICE}"
           "/stream-input?model_id=eleven_flash_v2_5")  # mp3_44100_128, the default
    frames: list[dict[str, object]] = []
    with connect(url) as ws:
        ws.send(json.dumps({"text": " ", "voice_settings": {"speed": 1.0},
                            "generation_config": {"chunk_length_schedule": [50]}}))
        for token in ("The kitchen ", "lights are ", "now off. ", "Good "):
            ws.send(json.dumps({"text": token, "try_trigger_generation": True}))
        frames.append(json.loads(ws.recv(timeout=60)))  # audio before the text is complete
        for token in ("night, and ", "sleep well. "):
            ws.send(json.dumps({"text": token, "try_trigger_generation": True}))
        ws.send(json.dumps({"text": ""}))
        while not frames[-1].get("isFinal"):
            frames.append(json.loads(ws.recv(timeout=60)))
    assert frames[0]["audio"] and frames[0]["alignment"]
    audio = b"".join(base64.b64decode(str(f["audio"])) for f in frames if f.get("audio"))
    clip = decode(audio, "mp3")  # the encoder's last frames come with isFinal
    assert clip.sample_rate == 44100
    assert {"kitchen", "lights", "night", "sleep"} <= _heard(clip.samples, 44100)
    chars = "".join("".join(f["alignment"]["chars"]) for f in frames  # type: ignore[index]
                    if f.get("alignment"))
    assert chars == TEXT  # the spaces between the sentences too
