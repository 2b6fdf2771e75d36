"""`voxmux serve --ray` / `--ray-address`: the flags reach the cluster launcher, and a missing
Ray is a clear usage error, not a traceback."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import uvicorn

from app.cli import logs
from app.cli import main as cli
from app.settings import Settings
from engines import heap


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    calls: list[Settings] = []
    if importlib.util.find_spec("ray") is None:
        pytest.skip("Ray Serve is not installed")
    import app.cluster.launch as launch

    monkeypatch.setattr(launch, "serve_on_ray", calls.append)
    monkeypatch.setattr(uvicorn, "Server", lambda *a, **k: pytest.fail("uvicorn was started"))
    monkeypatch.setattr(logs, "configure_logging", lambda settings: None)  # keep pytest's logging
    monkeypatch.setattr(heap, "limit_arenas", lambda: False)
    return calls


def test_ray_starts_a_local_cluster(launched: list[Settings]) -> None:
    cli.main(["serve", "--ray", "--port", "8123"])
    (settings,) = launched
    assert settings.ray_address is None and settings.port == 8123


def test_ray_address_joins_that_cluster(launched: list[Settings]) -> None:
    cli.main(["serve", "--ray-address", "ray://head:10001"])
    (settings,) = launched
    assert settings.ray_address == "ray://head:10001"


def test_the_two_are_exclusive(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--ray", "--ray-address", "ray://head:10001"])
    assert "not allowed with" in capsys.readouterr().err


def test_without_ray_installed_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(logs, "configure_logging", lambda settings: None)
    monkeypatch.setattr(heap, "limit_arenas", lambda: False)
    real = importlib.util.find_spec

    def no_ray(name: str, *args: Any) -> Any:
        return None if name == "ray" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", no_ray)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--ray"])
    assert "voxmux[ray]" in capsys.readouterr().err
