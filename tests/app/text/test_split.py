from __future__ import annotations

import math
import random
import re
from itertools import pairwise

import pytest

from app.text.punctuation import CLOSERS
from app.text.split import (
    MIN_REST,
    IncrementalSplitter,
    first_sentence,
    join_kind,
    normalize_ws,
    segment_offsets,
    split_text,
)

LANGUAGES = [
    (
        "en",
        "Dr. Smith went to Washington. He arrived at 3.14 p.m. on Friday! "
        "Did he meet the U.S. president? Nobody knows.",
        [
            "Dr. Smith went to Washington.",
            "He arrived at 3.14 p.m. on Friday!",
            "Did he meet the U.S. president?",
            "Nobody knows.",
        ],
    ),
    (
        "zh",
        "今天天气很好。我们去公园散步吧！你觉得怎么样？",
        ["今天天气很好。", "我们去公园散步吧！", "你觉得怎么样？"],
    ),
    (
        "ja",
        "こんにちは。今日はいい天気ですね！散歩に行きましょうか？",
        ["こんにちは。", "今日はいい天気ですね！", "散歩に行きましょうか？"],
    ),
    (
        "ko",
        "안녕하세요. 오늘 날씨가 좋네요! 산책하러 갈까요?",
        ["안녕하세요.", "오늘 날씨가 좋네요!", "산책하러 갈까요?"],
    ),
    (
        "fr",
        "Bonjour ! Comment allez-vous ? M. Dupont est arrivé hier. "
        "Il dit : « Je suis content ! » Puis il part.",
        [
            "Bonjour !",
            "Comment allez-vous ?",
            "M. Dupont est arrivé hier.",
            "Il dit : « Je suis content ! »",
            "Puis il part.",
        ],
    ),
    (
        "de",
        "Guten Tag! Wie geht es Ihnen? Das kostet ca. 5 Euro, z.B. am Montag. Danke.",
        ["Guten Tag!", "Wie geht es Ihnen?", "Das kostet ca. 5 Euro, z.B. am Montag.", "Danke."],
    ),
    (
        "es",
        "¡Hola! ¿Cómo estás? La Sra. García vive en Madrid. ¡Qué bien!",
        ["¡Hola!", "¿Cómo estás?", "La Sra. García vive en Madrid.", "¡Qué bien!"],
    ),
    (
        "it",
        "Buongiorno! Come stai? Il dott. Rossi arriva alle 3.30. Ci vediamo domani.",
        ["Buongiorno!", "Come stai?", "Il dott. Rossi arriva alle 3.30.", "Ci vediamo domani."],
    ),
    (
        "pt",
        "Olá! Como vai você? O Sr. Silva chegou ontem. Até logo.",
        ["Olá!", "Como vai você?", "O Sr. Silva chegou ontem.", "Até logo."],
    ),
    (
        "ru",
        "Привет! Как у тебя дела? Проф. Иванов прочитал лекцию. Всё было хорошо.",
        ["Привет!", "Как у тебя дела?", "Проф. Иванов прочитал лекцию.", "Всё было хорошо."],
    ),
    (
        "hi",
        "नमस्ते। आप कैसे हैं? मैं ठीक हूँ।",
        ["नमस्ते।", "आप कैसे हैं?", "मैं ठीक हूँ।"],
    ),
    (
        "ar",
        "مرحبا! كيف حالك؟ أنا بخير، شكرا.",
        ["مرحبا!", "كيف حالك؟", "أنا بخير، شكرا."],
    ),
    (
        "th",
        "สวัสดีครับ วันนี้อากาศดีมาก เราไปเที่ยวทะเลกันไหม",
        ["สวัสดีครับ", "วันนี้อากาศดีมาก", "เราไปเที่ยวทะเลกันไหม"],
    ),
    ("el", "Τι κάνεις; Είμαι καλά.", ["Τι κάνεις;", "Είμαι καλά."]),
    ("hy", "Բարև։ Ինչպե՞ս ես։", ["Բարև։", "Ինչպե՞ս ես։"]),
    ("am", "ሰላም ነው። እንዴት ነህ፧", ["ሰላም ነው።", "እንዴት ነህ፧"]),
]


def stream(text: str, sizes: list[int] | None = None, **options: int) -> list[str]:
    """Feed `text` in pieces of the given sizes (cycled), one character at a time by default."""
    splitter = IncrementalSplitter(**options)
    segments: list[str] = []
    sizes, start, turn = sizes or [1], 0, 0
    while start < len(text):
        size = sizes[turn % len(sizes)]
        segments += splitter.feed(text[start : start + size])
        start, turn = start + size, turn + 1
    return segments + splitter.flush()


def squeeze(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize(("language", "text", "expected"), LANGUAGES, ids=[c[0] for c in LANGUAGES])
def test_sentences_in_each_language(language: str, text: str, expected: list[str]) -> None:
    assert split_text(text) == expected
    assert stream(text) == expected
    assert stream(text, [3, 1, 7, 2]) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Mr. Brown and Mrs. Green met Dr. Who at St. Mary's.",
        "Fruit, e.g. apples, i.e. the red ones, are good.",
        "The U.S. Army is big.",
        "Pi is 3.14 and e is 2.718 today.",
        "Wait... what happened here?",
        "Visit example.com for details.",
        "See p. 5 and fig. 3 for more.",
        "It costs $1,000.50 at 12:30 sharp.",
        "Yahoo!Inc made news!",
    ],
)
def test_no_cut_inside_abbreviations_decimals_ellipses(text: str) -> None:
    assert split_text(text) == [text]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("(This is an aside.) And the main text.", ["(This is an aside.)", "And the main text."]),
        ("„Hallo.“ Dann ging er.", ["„Hallo.“", "Dann ging er."]),
        ('She asked. "Why?" He shrugged.', ["She asked.", '"Why?"', "He shrugged."]),
        ("「はい。」「いいえ。」", ["「はい。」", "「いいえ。」"]),
        ("Er sagte: »Ja.« Dann ging er.", ["Er sagte: »Ja.«", "Dann ging er."]),
    ],
)
def test_closing_quotes_stay_with_their_sentence(text: str, expected: list[str]) -> None:
    assert split_text(text) == expected


def test_paragraph_breaks_end_sentences() -> None:
    text = "A title without a period\n\nThe body starts here\nand goes on"
    assert split_text(text) == ["A title without a period", "The body starts here\nand goes on"]


def test_numbered_list_items_are_not_sentences() -> None:
    text = "Buy these:\n1. Eggs\n2. Milk and bread\nThat is all. In 1999. Then more."
    assert split_text(text) == [
        "Buy these:\n1. Eggs\n2. Milk and bread\nThat is all.",
        "In 1999.",
        "Then more.",
    ]


def test_lowercase_after_terminator_is_not_a_sentence_end() -> None:
    assert split_text("He shouted hello! and then left. Oh? yes.") == [
        "He shouted hello! and then left.",
        "Oh? yes.",
    ]


def test_empty_and_whitespace() -> None:
    assert split_text("") == []
    assert split_text("  \n\t ") == []
    assert stream("   ") == []
    assert IncrementalSplitter().flush() == []


def test_short_sentences_stay_whole_and_speechless_pieces_merge() -> None:
    assert split_text("Hi.") == ["Hi."]
    assert split_text("Hi. How are you?") == ["Hi.", "How are you?"]
    assert split_text("🙂. Hello there.") == ["🙂. Hello there."]
    assert split_text("Hello there. 🙂!") == ["Hello there. 🙂!"]
    assert split_text("你好。…") == ["你好。…"]


def test_long_text_without_punctuation_is_cut_between_words() -> None:
    words = [f"w{i % 97}" for i in range(600)]
    text = " ".join(words)
    segments = split_text(text, max_chars=200, first_max_chars=80)
    assert len(segments[0]) <= 80
    assert all(len(s) <= 200 for s in segments)
    assert " ".join(segments) == text


def test_cjk_without_spaces_is_hard_cut() -> None:
    text = "漢字仮名交じり文" * 120
    segments = split_text(text, max_chars=100, first_max_chars=30)
    assert [len(s) for s in segments[:2]] == [30, 100]
    assert "".join(segments) == text


def test_cjk_clause_marks_are_used_before_a_hard_cut() -> None:
    text = "这是一个很长的句子，" * 20 + "结束。"
    segments = split_text(text, max_chars=55, first_max_chars=25)
    assert all(s.endswith(("，", "。")) for s in segments)
    assert max(len(s) for s in segments) <= 55
    assert "".join(segments) == text


def test_hard_cut_keeps_combining_marks_with_their_letter() -> None:
    text = "e\u0301" * 150
    segments = split_text(text, max_chars=51, first_max_chars=None)
    assert all(len(s) <= 51 and not s.startswith("\u0301") for s in segments)
    assert "".join(segments) == text


def test_first_segment_cut_at_clause_mark_within_budget() -> None:
    text = (
        "Well, to answer your question about the weather tomorrow, we expect light rain "
        "in the morning and sunshine later in the afternoon. Bring an umbrella."
    )
    segments = split_text(text, first_max_chars=80)
    assert segments[0] == "Well, to answer your question about the weather tomorrow,"
    assert segments[1:] == [
        "we expect light rain in the morning and sunshine later in the afternoon.",
        "Bring an umbrella.",
    ]


def test_first_segment_falls_back_to_whitespace() -> None:
    text = "one two three four five seven eight nine ten eleven twelve. Next one."
    segments = split_text(text, first_max_chars=30)
    assert segments[0] == "one two three four five seven"
    assert segments[1] == "eight nine ten eleven twelve."


def test_a_first_segment_cut_leaves_no_word_or_two_alone() -> None:
    text = "Please call me tomorrow morning. The library opens at noon."
    assert split_text(text, first_max_chars=30)[0] == "Please call me tomorrow morning."
    # Streamed, the cut waits until enough of the sentence has come to know the rest is long.
    splitter = IncrementalSplitter(first_max_chars=30)
    assert splitter.feed("Please call me tomorrow mor") == []
    assert splitter.feed("ning. The library") == ["Please call me tomorrow morning."]
    splitter = IncrementalSplitter(first_max_chars=30)
    assert splitter.feed("The morning train left the station exac") == []
    assert splitter.feed("tly on") == ["The morning train left"]


def test_first_segment_is_not_cut_after_a_short_word_when_a_longer_one_fits() -> None:
    text = "The morning train left the station exactly on time. Passengers read quietly."
    assert split_text(text, first_max_chars=30)[:2] == ["The morning train left",
                                                         "the station exactly on time."]
    # Only short words within the budget: the cut falls after one of them, never past it.
    assert split_text("a b c d e f g h i j k l m n o p q r s t", first_max_chars=12)[0] == \
        "a b c d e f"


@pytest.mark.parametrize(("segment", "kind"), [
    ("It left on time.", "sentence"), ('He said "stop."', "sentence"), ("Really?)", "sentence"),
    ("終わり。", "sentence"), ("Well,", "clause"), ("first; ", "clause"), ("等等，", "clause"),
    ("The morning train left", "word"), ("3.14", "word"),
])
def test_join_kind_tells_how_a_segment_ends(segment: str, kind: str) -> None:
    assert join_kind(segment) == kind


TRAIN = " ".join([
    "The morning train left the station exactly on time.",
    "Passengers read their papers in comfortable silence.",
    "Outside, the wide fields were covered in a thin frost.",
    "A conductor walked slowly down the narrow aisle.",
    "He checked every single ticket with great care.",
] * 6)


def test_packing_grows_each_budget_up_to_the_engine_limit_at_sentence_ends() -> None:
    plain = split_text(TRAIN, max_chars=300, first_max_chars=30)
    packed = split_text(TRAIN, max_chars=300, first_max_chars=30, growth=2)
    assert packed[0] == plain[0] == "The morning train left"
    for k, segment in enumerate(packed[1:], start=1):
        assert len(segment) <= min(300, 30 * 2 ** k), (k, segment)
    assert max(len(s) for s in packed) > 200  # later segments hold several sentences
    assert len(packed) < len(plain) / 3
    # Nothing lost, nothing reordered: each packed segment is a run of the plain ones.
    assert " ".join(packed) == " ".join(plain)
    assert all(join_kind(s) == "sentence" for s in packed[1:])
    starts = segment_offsets(TRAIN, packed)
    assert all(TRAIN[o : o + len(s)] == s for o, s in zip(starts, packed, strict=True))


def test_infinite_growth_packs_every_segment_after_the_first_up_to_the_limit() -> None:
    plain = split_text(TRAIN, max_chars=300, first_max_chars=30)
    full = split_text(TRAIN, max_chars=300, first_max_chars=30, growth=math.inf)
    assert full[0] == plain[0]
    assert " ".join(full) == " ".join(plain)
    # Each segment but the last is full: the next one's first sentence would not have fitted.
    for segment, after in pairwise(full[1:]):
        following = next(s for s in plain if after.startswith(s))
        assert len(segment) <= 300 < len(segment) + 1 + len(following), (segment, following)
    assert len(full) < len(split_text(TRAIN, max_chars=300, first_max_chars=30, growth=2))


def test_packing_keeps_paragraph_breaks_as_boundaries() -> None:
    text = "First words here. Second one is here. Third one too.\n\nA new paragraph. And more."
    packed = split_text(text, max_chars=300, first_max_chars=20, growth=4)
    assert packed == ["First words here.", "Second one is here. Third one too.",
                      "A new paragraph. And more."]


def test_no_growth_keeps_one_sentence_per_segment() -> None:
    segments = split_text(TRAIN, max_chars=300, first_max_chars=120, growth=1)
    assert len(segments) == 30
    assert split_text("One. Two.", growth=4) == ["One.", "Two."]


def test_french_space_before_punctuation_is_never_a_cut() -> None:
    text = "Attention : le train de dix heures est annulé ! Vraiment ?"
    for first in (12, 20, 46):
        segments = split_text(text, first_max_chars=first, min_chars=2)
        assert not any(s[0] in "!?:;" for s in segments), segments


def test_invalid_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        split_text("text", max_chars=0)
    with pytest.raises(ValueError):
        IncrementalSplitter(first_max_chars=0)


WORDS = [
    "the", "quick", "brown", "fox", "Dr.", "e.g.", "U.S.", "3.14", "...", "hello", "World",
    "Привет", "мир", "Bonjour", "¿Qué", "¡Hola", "नमस्ते", "مرحبا", "สวัสดี", "วันนี้", "今天",
    "天气", "こんにちは", "🙂", "a", "I", "x", "1,000", "12:30", "«oui»", '"quoted"', "(aside)",
]  # fmt: skip
MARKS = [
    "", "", "", ".", "!", "?", ",", ";", ":", " !", " ?", '."', "?)", "...", "…", "。", "！",
    "、", "，", "।", "؟", "،", "—", ".\u201d",
]  # fmt: skip
GAPS = [" ", " ", " ", " ", "", "\n", "\n\n", "  ", "\u00a0"]


def random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 120)):
        parts += [rng.choice(WORDS), rng.choice(MARKS), rng.choice(GAPS)]
    return rng.choice(["", " ", "\n"]) + "".join(parts)


def test_nothing_is_dropped_and_limits_hold_on_random_text() -> None:
    rng = random.Random(20261202)
    for _ in range(400):
        text = random_text(rng)
        max_chars, first = rng.choice([(400, 150), (120, 40), (60, None), (25, 10)])
        segments = split_text(text, max_chars=max_chars, first_max_chars=first)
        assert squeeze("".join(segments)) == squeeze(text)
        assert all(s and s == s.strip() for s in segments)
        assert all(len(s) <= max_chars for s in segments)
        if segments and first:  # over its budget only to keep a short rest with it
            assert len(segments[0]) < first + MIN_REST
        if not text.strip():
            assert segments == []


def test_streaming_matches_batch_on_random_text() -> None:
    rng = random.Random(7)
    for index in range(150):
        text = random_text(rng)
        if re.search("[。！।؟][" + re.escape(".!?…。！।؟" + CLOSERS) + "]", text):
            continue  # CJK-style marks complete at once, before a following mark or quote
        options = {"max_chars": 120, "first_max_chars": 40, "min_chars": 10}
        sizes = [1] if index % 10 == 0 else [rng.randint(1, 9) for _ in range(5)]
        assert stream(text, sizes, **options) == stream(text, [len(text) or 1], **options)


def test_three_sentences_token_by_token() -> None:
    splitter = IncrementalSplitter()
    tokens = ["Hi", ".", " How", " are", " you", " to", "day", "?", " I", "'m", " fine", "."]
    emitted = [splitter.feed(token) for token in tokens]
    assert emitted[2] == ["Hi."]  # out as soon as the next sentence starts
    assert emitted[8] == ["How are you today?"]
    segments = [s for batch in emitted for s in batch] + splitter.flush()
    assert segments == ["Hi.", "How are you today?", "I'm fine."]


def test_streaming_waits_until_a_sentence_is_known_to_end() -> None:
    splitter = IncrementalSplitter()
    assert splitter.feed("Dr") == []
    assert splitter.feed(". ") == []
    assert splitter.feed("Smith is here. ") == []  # "here." could still be "here. and"
    assert splitter.pending == "Dr. Smith is here. "
    assert splitter.feed("The") == ["Dr. Smith is here."]
    assert splitter.pending == "The"


def test_cjk_terminators_complete_at_once() -> None:
    splitter = IncrementalSplitter()
    assert splitter.feed("你好") == []
    assert splitter.feed("。") == ["你好。"]
    assert splitter.feed("今天怎么样？") == ["今天怎么样？"]
    assert splitter.pending == ""


def test_flush_forces_out_the_buffer_and_restarts_the_short_first_segment() -> None:
    splitter = IncrementalSplitter(max_chars=100, first_max_chars=20)
    assert splitter.feed("Hello wor") == []
    assert splitter.flush() == ["Hello wor"]
    assert splitter.pending == ""
    assert splitter.flush() == []
    long = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda"
    first = splitter.feed(long)
    assert first == ["alpha beta gamma"]
    assert splitter.flush()[0] != long


def test_streaming_cuts_long_unpunctuated_text_before_flush() -> None:
    splitter = IncrementalSplitter(max_chars=50, first_max_chars=20)
    emitted = [s for i in range(100) for s in splitter.feed(f"word{i} ")]
    assert emitted and all(len(s) <= 50 for s in emitted)
    assert len(emitted[0]) <= 20
    assert normalize_ws(" ".join([*emitted, *splitter.flush()])) == normalize_ws(
        " ".join(f"word{i}" for i in range(100))
    )


def test_a_first_budget_at_the_limit_packs_the_first_segment_too() -> None:
    """A whole-file request (`SpeechService.plan(whole=True)`) asks for no short first segment."""
    packed = split_text(TRAIN, max_chars=300, first_max_chars=300, growth=2)
    assert all(len(s) <= 300 for s in packed)
    assert len(packed) <= -(-len(TRAIN) // 300) + 1  # full calls, one more at most for the cuts
    assert " ".join(packed) == " ".join(split_text(TRAIN, max_chars=300, first_max_chars=300))
    assert all(join_kind(s) == "sentence" for s in packed)
    assert split_text("One. Two.", max_chars=300, first_max_chars=300, growth=2) == ["One. Two."]
    assert split_text("One.\n\nTwo.", max_chars=300, first_max_chars=300, growth=2) == [
        "One.", "Two."]


def test_a_book_cuts_into_more_than_a_thousand_segments() -> None:
    """The packing budget grows per segment: past ~1,000 it overflowed a float."""
    text = "Sentence number one is here, and it goes on for a while. " * 12_000
    for first in (600, 30):
        segments = split_text(text, max_chars=600, first_max_chars=first, growth=2.0)
        assert len(segments) > 1000
        assert max(map(len, segments)) <= 600
        assert " ".join(segments).split() == text.split()


def test_first_sentence_reads_a_piece_at_a_time_and_agrees_with_a_whole_split() -> None:
    rng = random.Random(7)
    alphabet = "abc de. F! g? h, i\n\nJ Dr. Smith 3.5 e.g. the «x» 「日本。」 — ;:"
    texts = ["", "   ", "No end here", "A" * 700 + ". Then more.",
             *("".join(rng.choice(alphabet) for _ in range(rng.randint(100, 700)))
               for _ in range(300))]
    for text in texts:
        for budget in (60, 150, 400):
            whole = IncrementalSplitter(max_chars=budget, first_max_chars=budget)
            segments = whole.feed(text) + whole.flush()
            assert first_sentence(text, budget) == (segments[0] if segments else ""), text
