"""Budgets: what one request may cost, counted in what it costs (audio seconds out, silence asked,
bytes inflated, entries kept), each a setting. Over one is `OverBudget`, a 400 that names the
budget and its setting; it is raised before any audio is made wherever the input shows it.
"""

from __future__ import annotations

from dataclasses import dataclass

from engines.base import InvalidParameter

FASTEST_CHARS_PER_SECOND = 40.0
"""More letters and digits a second than any voice reads at speed 1 (fast English speech is
about 15 characters a second): the input's letters over it, divided by the speed, is a floor
under the seconds its speech will last."""


class OverBudget(InvalidParameter):
    """A request would cost more than one of the budgets allows."""

    def __init__(self, what: str, amount: str, limit: str, setting: str, *,
                 param: str | None = "input", hint: str = "") -> None:
        self.setting = setting
        message = f"{what} is {amount}; the budget is {limit} ({setting})"
        super().__init__(message + (f": {hint}" if hint else ""), param=param,
                         code="over_budget")


def env_name(field: str) -> str:
    """The environment variable of a setting."""
    return "VOXMUX_" + field.upper()


def seconds(value: float) -> str:
    return f"{value:,.0f} s" if value >= 10 else f"{value:.1f} s"


def speech_floor(text: str, speed: float) -> float:
    """Seconds the speech of `text` lasts at least, at `speed`."""
    letters = sum(ch.isalnum() for ch in text)
    return letters / FASTEST_CHARS_PER_SECOND / speed


def check_audio(expected: float, limit: float, field: str, what: str) -> None:
    """`OverBudget` when `expected` seconds of audio (a floor) pass `limit`."""
    if expected > limit:
        raise OverBudget(what, f"at least {seconds(expected)} of audio", seconds(limit),
                         env_name(field))


@dataclass(frozen=True)
class AudioLimit:
    """The most audio one request may make, and the setting that says so."""

    seconds: float
    field: str = "max_audio_seconds"


class AudioBudget:
    """Counts the audio of one request as it is made; `OverBudget` once it would pass the
    limit, before the audio that passes it is handed out."""

    def __init__(self, limit: AudioLimit, sample_rate: int) -> None:
        self.limit = limit
        self.most = round(limit.seconds * sample_rate)
        self.samples = 0

    def add(self, samples: int) -> None:
        if self.samples + samples > self.most:
            allowed = seconds(self.limit.seconds)
            raise OverBudget("The audio made", f"more than {allowed}", allowed,
                             env_name(self.limit.field))
        self.samples += samples
