"""The pronunciation corpus on every engine: 50 hard cases (numbers with units, ranges, dates,
abbreviations, names, mixed scripts), each with the reading a careful reader gives.

Run: `.venv/bin/python -m bench.pronunciation` (in-process engines; writes
bench/results/pronunciation.json and the table in docs/pronunciation.md between its markers).
For each case: what VoxMux's front end reads (the text every engine phonemizes), whether that is
the expected reading, and per engine the word error rate of what Whisper tiny.en hears against
the expected reading. Whisper writes numbers its own way ("$5" for "five dollars"), so the WER
is compared after `tests.hearing.normalize`; cases in other scripts are not heard (tiny.en).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench.common import write_result

CORPUS = Path(__file__).with_name("pronunciation_corpus.tsv")
DOC = Path(__file__).resolve().parent.parent / "docs" / "pronunciation.md"
BEGIN, END = "<!-- corpus:begin -->", "<!-- corpus:end -->"
ENGINES = {"kokoro": "jf_alpha", "piper": "", "espeak": "en-us"}
_NON_LATIN = re.compile(r"[^\x00-\u024f\u2010-\u20cf°–]")


def corpus() -> list[tuple[str, str, str]]:
    """(category, input, expected reading) rows."""
    rows = []
    for line in CORPUS.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            category, text, expected = line.split("\t")
            rows.append((category, text, expected))
    return rows


def reading(text: str) -> str:
    """What the front end makes of `text` for an English voice (every engine reads this)."""
    from engines.frontend import prepare

    return "".join(run.text for run in prepare(text, default="en-us"))


def _engines() -> dict[str, Any]:
    from engines.espeak import EspeakEngine
    from engines.kokoro import KokoroEngine
    from engines.onnx import RuntimeOptions
    from engines.piper import PiperEngine
    from tests.conftest import CACHE_DIR

    made: dict[str, Any] = {"kokoro": KokoroEngine(CACHE_DIR, None, RuntimeOptions()),
                            "piper": PiperEngine(None, RuntimeOptions(), CACHE_DIR),
                            "espeak": EspeakEngine()}
    for engine in made.values():
        engine.load()
    return made


def run() -> dict[str, Any]:
    from engines.base import SynthesisRequest
    from tests.hearing import hear, word_error_rate

    engines = _engines()
    rows = []
    for category, text, expected in corpus():
        row: dict[str, Any] = {"category": category, "input": text, "expected": expected,
                               "reads": reading(text)}
        row["as_expected"] = row["reads"] == expected
        for name, engine in engines.items():
            if _NON_LATIN.search(text):
                row[name] = None
                continue
            voice = ENGINES[name] or engine.default_voice
            audio = engine.synthesize(SynthesisRequest(text=text, voice=voice))
            heard = hear(audio, engine.sample_rate).text
            row[name] = {"heard": heard, "wer": round(word_error_rate(expected, heard), 2)}
        print(f"{text!r}: {row['reads']!r}", flush=True)
        rows.append(row)
    return {"rows": rows}


def table(rows: list[dict[str, Any]]) -> str:
    def cell(value: Any) -> str:
        return "n/a" if value is None else f"{value['wer']:.2f}"

    lines = ["| # | kind | input | VoxMux reads | as expected | WER kokoro | WER piper | "
             "WER espeak |", "|---|---|---|---|---|---|---|---|"]
    for i, row in enumerate(rows, 1):
        mark = "yes" if row["as_expected"] else f"no (expected: {row['expected']})"
        lines.append(f"| {i} | {row['category']} | {row['input']} | {row['reads']} | {mark} | "
                     + " | ".join(cell(row[name]) for name in ENGINES) + " |")
    scored = {name: [r[name]["wer"] for r in rows if r[name] is not None] for name in ENGINES}
    lines.append("")
    lines.append(f"Front end as expected: {sum(r['as_expected'] for r in rows)} of {len(rows)}. "
                 "Mean WER heard against the expected reading: " + ", ".join(
                     f"{name} {sum(v) / len(v):.2f}" for name, v in scored.items() if v) + ".")
    return "\n".join(lines)


def write_doc(rows: list[dict[str, Any]]) -> None:
    text = DOC.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{table(rows)}\n{END}{tail}", encoding="utf-8")


def main() -> None:
    result = run()
    write_result("pronunciation", result)
    write_doc(result["rows"])


if __name__ == "__main__":
    main()
