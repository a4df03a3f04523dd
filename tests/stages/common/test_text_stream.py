"""Incremental detokenization and stop strings, on the tiny tokenizer (multi-byte characters)."""

import pytest

from stages.common.tokenizer import IncrementalDetokenizer, StopStringMatcher, TextStream, Tokenizer

TEXTS = ["The café serves naïve tourists. 日本 is far! 🙂 ok", "plain ascii words, numbers 12345."]


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir):
    return Tokenizer(tiny_tokenizer_dir)


@pytest.mark.parametrize("text", TEXTS)
def test_streamed_pieces_join_to_the_full_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.push([i]) for i in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert all("\ufffd" not in p for p in pieces)  # never half a character


def test_multibyte_characters_span_tokens(tokenizer):
    # With a small byte-level vocabulary, some characters need several tokens: check we saw one.
    ids = tokenizer.encode("🙂")
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push([i]) for i in ids][-1] == "🙂"


def test_stop_string_split_across_pushes_is_never_emitted():
    m = StopStringMatcher(["STOP"])
    emitted = []
    for piece in ["hello S", "TO", "P and more"]:
        text, hit = m.feed(piece)
        emitted.append(text)
        if hit:
            break
    assert "".join(emitted) == "hello "
    assert hit


def test_false_start_of_a_stop_string_is_released():
    m = StopStringMatcher(["STOP"])
    out = [m.feed("ST")[0], m.feed("ART")[0]]
    assert "".join(out) + m.flush() == "START"
    assert out[0] == ""  # held back while it could still be a stop string


def test_earliest_of_several_stop_strings_wins():
    m = StopStringMatcher(["world", "lo w"])
    text, hit = m.feed("hello world")
    assert hit and text == "hel"


def test_text_stream_cuts_at_stop_string(tokenizer):
    ids = tokenizer.encode("numbers 12345 and more words")
    stream = TextStream(tokenizer, stop=["345"])
    for i in ids:
        _, hit = stream.push([i])
        if hit:
            break
    assert hit
    assert stream.text == "numbers 12"
