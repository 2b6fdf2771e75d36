"""Lexicons: the deployment file's scopes, whole-word replacement that keeps spans, PLS."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.text.lexicon import Entry, Lexicon, load_toml, parse_pls
from engines.base import InvalidParameter
from engines.frontend.spans import Spanned


def test_the_deployment_file_scopes_entries_by_language_model_and_voice(tmp_path: Path) -> None:
    path = tmp_path / "lexicon.toml"
    path.write_text('[en]\nGIF = "jiff"\n[en.kokoro]\nNginx = "/ˈɛndʒɪnˈɛks/"\n'
                    '[en."piper:joe"]\nSioux = "sue"\n[fr]\nGIF = "jif"\n', encoding="utf-8")
    entries = load_toml(path)

    def words(language: str, model: str, voice: str) -> set[str]:
        return {e.word for e in entries if e.applies(language, model, voice)}

    assert words("en-us", "kokoro", "jf_alpha") == {"GIF", "Nginx"}
    assert words("en", "piper", "joe") == {"GIF", "Sioux"}
    assert words("fr-fr", "espeak", "fr") == {"GIF"}


def test_whole_words_are_replaced_and_keep_their_span() -> None:
    lexicon = Lexicon([Entry("GIF", "jiff"), Entry("Zyx", "/zɪks/")])
    source = "A gif, a GIFT and zyx [Zyx](/zaɪ/)."
    spoken, readings = lexicon.apply(Spanned.of(source), source, "en")
    assert spoken.text == "A jiff, a GIFT and [zyx](/zɪks/) [Zyx](/zaɪ/)."
    assert [(r.text, r.read_as) for r in readings] == [("gif", "jiff"), ("zyx", "/zɪks/")]
    at = spoken.text.index("jiff")
    assert source[slice(*spoken.source_span(at, at + 4))] == "gif"
    assert Lexicon([Entry("a", "b")]).digest() != Lexicon([Entry("a", "c")]).digest()


def test_pls_is_imported_and_bad_pls_refused() -> None:
    language, entries = parse_pls(
        '<lexicon version="1.0" xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" '
        'alphabet="ipa" xml:lang="en-GB"><lexeme><grapheme>tomato</grapheme>'
        '<grapheme>Tomato</grapheme><phoneme>təˈmɑːtəʊ</phoneme></lexeme>'
        '<lexeme><grapheme>W3C</grapheme><alias>World Wide Web Consortium</alias></lexeme>'
        '</lexicon>')
    assert language == "en-GB"
    assert entries == {"tomato": "/təˈmɑːtəʊ/", "Tomato": "/təˈmɑːtəʊ/",
                       "W3C": "World Wide Web Consortium"}
    with pytest.raises(InvalidParameter, match="line 1, column"):
        parse_pls("<lexicon><lexeme></lexicon>")
    with pytest.raises(InvalidParameter, match="DOCTYPE"):
        parse_pls('<!DOCTYPE l [<!ENTITY x "y">]><lexicon/>')
