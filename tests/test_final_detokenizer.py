"""final/'s detokenizer: streamed text never splits a character, and stop strings are held back
until decided."""

from __future__ import annotations

from final.frontend.detokenizer import IncrementalDetokenizer, TextStream
from final.frontend.tokenizer import Tokenizer

# ---------------------------------------------------------------------------------------------
# Detokenizer


def test_stream_never_splits_a_character_and_flushes_the_rest(tiny_tokenizer_dir):
    tok = Tokenizer(tiny_tokenizer_dir)
    ids = tok.encode("café 🙂 日本")
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push([i]) for i in ids]
    assert "".join(pieces) == tok.decode(ids) and all("\ufffd" not in p for p in pieces)
    # A stream that ends inside a character still ends with everything decode() gives.
    emoji = tok.encode("🙂")
    stream = TextStream(tok)
    for i in emoji[:-1]:
        stream.push([i])
    assert stream.text == ""
    stream.finish()
    assert stream.text == tok.decode(emoji[:-1])


def test_stop_string_held_back_until_decided(tiny_tokenizer_dir):
    tok = Tokenizer(tiny_tokenizer_dir)
    stream = TextStream(tok, stop=["12345"])
    emitted = []
    for i in tok.encode("numbers 1234 and 12345 more"):
        text, hit = stream.push([i])
        emitted.append(text)
        if hit:
            break
    assert hit and "".join(emitted) == stream.text == "numbers 1234 and "
