"""`llm.sentence_case`: each sentence of a reply begins upper case, abbreviations are no
sentence ends, and a prefix's case never changes as the text grows (streamed replies)."""

from __future__ import annotations

from llm.sentence_case import sentence_case


def test_sentences_begin_upper_case() -> None:
    assert sentence_case("yeah I am. I think so") == "Yeah I am. I think so"
    assert sentence_case("what? what is your favorite movie?") == "What? What is your favorite movie?"
    assert sentence_case('ok!  "hi" there') == 'Ok!  "Hi" there'
    assert sentence_case("Hello. How can I help?") == "Hello. How can I help?"
    assert sentence_case("") == ""


def test_abbreviations_and_numbers_are_no_sentence_ends() -> None:
    assert sentence_case("it's 5 p.m. now") == "It's 5 p.m. now"
    assert sentence_case("ask Dr. smith") == "Ask Dr. smith"
    assert sentence_case("it costs 3.5 dollars") == "It costs 3.5 dollars"
    assert sentence_case("oh no. that is bad") == "Oh no. That is bad"


def test_a_prefix_keeps_its_case_as_the_text_grows() -> None:
    whole = "sure. what time? at 5 p.m. if that works. thanks"
    cased = sentence_case(whole)
    for n in range(len(whole) + 1):
        assert cased.startswith(sentence_case(whole[:n])), whole[:n]
