"""Language detection by script, per run, with the request's override."""

from __future__ import annotations

import pytest

from engines.frontend import prepare
from engines.frontend.detect import (
    Run,
    base_language,
    canonical,
    detect,
    language_matches,
    split_runs,
)


def runs(text: str, default: str = "en", override: str | None = None) -> list[tuple[str, str]]:
    return [(r.text, r.language) for r in split_runs(text, default, override)]


@pytest.mark.parametrize(("text", "expected"), [
    ("价格是十二元。", "zh"),
    ("今日はいい天気です。", "ja"),
    ("東京タワーに行きます", "ja"),  # kanji with kana: Japanese
    ("東京大学", "zh"),  # kanji alone: Chinese unless the request says ja
    ("안녕하세요", "ko"),
    ("Привет, как дела?", "ru"),
    ("Καλημέρα", "el"),
    ("The quick brown fox.", "en"),
    ("12345", "en"),  # no letters: the voice's language
])
def test_detect_by_script(text: str, expected: str) -> None:
    assert detect(text) == expected


def test_mixed_chinese_english_splits_into_runs() -> None:
    assert runs("我喜欢Python编程，很有趣。") == [
        ("我喜欢", "zh"), ("Python", "en"), ("编程，很有趣。", "zh"),
    ]


def test_mixed_japanese_english_keeps_kanji_with_the_kana() -> None:
    assert runs("今日はGoogleで検索します。") == [
        ("今日は", "ja"), ("Google", "en"), ("で検索します。", "ja"),
    ]


def test_digits_and_punctuation_join_the_run_they_stand_in() -> None:
    assert runs("2024年3月15日，价格是12.5元") == [("2024年3月15日，价格是12.5元", "zh")]
    assert runs("Hello, 世界! 42") == [("Hello, ", "en"), ("世界! 42", "zh")]


def test_a_unit_after_a_number_stays_with_the_number() -> None:
    assert runs("距离5km，温度20°C") == [("距离5km，温度20°C", "zh")]
    assert runs("走了5 kmです") == [("走了5 kmです", "ja")]


def test_latin_reads_in_the_voices_language_when_it_is_written_in_latin() -> None:
    assert runs("Bonjour 世界", default="fr-fr") == [("Bonjour ", "fr-fr"), ("世界", "zh")]
    assert runs("Hello", default="ja") == [("Hello", "en")]  # a Japanese voice reads English
    assert runs("Hello", default="cmn") == [("Hello", "en")]


def test_override_claims_the_scripts_of_its_language_only() -> None:
    assert runs("東京大学", override="ja") == [("東京大学", "ja")]
    assert runs("東京大学でPythonを", override="ja") == [
        ("東京大学で", "ja"), ("Python", "en"), ("を", "ja"),
    ]
    assert runs("我喜欢Python", override="zh-CN") == [("我喜欢", "zh"), ("Python", "en")]
    assert runs("Hello 世界", override="en-gb") == [("Hello ", "en-gb"), ("世界", "zh")]


def test_runs_join_back_to_the_text() -> None:
    text = "Mix: 中文, 日本語のテキスト, English, русский, 한국어 and 123!"
    assert "".join(r.text for r in split_runs(text)) == text


def test_prepare_normalizes_each_run_in_its_language() -> None:
    assert prepare("我有2个苹果 and 3 pears", default="ja") == [
        Run("我有两个苹果 ", "zh"), Run("and three pears", "en"),
    ]


def test_language_tags() -> None:
    assert canonical("en_US") == "en-us"
    assert canonical("zh-CN") == canonical("cmn") == "zh"
    assert base_language("en-gb") == "en"
    assert language_matches("en-us", "en") and language_matches("cmn", "zh")
    assert not language_matches("en-us", "en-gb") and not language_matches("", "en")
