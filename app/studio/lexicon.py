"""The Studio's pronunciation editor: a word heard as it is read now and with a new reading, side
by side, and the reading saved in a lexicon.

The Studio edits the lexicons its own speech requests use: those of the owner its client has
(`app.serving.lexicons.owner_of`: a presented key's, else the keyless `open` owner's, which a
signed-in Studio session is too, since its cookie is not a key). So what it saves is what its
next Generate reads, and what a keyless API request reads. Both clips go through the speech
service like any request; "now" applies the lexicons already saved, "with this reading" adds the
new entry on top (an inline `[word](/ipa/)` reading or the respelling, as a lexicon would).
"""

from __future__ import annotations

from dataclasses import dataclass

from starlette.requests import Request

from app.serving.lexicons import LexiconNotFound, LexiconStore
from app.serving.service import SpeechService
from app.studio.view import Clip, synthesize
from app.text.lexicon import Entry, Lexicon, check_entry
from app.text.prepared import prepare
from engines.base import InvalidParameter

DEFAULT_NAME = "studio"
"""The lexicon the Studio saves into."""
TRIAL_FORMAT = "mp3"


@dataclass(frozen=True)
class Trial:
    word: str
    reading: str
    text: str
    now: Clip
    after: Clip


def with_reading(text: str, word: str, reading: str, language: str) -> str:
    """`text` with `word` read as `reading` wherever it stands as a whole word."""
    check_entry(word, reading)
    lexicon = Lexicon([Entry(word, reading, language)])
    said = prepare(text, lexicon=lexicon, language=language).text
    if said == text:
        raise InvalidParameter(f"The sentence does not contain the word '{word}'", param="text")
    return said


async def trial(service: SpeechService, *, word: str, reading: str, text: str, model: str,
                voice: str, language: str, request_id: str, client: str,
                request: Request | None = None) -> Trial:
    """The sentence (the word alone when empty) as read now and with the reading."""
    word, reading = word.strip(), reading.strip()
    text = text.strip() or f"{word}."
    after_text = with_reading(text, word, reading, language)
    clips = [await synthesize(service, model=model, text=said, voice=voice, speed=1.0,
                              fmt=TRIAL_FORMAT, request_id=request_id, client=client,
                              request=request)
             for said in (text, after_text)]
    return Trial(word, reading, text, *clips)


def save(store: LexiconStore, owner: str, *, word: str, reading: str, language: str,
         name: str = DEFAULT_NAME) -> None:
    """Add or replace one entry of lexicon `name` (made when it is not there)."""
    word, reading = word.strip(), reading.strip()
    check_entry(word, reading)
    try:
        item = store.get(owner, name)
    except LexiconNotFound:
        item = {"language": language, "scope": "", "entries": {}}
    entries = dict(item["entries"])  # type: ignore[call-overload]
    entries[word] = reading
    store.put(owner, name, str(item["language"]), entries, str(item["scope"] or ""))


def remove(store: LexiconStore, owner: str, *, name: str, word: str) -> None:
    """Drop one entry; the lexicon goes when its last entry does."""
    item = store.get(owner, name)
    entries = dict(item["entries"])  # type: ignore[call-overload]
    entries.pop(word, None)
    if entries:
        store.put(owner, name, str(item["language"]), entries, str(item["scope"] or ""))
    else:
        store.delete(owner, name)
