"""The Kokoro and fairness benchmarks' committed results render to the committed tables, and a
long-text ratio is each round's own, not a ratio of medians."""

from __future__ import annotations

import json
from typing import Any

from bench import fair, kokoro, load
from bench.common import RESULTS
from bench.systems import Sample


def committed(name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((RESULTS / f"{name}.json").read_text())
    return result


def test_committed_results_render_the_committed_tables() -> None:
    assert kokoro.summary(committed("kokoro")) == (RESULTS / "kokoro.md").read_text()
    assert fair.summary(committed("fair")) == (RESULTS / "fair.md").read_text()


class Steady:
    """A system whose whole time follows a machine that slows down round after round."""

    def __init__(self, name: str, cost: float, clock: list[float]) -> None:
        self.name, self.cost, self.clock = name, cost, clock

    def request(self, text: str) -> Sample:
        slowdown = self.clock[0]
        self.clock[0] *= 1.5
        return Sample(0.1, self.cost * slowdown, 1.0)

    def close(self) -> None:
        pass


def test_long_text_ratios_pair_each_round() -> None:
    clock = [1.0]
    systems = [Steady("peer", 10.0, clock), Steady("ours", 10.4, clock)]
    result = load.long_text(systems, 2, 3, reference="peer")
    ratios = result["systems"]["ours"]["per_round_ratio"]
    # Rotation puts each system first in turn, so the slowdown lands on either side; the rounds
    # where ours ran right after the peer show 10.4 x 1.5 / 10, the others 10.4 / (10 x 1.5).
    assert sorted(ratios) == sorted([1.56, 0.693, 1.56])
    assert result["systems"]["peer"]["per_round_ratio"] == [1.0, 1.0, 1.0]
