"""A server on eSpeak NG (fast, reproducible) with its own job store, for the long-form tests."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import LiveServer, start_server, test_settings


@pytest.fixture(scope="package")
def espeak_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("jobs")
    live = start_server(test_settings(tmp, preload=["espeak"], idle_ttl=-1,
                                      data_dir=tmp / "data", batch_max_items=3,
                                      outputs_dir=tmp / "outputs", api_keys="key-a,key-b"))
    yield live
    live.stop()


def wait_job(client: httpx.Client, job_id: str, until: tuple[str, ...] = ("done",),
             timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        body: dict[str, Any] = client.get(f"/v1/audio/jobs/{job_id}").json()
        if body["status"] in until or time.monotonic() > deadline:
            return body
        time.sleep(0.05)
