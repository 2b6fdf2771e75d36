"""MCP as an agent uses it, with the `mcp` SDK's own client: over streamable HTTP at `/mcp`
(behind the API keys: no key is a 401 in OpenAI's shape) and over stdio (`voxmux mcp`, a real
subprocess). `speak` returns audio that decodes and is heard right, with word timings inside
it; `list_voices` filters; the catalogue is a resource; a request over a budget is a tool error
naming it and the session goes on; an audiobook is started and followed to its end; `pronounce`
returns the word as read now and with the reading."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import CACHE_DIR, LiveServer, decode, start_server, test_settings
from tests.hearing import hear, word_error_rate

KEY = "sk-mcp-test-0123456789abcdef"
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("mcp")
    server = start_server(test_settings(tmp, preload=["piper"], idle_ttl=-1, api_keys=KEY,
                                        auth_scope="all", max_input_chars=5000,
                                        data_dir=tmp / "data"))
    yield server
    server.stop()


def _http(live: LiveServer) -> Any:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    return Client(streamable_http_client(
        f"{live.url}/mcp",
        http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {KEY}"})))


def _audio(result: Any) -> tuple[Any, dict[str, Any]]:
    assert not result.is_error, result.content
    (audio,) = [c for c in result.content if c.type == "audio"]
    assert audio.mime_type == "audio/wav"
    return decode(base64.b64decode(audio.data), "wav"), result.structured_content


def test_no_key_is_refused_in_openais_shape(live: LiveServer) -> None:
    response = httpx.post(f"{live.url}/mcp", json={"jsonrpc": "2.0", "id": 1,
                                                   "method": "tools/list"}, timeout=30)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_speak_list_voices_catalogue_and_budgets_over_http(live: LiveServer) -> None:
    async def session() -> None:
        async with _http(live) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert tools == {"speak", "list_voices", "start_audiobook", "audiobook_status",
                             "pronounce"}
            audio, meta = _audio(await client.call_tool(
                "speak", {"text": TEXT, "model": "piper", "format": "wav"}))
            assert audio.sample_rate == meta["sample_rate"] == 22050
            assert abs(audio.duration - meta["audio_seconds"]) < 0.05 and audio.rms > 0.01
            assert word_error_rate(TEXT, hear(audio.samples, audio.sample_rate).text) <= 0.2
            starts = [w["start"] for w in meta["words"]]
            assert [w["word"] for w in meta["words"]][:2] == ["The", "quick"]
            assert starts == sorted(starts) and meta["words"][-1]["end"] <= audio.duration + 0.05
            voices = await client.call_tool("list_voices", {"language": "ja"})
            found = voices.structured_content["voices"]
            assert found and {v["language"][:2] for v in found} == {"ja"}
            assert any(v["id"] == "jf_alpha" for v in found)
            flood = "<speak>Hi." + '<break time="10s"/>' * 7 + "Bye.</speak>"
            over = await client.call_tool("speak", {"text": flood, "model": "piper"})
            assert over.is_error and "over_budget" in over.content[0].text
            assert "VOXMUX_MAX_SSML_SILENCE_SECONDS" in over.content[0].text
            long = await client.call_tool("speak", {"text": "Word. " * 1000, "model": "piper"})
            assert long.is_error and "the limit is 5000" in long.content[0].text
            unknown = await client.call_tool("speak", {"text": "Hi.", "model": "nothing"})
            assert unknown.is_error and "nothing" in unknown.content[0].text
            catalogue = await client.read_resource("voxmux://catalogue")
            models = json.loads(catalogue.contents[0].text)["models"]
            assert {m["id"] for m in models} >= {"kokoro", "piper", "hibari", "espeak"}
            again, _ = _audio(await client.call_tool(  # the session outlived the errors
                "speak", {"text": "Still here.", "model": "piper"}))
            assert again.duration > 0.5

    asyncio.run(session())


def test_an_audiobook_is_started_and_followed_to_its_end(live: LiveServer) -> None:
    async def session() -> dict[str, Any]:
        async with _http(live) as client:
            started = await client.call_tool("start_audiobook", {
                "text": "# One\n\nThe first chapter.\n\n# Two\n\nThe second chapter.",
                "input_format": "markdown", "model": "piper", "format": "mp3"})
            assert not started.is_error, started.content
            job_id = started.structured_content["id"]
            for _ in range(600):
                status = (await client.call_tool("audiobook_status", {"job_id": job_id}))
                card: dict[str, Any] = status.structured_content
                if card["status"] in ("done", "failed"):
                    return card
                await asyncio.sleep(0.1)
            raise AssertionError("the audiobook did not finish")

    card = asyncio.run(session())
    assert card["status"] == "done" and [c["title"] for c in card["chapters"]] == ["One", "Two"]
    with live.client(headers={"Authorization": f"Bearer {KEY}"}) as http:
        whole = http.get(f"/v1/audio/jobs/{card['id']}/audio")
    assert whole.status_code == 200 and decode(whole.content, "mp3").duration > 1.5


def test_pronounce_gives_the_word_now_and_with_the_reading(live: LiveServer) -> None:
    async def session() -> Any:
        async with _http(live) as client:
            return await client.call_tool("pronounce", {
                "word": "Blorvek", "reading": "/bəˈnænə/", "model": "hibari",
                "text": "Please buy Blorvek today."})

    result = asyncio.run(session())
    assert not result.is_error, result.content
    now, after = [c for c in result.content if c.type == "audio"]
    heard = hear(*_samples(after))
    assert "banana" in heard.text.lower(), heard.text
    assert "banana" not in hear(*_samples(now)).text.lower()


def _samples(block: Any) -> tuple[Any, int]:
    fmt = {"audio/mpeg": "mp3", "audio/wav": "wav"}[block.mime_type]
    audio = decode(base64.b64decode(block.data), fmt)
    return audio.samples, audio.sample_rate


def test_stdio_speaks_without_a_server(tmp_path: Path) -> None:
    from mcp import Client, StdioServerParameters

    env = {**os.environ, "VOXMUX_DATA_DIR": str(tmp_path / "data"),
           "VOXMUX_CACHE_DIR": str(CACHE_DIR), "VOXMUX_LEXICONS_DIR": str(tmp_path / "lex"),
           "VOXMUX_CREDENTIALS_DIR": str(tmp_path / "credentials")}

    async def session() -> Any:
        async with Client(StdioServerParameters(command=sys.executable,
                                                args=["-m", "app.cli", "mcp"], env=env,
                                                cwd=str(tmp_path))) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert "speak" in tools
            return await client.call_tool("speak", {"text": TEXT, "model": "piper"})

    audio, meta = _audio(asyncio.run(session()))
    assert meta["model"] == "piper" and audio.duration > 1.5
    assert word_error_rate(TEXT, hear(audio.samples, audio.sample_rate).text) <= 0.2


def test_a_cancelled_call_stops_its_synthesis(live: LiveServer) -> None:
    """An agent that gives up on `speak` (the SDK sends `notifications/cancelled`) stops the
    engine: the server is idle within seconds, where the whole text takes far longer."""
    text = " ".join(f"Sentence number {n} of a long text that an agent gave up on."
                    for n in range(70))
    headers = {"Authorization": f"Bearer {KEY}"}

    def active() -> int:
        with live.client(headers=headers) as http:
            return int(http.get("/stats").json()["active"])

    async def session() -> float:
        async with _http(live) as client:
            call = asyncio.ensure_future(client.call_tool("speak", {"text": text,
                                                                    "model": "piper"}))
            for _ in range(200):
                if await asyncio.to_thread(active) >= 1:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the speech never started")
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
            cancelled = time.monotonic()
            while await asyncio.to_thread(active) and time.monotonic() - cancelled < 30:
                await asyncio.sleep(0.1)
            return time.monotonic() - cancelled

    assert asyncio.run(session()) < 6.0
