"""The README stays a front door: short, the two commands shown. Every setting is documented in
docs/settings.md, the reference the README links to."""

from __future__ import annotations

from pathlib import Path

from app.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
SETTINGS = (ROOT / "docs" / "settings.md").read_text()

MAX_README_LINES = 300


def test_the_readme_is_short() -> None:
    lines = README.count("\n")  # what `wc -l` counts
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; at most {MAX_README_LINES}"


def test_the_two_commands_are_shown() -> None:
    assert "make serve" in README and "make test" in README


def test_every_setting_is_documented() -> None:
    missing = [name for name in Settings.model_fields
               if f"VOXMUX_{name.upper()}" not in SETTINGS]
    assert not missing, f"docs/settings.md lacks settings: {missing}"
