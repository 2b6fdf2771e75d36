"""No answer reveals a server path: broken voice files and a model that cannot load are reported
by file name and reason only (engines.base.public_text)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.base import LoadFailed, describe, public_text
from tests.conftest import LiveServer, start_server, test_settings


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("disclosure")
    kokoro, piper = root / "models" / "kokoro", root / "models" / "piper"
    kokoro.mkdir(parents=True)
    piper.mkdir(parents=True)
    (kokoro / "garbage.npz").write_bytes(b"PK\x03\x04 not a zip archive")
    (piper / "orphan.onnx").write_bytes(b"no .onnx.json beside it")
    (root / "not-a-dir").write_text("the cache dir is a file, so Kokoro cannot be assembled")
    return root


@pytest.fixture(scope="module")
def broken(root: Path) -> Iterator[LiveServer]:
    live = start_server(test_settings(root, preload=["piper"], cache_dir=root / "not-a-dir"))
    yield live
    live.stop()


def test_no_answer_reveals_a_server_path(broken: LiveServer, root: Path) -> None:
    with broken.client() as http:
        answers = [
            http.post("/v1/models/kokoro/load"),
            http.get("/v1/models"),
            http.get("/v1/models/kokoro"),
            http.get("/v1/models/piper"),
            http.post("/v1/audio/speech", json={"model": "piper", "voice": "orphan",
                                                "input": "Where do you live?"}),
            http.post("/v1/audio/speech", json={"model": "kokoro", "input": "こんにちは。"}),
            http.post("/v1/models/rescan"),
            http.get("/health"),
            http.get("/stats"),
            http.get("/requests"),
            http.get("/studio/fragments/models"),
        ]
    assert answers[0].status_code == 503
    models = {m["id"]: m for m in answers[1].json()["data"]}
    assert models["kokoro"]["status"] == "error" and models["kokoro"]["error"]
    assert {"garbage.npz", "orphan.onnx"} <= set(models["kokoro"]["voice_errors"]) | set(
        models["piper"]["voice_errors"])
    assert "orphan.onnx.json" in models["piper"]["voice_errors"]["orphan.onnx"]  # a file name
    for answer in answers:
        assert str(root) not in answer.text, (answer.request.url, answer.text[:500])
        assert "/tmp/" not in answer.text and "site-packages" not in answer.text


def test_library_messages_lose_their_paths() -> None:
    missing = FileNotFoundError(2, "No such file or directory", "/srv/voxmux/models/piper/x.json")
    assert describe(missing) == "FileNotFoundError: [Errno 2] No such file or directory: 'x.json'"
    error = LoadFailed("Kokoro failed to load: Load model from /var/cache/voxmux/kokoro.onnx "
                       "failed: PosixPath('/home/me/voices/a.npz') is broken")
    assert error.message == ("Kokoro failed to load: Load model from kokoro.onnx failed: "
                             "PosixPath('a.npz') is broken")
    # What is not a server path stays: URLs, relative paths, a voice blend, a bare slash.
    for text in ("see https://example.com/a/b", "voices/jf_alpha.npy", "jf_alpha(2)+jm_kumo(1)",
                 "input/output"):
        assert public_text(text) == text
