"""The SSML subset compiled to text the engines read, every character pointing into the SSML."""

from __future__ import annotations

import pytest

from app.text.lexicon import parse_pls
from app.text.prepared import cut, prepare
from app.text.ssml import SSMLError, compile_ssml, detect, say_as

DOC = ('<speak>Call <say-as interpret-as="telephone">+1 555 0100</say-as> now.'
       '<break time="700ms"/> The <sub alias="World Wide Web Consortium">W3C</sub> said '
       '<phoneme alphabet="ipa" ph="təˈmɑːtoʊ">tomato</phoneme> &amp; '
       '<prosody rate="slow">slowly</prosody>. <emphasis>Yes</emphasis></speak>')


def test_detected_by_its_speak_element_or_asked_for() -> None:
    assert detect("  <?xml version='1.0'?>\n<speak>Hi</speak>")
    assert not detect("I <speak> softly")
    assert detect("Hi", "ssml") and not detect("<speak>Hi</speak>", "text")
    with pytest.raises(SSMLError.__mro__[1]):
        detect("Hi", "html")


def test_compiled_text_and_where_each_part_came_from() -> None:
    compiled = compile_ssml(DOC)
    text = compiled.text
    assert "plus one, five five five, zero one zero zero" in text
    assert "World Wide Web Consortium" in text and "W3C" not in text
    assert "[tomato](/təˈmɑːtoʊ/)" in text
    assert "<" not in text and "&amp;" not in text
    spoken = compiled.spoken
    alias = text.index("World")
    assert DOC[slice(*spoken.source_span(alias, alias + 25))] == "W3C"
    slow = text.index("slowly")
    assert DOC[slice(*spoken.source_span(slow, slow + 6))] == "slowly"
    assert list(compiled.breaks.values()) == [0.7]
    assert [(text[a:b], r) for a, b, r in compiled.rates] == [("slowly", 0.75)]
    assert compiled.warnings == ["<emphasis> is accepted but not rendered; its text is read"]
    assert [(r.text, r.by) for r in compiled.readings] == [
        ("+1 555 0100", "say-as:telephone"), ("W3C", "sub"), ("tomato", "phoneme")]


@pytest.mark.parametrize(("kind", "written", "fmt", "spoken"), [
    ("characters", "NASA", "", "N A S A"),
    ("spell-out", "a1", "", "A one"),
    ("cardinal", "1,234", "", "one thousand two hundred thirty-four"),
    ("ordinal", "21", "", "twenty-first"),
    ("digits", "2048", "", "two zero four eight"),
    ("telephone", "(555) 010-0199", "", "five five five, zero one zero, zero one nine nine"),
    ("date", "2024-03-05", "ymd", "March fifth, twenty twenty-four"),
    ("date", "05/03/2024", "dmy", "March fifth, twenty twenty-four"),
    ("time", "14:30", "", "fourteen thirty"),
    ("currency", "$5.20", "", "five dollars and twenty cents"),
])
def test_say_as_reads_as_asked(kind: str, written: str, fmt: str, spoken: str) -> None:
    assert say_as(kind, written, fmt) == spoken


@pytest.mark.parametrize(("doc", "where"), [
    ("<speak>Hi\n  <s>there</speak>", "line 2, column 13"),
    ("<speak>Hi <break time='soon'/></speak>", "line 1, column 11"),
    ("<speak><say-as interpret-as='poem'>x</say-as></speak>", "line 1, column 8"),
    ("<voice>Hi</voice>", "line 1, column 1"),
    ("<speak>Hi <lang>there</lang></speak>", "line 1, column 11"),
    ("<speak>Hi <prosody pitch='+80Hz'>there</prosody></speak>", "line 1, column 11"),
    ("<speak>Hi <prosody pitch='+30st'>there</prosody></speak>", "line 1, column 11"),
    ('<!DOCTYPE s [<!ENTITY a "aaaa">]><speak>&a;</speak>', "line 1, column"),
])
def test_bad_ssml_names_its_line_and_column(doc: str, where: str) -> None:
    with pytest.raises(SSMLError) as raised:
        compile_ssml(doc)
    assert where in raised.value.message
    assert raised.value.param == "input"


def test_segments_are_cut_at_breaks_and_tempo_changes() -> None:
    prepared = prepare('<speak>One two.<break time="1.5s"/>Three <prosody rate="200%">four'
                       '</prosody> five.<break strength="weak"/></speak>')
    pieces = cut(prepared, lambda piece: [piece.strip()] if piece.strip() else [])
    assert pieces.segments == ["One two.", "Three", "four", "five."]
    assert pieces.pauses == {0: 1.5, 3: 0.25}
    assert pieces.rates == {2: 2.0}
    for segment, offset in zip(pieces.segments, pieces.offsets, strict=True):
        assert prepared.text[offset:offset + len(segment)] == segment


def test_segments_are_cut_where_the_voice_or_the_language_changes() -> None:
    prepared = prepare('<speak>One two. <voice name="piper">Three <lang xml:lang="fr-FR">'
                       'quatre</lang> five.</voice> Six <lang xml:lang="de">sieben</lang>.'
                       '</speak>')
    assert prepared.compiled.warnings == []
    pieces = cut(prepared, lambda piece: [piece.strip()] if piece.strip() else [])
    assert pieces.segments == ["One two.", "Three", "quatre", "five.", "Six", "sieben"]
    assert pieces.voices == {1: "piper", 2: "piper", 3: "piper"}
    assert pieces.languages == {2: "fr-fr", 5: "de"}  # the inner element wins
    for segment, offset in zip(pieces.segments, pieces.offsets, strict=True):
        assert prepared.text[offset:offset + len(segment)] == segment


def test_a_voice_without_a_name_is_read_by_the_requests_voice_with_a_warning() -> None:
    prepared = prepare('<speak>One. <voice gender="female">Two.</voice></speak>')
    pieces = cut(prepared, lambda piece: [piece.strip()] if piece.strip() else [])
    assert pieces.voices == {}
    assert prepared.compiled.warnings == [
        "<voice> without a name is not rendered: the request's voice reads it"]


def test_prosody_pitch_is_a_factor_per_segment_the_inner_one_winning() -> None:
    prepared = prepare('<speak>Low <prosody pitch="x-low">down <prosody pitch="+12st">up'
                       '</prosody></prosody> <prosody pitch="-10%" rate="fast">then</prosody>'
                       '</speak>')
    assert prepared.compiled.warnings == []
    pieces = cut(prepared, lambda piece: [piece.strip()] if piece.strip() else [])
    assert pieces.segments == ["Low", "down", "up", "then"]
    assert pieces.pitches == {1: 0.75, 2: pytest.approx(2.0), 3: pytest.approx(0.9)}
    assert pieces.rates == {3: 1.25}


def test_nested_elements_over_the_same_text_the_inner_one_wins() -> None:
    for outer, inner in (("espeak", "piper"), ("piper", "espeak")):
        prepared = prepare(f'<speak><voice name="{outer}"><voice name="{inner}">Good morning.'
                           '</voice></voice></speak>')
        pieces = cut(prepared, lambda piece: [piece.strip()] if piece.strip() else [])
        assert pieces.voices == {0: inner}
    for outer, inner in (("de", "fr-fr"), ("fr-fr", "de")):
        prepared = prepare(f'<speak><lang xml:lang="{outer}"><lang xml:lang="{inner}">Bonjour.'
                           '</lang></lang></speak>')
        pieces = cut(prepared, lambda piece: [piece.strip()] if piece.strip() else [])
        assert pieces.languages == {0: inner}


def test_a_language_tag_is_checked() -> None:
    with pytest.raises(SSMLError) as raised:
        prepare('<speak>Hello. <lang xml:lang="fr&#10;X-Injected: 1">Bonjour.</lang></speak>')
    assert "is not a language tag" in raised.value.message


def test_an_xml_encoding_declaration_does_not_reread_the_text() -> None:
    """The document came as text (JSON's UTF-8): a declaration naming another encoding is not
    obeyed (it turned `héllo` into mojibake)."""
    compiled = compile_ssml('<?xml version="1.0" encoding="ISO-8859-1"?>'
                            "<speak>héllo wörld</speak>")
    assert compiled.text.strip() == "héllo wörld"
    language, entries = parse_pls(
        '<?xml version="1.0" encoding="ISO-8859-1"?><lexicon version="1.0" '
        'xmlns="http://www.w3.org/2005/01/pronunciation-lexicon" alphabet="ipa" '
        'xml:lang="de"><lexeme><grapheme>Müller</grapheme><alias>Mueller</alias></lexeme>'
        "</lexicon>")
    assert (language, entries) == ("de", {"Müller": "Mueller"})
