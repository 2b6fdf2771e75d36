"""The outputs directory (AngeVoice's `/app/outputs`): with `outputs_dir` set, HTTP results are
also kept there, named, with a JSON sidecar: the speech route's audio (the very bytes sent), a
batch's ZIP (a finished job's audio: `test_jobs`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.conftest import LiveServer, decode


def kept(folder: Path, pattern: str) -> tuple[Path, dict[str, object]]:
    deadline = time.monotonic() + 10
    while not (found := sorted(folder.glob(pattern))) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(found) == 1, list(folder.iterdir())
    sidecar = json.loads(found[0].with_name(found[0].name + ".json").read_text())
    return found[0], sidecar


def test_speech_and_batch_results_are_kept_with_a_sidecar(espeak_server: LiveServer) -> None:
    folder = Path(espeak_server.app.state.settings.outputs_dir)
    with espeak_server.client(headers={"X-Request-ID": "outputs-test-1"}) as client:
        response = client.post("/v1/audio/speech", json={
            "model": "espeak", "input": "Kept for later.", "response_format": "wav"})
        assert response.status_code == 200
        path, sidecar = kept(folder, "*-speech-outputs-test-1.wav")
        assert path.read_bytes() == response.content
        assert decode(path.read_bytes(), "wav").rms > 0.01
        assert sidecar["input"] == "Kept for later." and sidecar["model"] == "espeak"
        assert sidecar["file"] == path.name and sidecar["bytes"] == len(response.content)

        batch = client.post("/v1/audio/batch", json={"items": [
            {"model": "espeak", "input": "One."}, {"model": "espeak", "input": "Two."}]},
            headers={"X-Request-ID": "outputs-batch-1"})
        path, sidecar = kept(folder, "*-batch-outputs-batch-1.zip")
        assert path.read_bytes() == batch.content
        assert [i["file"] for i in sidecar["items"]] == ["001.mp3", "002.mp3"]
