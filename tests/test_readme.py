"""The README stays true: every setting is documented, the two commands are shown."""

from __future__ import annotations

from pathlib import Path

from app.settings import Settings

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_every_setting_is_documented() -> None:
    missing = [name for name in Settings.model_fields
               if f"VOXMUX_{name.upper()}" not in README]
    assert not missing, f"README lacks settings: {missing}"


def test_the_two_commands_are_shown() -> None:
    assert "make serve" in README and "make test" in README
