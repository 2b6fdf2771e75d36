"""English normalization on real sentences: the text a person would read aloud."""

from __future__ import annotations

import pytest

from engines.frontend.en import normalize

SENTENCES = [
    ("$12.50 on 3/15", "twelve dollars and fifty cents on March fifteenth"),
    ("Dr. Smith lives at 221B Baker St.",
     "Doctor Smith lives at two hundred twenty-one B Baker Street."),
    ("It's 3:30 pm", "It's three thirty P M"),
    ("Sales rose 50% this year.", "Sales rose fifty percent this year."),
    ("She finished 1st in the race.", "She finished first in the race."),
    ("He was born in 1999.", "He was born in nineteen ninety-nine."),
    ("The 22nd of March", "The twenty-second of March"),
    ("Tickets cost $1, or €5 at the door.", "Tickets cost one dollar, or five euros at the door."),
    ("That's $0.99 and £2.01.", "That's ninety-nine cents and two pounds and one penny."),
    ("The fund raised $2.5 million.", "The fund raised two point five million dollars."),
    ("Meet me at 15:00 or 9:05 am.", "Meet me at fifteen hundred or nine oh five A M."),
    ("It starts at 7 pm.", "It starts at seven P M."),
    ("Born 12/25/2024, due 2024-03-15.",
     "Born December twenty-fifth, twenty twenty-four, due March fifteenth, twenty twenty-four."),
    ("Add 1/2 cup of sugar.", "Add one half cup of sugar."),
    ("Music of the 1990s and the '80s.", "Music of the nineteen nineties and the eighties."),
    ("It weighs 5 kg and runs at 20°C.",
     "It weighs five kilograms and runs at twenty degrees Celsius."),
    ("Only 1 km to go.", "Only one kilometer to go."),
    ("It was -3.5 degrees.", "It was minus three point five degrees."),
    ("Read pages 10-20.", "Read pages ten to twenty."),
    ("Call 555-123-4567 now.", "Call five five five, one two three, four five six seven now."),
    # phone numbers as people write them: digit groups with a pause between them
    ("Call (800) 555-0199 now.", "Call eight zero zero, five five five, zero one nine nine now."),
    ("Call 800.555.0199 today.",
     "Call eight zero zero, five five five, zero one nine nine today."),
    ("Call 800 555 0199.", "Call eight zero zero, five five five, zero one nine nine."),
    ("Call +1 800 555 0199.",
     "Call plus one, eight zero zero, five five five, zero one nine nine."),
    ("Call 1-800-555-0199.", "Call one, eight zero zero, five five five, zero one nine nine."),
    ("Call +44 20 7946 0958 in London.",
     "Call plus four four, two zero, seven nine four six, zero nine five eight in London."),
    ("Dial 555-0199.", "Dial five five five, zero one nine nine."),
    ("Call me at 555-1234.", "Call me at five five five, one two three four."),
    # real ranges stay ranges
    ("From 1990-1995 it grew.", "From nineteen ninety to nineteen ninety-five it grew."),
    ("From 500-1000 people came.", "From five hundred to one thousand people came."),
    ("Meet at 10:30-11:45.", "Meet at ten thirty to eleven forty-five."),
    # versions and dotted numbers
    ("Update to v2.3.1 now.", "Update to version two point three point one now."),
    ("Python 3.11 is out.", "Python three point eleven is out."),
    ("At 3.50 each, it's cheap.", "At three point five zero each, it's cheap."),
    ("Ping 192.168.0.1 now.",
     "Ping one hundred ninety-two dot one hundred sixty-eight dot zero dot one now."),
    ("1,234,567 people",
     "one million two hundred thirty-four thousand five hundred sixty-seven people"),
    ("Pi is about 3.14.", "Pi is about three point one four."),
    ("Agent 007", "Agent zero zero seven"),
    ("Mr. and Mrs. Jones vs. the Smiths, etc.",
     "Mister and Missus Jones versus the Smiths, et cetera."),
    ("Elm Dr. is near St. Louis.", "Elm Drive is near Saint Louis."),
    ("Go to Main St. Then turn left.", "Go to Main Street. Then turn left."),
    ("No. 7 and #3", "number seven and number three"),
    ("Visit https://www.example.com/docs?page=2 today.",
     "Visit W W W dot example dot com slash docs today."),
    ("Mail john.doe@example.com now", "Mail john dot doe at example dot com now"),
    ("Ｔｏｔａｌ　１２％", "Total twelve percent"),
    ("Rock & roll", "Rock and roll"),
]


@pytest.mark.parametrize(("text", "expected"), SENTENCES)
def test_english_is_normalized_as_read_aloud(text: str, expected: str) -> None:
    assert normalize(text) == expected


def test_text_without_numbers_or_abbreviations_is_unchanged() -> None:
    text = "The quick brown fox jumps over the lazy dog."
    assert normalize(text) == text


def test_every_digit_is_read() -> None:
    for text, _ in SENTENCES:
        assert not any(c.isdigit() for c in normalize(text)), text
