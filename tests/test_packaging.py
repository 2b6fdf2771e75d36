"""A plain `pip install .` (a wheel, not the editable checkout) serves from any directory: the
Studio's templates and static files, the catalogue and the profiles travel inside the package."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SERVE_FROM_ELSEWHERE = """
import app, sys
from fastapi.testclient import TestClient
from app.main import create_app
from app.settings import load_settings

assert app.__file__.startswith(sys.argv[1]), app.__file__  # the wheel, not the checkout
settings = load_settings("gpu", preload=[], cache_dir="cache", credentials_dir="credentials")
assert settings.port == 8101, settings.port  # the gpu profile was found
with TestClient(create_app(settings)) as client:
    page = client.get("/")
    assert page.status_code == 200 and "htmx-2.0.11.min.js" in page.text, page.status_code
    assert client.get("/static/htmx-2.0.11.min.js").status_code == 200
    assert client.get("/static/studio.css").status_code == 200
    ids = [m["id"] for m in client.get("/v1/models").json()["data"]]
    assert {"kokoro", "piper", "espeak"} <= set(ids), ids
print("served")
"""


def test_every_package_is_listed_for_the_wheel() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("app", "engines") for init in (ROOT / top).rglob("__init__.py")
    }
    assert found <= listed, f"pyproject.toml misses {sorted(found - listed)}"


@pytest.mark.timeout(240)
def test_an_installed_wheel_serves_from_another_directory(tmp_path: Path) -> None:
    wheels, target, elsewhere = tmp_path / "wheels", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "-w", str(wheels), str(ROOT)], check=True,
                   capture_output=True, timeout=180)
    wheel = next(wheels.glob("voxmux-*.whl"))
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=60)
    # -S: no site-packages .pth files, so the checkout's editable finder is not installed; the
    # dependencies come from this environment's site-packages, after the wheel's target.
    path = f"{target}:{sysconfig.get_paths()['purelib']}:{sysconfig.get_paths()['platlib']}"
    done = subprocess.run(
        [sys.executable, "-S", "-c", SERVE_FROM_ELSEWHERE, str(target)], cwd=elsewhere,
        env={"PYTHONPATH": path, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("served")
