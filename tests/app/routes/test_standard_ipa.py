"""IPA written as dictionaries and the W3C, Azure and Polly SSML examples write it (the stress
mark before the stressed syllable, `bəˈnænə`) heard as the word on every engine that takes
phonemes, through each way IPA reaches an engine: SSML `phoneme`, inline `[word](/ipa/)` and a
lexicon entry. The engines were trained on the mark before the vowel (`bənˈænə`, eSpeak NG's and
misaki's convention); before VoxMux moved it, Piper heard `bəˈnænə` as "Abe and Anna"."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tests.conftest import LiveServer, decode, start_server, test_settings
from tests.hearing import hear_many, normalize

# (word, as a dictionary writes it, the same reading with the mark before the vowel, a made-up
# word of the lexicon that reads it): words whose mark stands before an onset, one or two
# consonants. (Tomato and potato were heard right either way once written with the flap `ɾ`
# American dictionaries mark; with a plain `t`, Piper's potato was heard "a take of" in either
# convention.)
WORDS = [
    ("banana", "bəˈnænə", "bənˈænə", "Blorvek"),
    ("computer", "kəmˈpjuːtəɹ", "kəmpjˈuːtəɹ", "Drezzik"),
    ("umbrella", "ʌmˈbɹɛlə", "ʌmbɹˈɛlə", "Gromple"),
]

LEAD = "Hello there. "
"""A first sentence of its own: the first segment is kept short for early audio, and a longer
first sentence was cut just before the word ("Please buy" | "[Blorvek](/bəˈnænə/) today."),
which then began a segment and lost its first syllable on Piper ("an anna")."""


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    tmp = tmp_path_factory.mktemp("standard-ipa")
    lexicon = tmp / "lexicon.toml"
    lexicon.write_text("[en]\n" + "".join(f'{made_up} = "/{standard}/"\n'
                                          for _, standard, _, made_up in WORDS),
                       encoding="utf-8")
    # No audio cache: a reading heard wrong is said again, and Piper samples it anew.
    server = start_server(test_settings(tmp, preload=[], idle_ttl=-1, lexicon=lexicon,
                                        lexicons_dir=tmp / "lexicons", cache_max_items=0))
    yield server
    server.stop()


def _said(live: LiveServer, model: str, text: str) -> tuple[np.ndarray, int]:
    # Kokoro's voices are Japanese: the client says the text is English, so the `[en]`
    # lexicon applies (a lexicon follows the language read).
    language = {"language": "en-us"} if model == "kokoro" else {}
    with live.client() as client:
        response = client.post("/v1/audio/speech", json={
            "model": model, "input": text, "response_format": "wav", **language})
    assert response.status_code == 200, response.text
    assert "X-VoxMux-Warnings" not in response.headers, response.headers["X-VoxMux-Warnings"]
    audio = decode(response.content, "wav")
    return audio.samples, audio.sample_rate


def _heard(live: LiveServer, model: str, texts: list[str]) -> list[str]:
    """What Whisper hears of each text said, in one pass: the texts of one pass name three
    different words, so none is heard after another reading of the same word (Whisper reads
    on from what it wrote before in a pass)."""
    return [" ".join(normalize(h.text))
            for h in hear_many([_said(live, model, text) for text in texts])]


@pytest.mark.parametrize("model", ["piper", "kokoro", "hibari"])
def test_standard_ipa_is_heard_as_the_word(live: LiveServer, model: str) -> None:
    """Each word in the engine's own convention first: a word the engine does not say well
    even so proves nothing about the stress mark (eSpeak NG's banana is heard "the naira",
    so eSpeak NG, which read both conventions alike, is left out; tests/engines/test_ipa.py
    checks its mnemonics).
    Where it is heard, the standard form must be heard too, by SSML, inline and lexicon alike.
    A form heard wrong is said once more, as Piper samples its durations and noise (one form in
    120 was heard wrong once); before the marks moved, Piper heard the standard banana wrong on
    every try, and Kokoro and hibari, which do not sample, always alike."""
    forms = {
        "ssml": f'<speak>{LEAD}Please buy <phoneme alphabet="ipa" ph="{{standard}}">fruit'
                '</phoneme> today.</speak>',
        "inline": f"{LEAD}Please buy [Zyxqor](/{{standard}}/) today.",
        "lexicon": f"{LEAD}Please buy {{made_up}} today.",
    }
    own_said = _heard(live, model, [f"{LEAD}Please buy [Zyxqor](/{own}/) today."
                                    for _, _, own, _ in WORDS])
    said = {how: _heard(live, model, [form.format(standard=standard, made_up=made_up)
                                      for _, standard, _, made_up in WORDS])
            for how, form in forms.items()}
    own_heard, slips, table = 0, [], []
    for i, (word, standard, _, made_up) in enumerate(WORDS):
        table.append((word, own_said[i], {how: said[how][i] for how in forms}))
        if word not in own_said[i]:
            continue
        own_heard += 1
        for how, form in forms.items():
            heard = said[how][i]
            if word not in heard:
                heard = _heard(live, model, [form.format(standard=standard,
                                                         made_up=made_up)])[0]
                said[how][i] += f" / again: {heard}"
            if word not in heard:
                slips.append((word, how, said[how][i]))
            # the reading was said, not the text it stands for
            assert "fruit" not in heard and "zyxqor" not in heard, heard
    assert own_heard >= 2, table
    assert not slips, (slips, table)
