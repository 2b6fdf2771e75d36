"""The short sentence a voice speaks when someone presses its play button in the Studio.

One sentence per language ("Hello! This is how my voice sounds."), written in a script the text
front end reads in that language (`engines.frontend.detect`): Serbian is given in Latin letters,
because Cyrillic would be read as Russian. Languages without a sentence here count to five: digits
have no script, so every engine reads them in the voice's own language.
"""

from __future__ import annotations

import re

from engines.base import Voice
from engines.frontend.detect import base_language, canonical

FALLBACK = "1, 2, 3, 4, 5."
"""For a language without a sentence: read as numbers in the voice's language."""

SAMPLES: dict[str, str] = {
    "en": "Hello! This is how my voice sounds.",
    "ja": "こんにちは。これが私の声です。",
    "zh": "你好！这就是我的声音。",
    "ko": "안녕하세요! 이것이 제 목소리입니다.",
    "de": "Hallo! So klingt meine Stimme.",
    "fr": "Bonjour ! Voici comment sonne ma voix.",
    "es": "¡Hola! Así suena mi voz.",
    "it": "Ciao! Ecco come suona la mia voce.",
    "pt": "Olá! É assim que soa a minha voz.",
    "ca": "Hola! Així sona la meva veu.",
    "nl": "Hallo! Zo klinkt mijn stem.",
    "af": "Hallo! So klink my stem.",
    "sv": "Hej! Så här låter min röst.",
    "da": "Hej! Sådan lyder min stemme.",
    "nb": "Hei! Slik høres stemmen min ut.",
    "no": "Hei! Slik høres stemmen min ut.",
    "fi": "Hei! Tältä kuulostaa minun ääneni.",
    "et": "Tere! Nii kõlab minu hääl.",
    "is": "Halló! Svona hljómar röddin mín.",
    "pl": "Cześć! Tak brzmi mój głos.",
    "cs": "Ahoj! Takhle zní můj hlas.",
    "sk": "Ahoj! Takto znie môj hlas.",
    "sl": "Živjo! Tako zveni moj glas.",
    "hr": "Bok! Ovako zvuči moj glas.",
    "bs": "Zdravo! Ovako zvuči moj glas.",
    "sr": "Zdravo! Ovako zvuči moj glas.",
    "hu": "Szia! Így szól a hangom.",
    "ro": "Salut! Așa sună vocea mea.",
    "lt": "Labas! Taip skamba mano balsas.",
    "lv": "Sveiki! Šādi skan mana balss.",
    "ru": "Привет! Вот так звучит мой голос.",
    "uk": "Привіт! Ось так звучить мій голос.",
    "bg": "Здравей! Ето как звучи гласът ми.",
    "el": "Γεια σας! Έτσι ακούγεται η φωνή μου.",
    "tr": "Merhaba! Sesim böyle duyuluyor.",
    "ar": "مرحبا! هكذا يبدو صوتي.",
    "fa": "سلام! صدای من این‌گونه است.",
    "he": "שלום! כך נשמע הקול שלי.",
    "hi": "नमस्ते! मेरी आवाज़ ऐसी सुनाई देती है।",
    "id": "Halo! Beginilah suara saya.",
    "ms": "Helo! Beginilah bunyi suara saya.",
    "vi": "Xin chào! Đây là giọng nói của tôi.",
    "th": "สวัสดี นี่คือเสียงของฉัน",
    "sw": "Habari! Hivi ndivyo sauti yangu inavyosikika.",
    "eo": "Saluton! Jen kiel sonas mia voĉo.",
    "la": "Salve! Sic sonat vox mea.",
    "cy": "Helo! Dyma sut mae fy llais yn swnio.",
    # eSpeak NG reads no digits in these three: a greeting instead.
    "chr": "ᎣᏏᏲ!",
    "cv": "Салам!",
    "sjn": "Mae govannen!",
}
"""By canonical language tag (`engines.frontend.detect.canonical`): a full tag (`pt-br`) may
have its own entry; otherwise its base language's sentence is spoken."""


def sample_text(language: str) -> str:
    """The sentence a voice of `language` speaks; English where the language is not stated."""
    if not language:
        return SAMPLES["en"]
    tag = canonical(language)
    return SAMPLES.get(tag) or SAMPLES.get(base_language(tag)) or FALLBACK


_NAME = re.compile(r"[\w.-]+")


def spoken_language(voices: list[Voice], voice: str) -> str:
    """The language of `voice` among a model's `voices`. A voice string that is no listed voice
    (a blend such as `jf_alpha(2)+jm_kumo(1)`) speaks the language of the first listed voice it
    names; an unknown one says nothing (English is then spoken)."""
    by_id = {v.id: v for v in voices}
    if voice in by_id:
        return by_id[voice].language
    for name in _NAME.findall(voice):
        if name in by_id:
            return by_id[name].language
    return ""
