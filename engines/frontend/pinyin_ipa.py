"""Pinyin syllables -> the phoneme symbols Kokoro v1.0 was trained on for Mandarin.

Kokoro's vocabulary writes Mandarin in IPA-like symbols (ʦ ʨ ꭧ for the affricates, ʰ for
aspiration, ɨ for the apical vowel of zhi/zi) with the tone as an arrow after the syllable's vowel:
→ first, ↗ second, ↓ third, ↘ fourth, nothing for the neutral tone.
"""

from __future__ import annotations

TONES = {"1": "→", "2": "↗", "3": "↓", "4": "↘", "5": ""}

INITIALS = {
    "b": "p", "p": "pʰ", "m": "m", "f": "f", "d": "t", "t": "tʰ", "n": "n", "l": "l",
    "g": "k", "k": "kʰ", "h": "x", "j": "ʨ", "q": "ʨʰ", "x": "ɕ",
    "zh": "ꭧ", "ch": "ꭧʰ", "sh": "ʂ", "r": "ɻ", "z": "ʦ", "c": "ʦʰ", "s": "s",
}

# `T` marks where the tone goes: after the vowel, before a nasal coda.
FINALS = {
    "a": "aT", "ai": "aiT", "an": "aTn", "ang": "aTŋ", "ao": "auT",
    "e": "ɤT", "ei": "eiT", "en": "əTn", "eng": "əTŋ", "er": "ɚT", "ê": "ɛT",
    "o": "woT", "ou": "ouT", "ong": "ʊTŋ",
    "i": "iT", "ia": "jaT", "ian": "jɛTn", "iang": "jaTŋ", "iao": "jauT", "ie": "jeT",
    "in": "iTn", "ing": "iTŋ", "iong": "jʊTŋ", "iou": "jouT", "io": "jɔT",
    "u": "uT", "ua": "waT", "uai": "waiT", "uan": "waTn", "uang": "waTŋ", "uei": "weiT",
    "uen": "wəTn", "ueng": "wəTŋ", "uo": "woT",
    "ü": "yT", "üe": "ɥeT", "üan": "ɥɛTn", "ün": "yTn",
}
APICAL = "ɨT"
"""The vowel of zhi chi shi ri zi ci si."""

SYLLABIC = {"m": "mT", "n": "nT", "ng": "ŋT", "hm": "xmT", "hng": "xŋT"}
"""Syllables without a vowel (嗯 ńg, 呣 m̀)."""


def syllable_phonemes(syllable: str) -> str:
    """`zhong1` -> `ꭧʊ→ŋ`; a syllable pypinyin could not read (no tone digit) is dropped."""
    # Imported here: importing pypinyin reads its phrase dictionary (about half a second), which
    # every process that loads Kokoro would pay without speaking any Chinese.
    from pypinyin.contrib.tone_convert import to_finals, to_initials, to_normal

    tone = syllable[-1] if syllable[-1:] in TONES else ""
    if not tone:
        return ""
    normal = to_normal(syllable[:-1]).replace("v", "ü")
    if normal in SYLLABIC:
        return SYLLABIC[normal].replace("T", TONES[tone])
    if normal == "o":  # the interjection 哦
        return "ɔ" + TONES[tone]
    initial = to_initials(normal, strict=True)
    final = to_finals(normal, strict=True, v_to_u=True)
    if initial in ("zh", "ch", "sh", "r", "z", "c", "s") and final == "i":
        body = APICAL
    else:
        body = FINALS.get(final, "")
    if not body:
        return ""
    return INITIALS.get(initial, "") + body.replace("T", TONES[tone])
