"""The language a text is in, for choosing who speaks it: OpenAI's model names speak the
language they are given, as OpenAI's own models do.

The writing system tells most (`engines.frontend.detect`: kana is Japanese, Hangul Korean,
Cyrillic Russian, ...), and the language of most letters wins. Latin text is English unless
py3langid (its model ships in the wheel) is confident it is another language of the languages
below: at least `CONFIDENT` and `LETTERS` letters, so a short or mixed English text ("Hello.",
a name, an e-mail address), which identifiers often take for Finnish or Afrikaans, stays
English, the language most OpenAI clients send. Its model takes a second and a half to load:
`load()` it off the event loop at start; `language_of` is blocking too.
"""

from __future__ import annotations

import functools
from typing import Any

from engines.frontend.detect import detect

LATIN = ("en", "fr", "es", "de", "it", "pt", "nl", "sv", "da", "no", "pl", "cs", "sk", "hu", "ro",
         "fi", "tr", "id", "ms", "vi", "ca", "hr", "sl", "et", "lv", "lt", "eu", "gl", "af",
         "sw", "cy", "ga", "is", "sq")
"""Latin-script languages told apart (all read by eSpeak NG)."""
CONFIDENT = 0.8
"""Measured: French, German, Polish phrases of 14+ letters at 0.99; English sentences taken for
another language never above 0.36."""
LETTERS = 12


@functools.cache
def load() -> Any:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    identifier.set_languages(list(LATIN))
    return identifier


def language_of(text: str) -> str:
    """The base language of most of `text`'s letters (`en` for Latin text not clearly in
    another language)."""
    language = detect(text, "en").split("-")[0]
    if language != "en":
        return language
    if sum(c.isalpha() for c in text) < LETTERS:
        return "en"
    found, probability = load().classify(text)
    return str(found) if probability >= CONFIDENT else "en"
