"""Which eSpeak NG language voice speaks a language tag."""

from __future__ import annotations

import functools

from engines.espeak_lib import espeak
from engines.frontend.detect import base_language, canonical

PREFERRED = {"zh": "cmn", "en": "en-us", "pt": "pt-br", "fr": "fr-fr", "es": "es"}
"""eSpeak's voice for a bare language code where it has several."""


@functools.cache
def _known() -> tuple[str, ...]:
    return tuple(v.language for v in espeak().voices())


def espeak_language(tag: str) -> str | None:
    """`en` -> `en-us`, `zh` -> `cmn`, `fr-fr` -> `fr-fr`; None when eSpeak NG lacks it."""
    known = _known()
    wanted = canonical(tag)
    base = base_language(tag)
    for candidate in (wanted, tag.lower(), PREFERRED.get(base), base):
        if candidate and candidate in known:
            return candidate
    return next((k for k in known if k.startswith(base + "-")), None)
