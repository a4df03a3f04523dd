"""final/'s detokenizer: streamed text never splits a character, and stop strings are held back
until decided."""

from __future__ import annotations

import random

import pytest

from final.frontend.detokenizer import IncrementalDetokenizer, TextStream
from final.frontend.tokenizer import Tokenizer, _direct_decode

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


# ---------------------------------------------------------------------------------------------
# Tokenizer.decode: the detokenizer's fast path gives HF's text


def _decode_cases(tok: Tokenizer, seed: int) -> list[list[int]]:
    """Id lists of 1 to 6 ids (special tokens included), each single id asked twice: the second
    answer comes from the remembered text."""
    rng = random.Random(seed)
    vocab = len(tok.hf)
    singles = [[i] for i in range(min(vocab, 300))] + [[rng.randrange(vocab)] for _ in range(200)]
    windows = [[rng.randrange(vocab) for _ in range(rng.randint(2, 6))] for _ in range(500)]
    windows += [[0, 1, 2] + w for w in windows[:50]]  # the tiny tokenizer's special tokens lead
    return singles + windows + singles


@pytest.mark.parametrize("which", ["tiny", "default"])
def test_decode_is_hf_decode_without_special_tokens(which, request):
    folder = request.getfixturevalue("tiny_tokenizer_dir" if which == "tiny" else "default_model_dir")
    tok = Tokenizer(folder)
    assert tok._decode_ids is not None, "the fast path should serve this tokenizer"
    for ids in _decode_cases(tok, seed=3):
        assert tok.decode(ids) == tok.hf.decode(ids, skip_special_tokens=True), ids


def test_decode_goes_through_hf_where_hf_does_more(tiny_tokenizer_dir):
    """HF's decode is skipped only where it adds nothing: not when it cleans up spaces after
    decoding (WordPiece's habit), nor for a tokenizer class with a decode of its own."""
    hf = Tokenizer(tiny_tokenizer_dir).hf
    assert _direct_decode(hf) is not None
    hf.clean_up_tokenization_spaces = True
    assert _direct_decode(hf) is None
    hf.clean_up_tokenization_spaces = False

    class OwnDecode(type(hf)):
        def _decode(self, *args, **kwargs):
            return "its own text"

    hf.__class__ = OwnDecode
    assert _direct_decode(hf) is None


def test_candidate_text_keeps_special_tokens_and_decodes_each_token_once(tiny_tokenizer_dir):
    """Logprob candidates' text: HF's decode of the token alone, special tokens shown; a request
    asking for many candidates names the same tokens every step, so each is decoded once."""
    tok = Tokenizer(tiny_tokenizer_dir)
    ids = [0, 1, 2, *range(3, min(200, tok.hf.vocab_size))]
    want = [tok.hf.decode([i]) for i in ids]
    calls = []
    decode = tok.hf.decode
    tok.hf.decode = lambda seq, *a, **k: calls.append(list(seq)) or decode(seq, *a, **k)
    for _ in range(3):  # three steps naming the same candidates
        assert [tok.token_text(i) for i in ids] == want
    assert len(calls) == len(ids), "each token's text is decoded once"
    assert want[0] != "" and tok.decode([0]) == "", "the special token shows as a candidate only"


# ---------------------------------------------------------------------------------------------
# Text decoded once at the end (the offline API) is the streamed text


@pytest.mark.parametrize("which", ["tiny", "default"])
def test_text_decoded_at_the_end_is_the_streamed_text(which, request):
    """RequestState(text_at_end=True), what LLM.generate uses for requests without stop strings,
    decodes all tokens in one push at the finish: the same text as token by token, on random
    token ids (multi-byte pieces and special tokens included) after random prompts."""
    from final.core.sampling_params import SamplingParams
    from final.engine.messages import RequestDelta
    from final.frontend.request_state import RequestState

    folder = request.getfixturevalue("tiny_tokenizer_dir" if which == "tiny" else "default_model_dir")
    tok = Tokenizer(folder)
    rng = random.Random(11)
    vocab = len(tok.hf)
    for case in range(150):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 8))]
        output = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        texts = []
        for at_end in (False, True):
            state = RequestState(
                case, prompt, SamplingParams(max_tokens=len(output)), tok, text_at_end=at_end
            )
            for i, token in enumerate(output):
                last = i == len(output) - 1
                state.apply(
                    RequestDelta(rid=case, token_ids=[token], finish_reason="length" if last else None)
                )
            assert state.finished
            texts.append(state.output.text)
        assert texts[0] == texts[1], (prompt, output)
    with_stop = RequestState(0, [1], SamplingParams(stop=["x"]), tok, text_at_end=True)
    assert not with_stop.text_at_end  # a stop string needs the text as it comes


# ---------------------------------------------------------------------------------------------
# skip_special_tokens=False (vLLM's request field): the special tokens written into the text


@pytest.mark.parametrize("which", ["tiny", "default"])
def test_a_request_can_keep_its_special_tokens(which, request):
    """A request's text leaves the special tokens out by default and writes them with
    skip_special_tokens=False, token by token as at the end, equal to HF's decode either way; the
    default's text (and its cache of token texts) does not change for it."""
    from final.core.sampling_params import SamplingParams
    from final.engine.messages import RequestDelta
    from final.frontend.request_state import RequestState

    folder = request.getfixturevalue("tiny_tokenizer_dir" if which == "tiny" else "default_model_dir")
    tok = Tokenizer(folder)
    special = tok.hf.all_special_ids[0]
    output = (
        tok.encode("hello", add_special_tokens=False)
        + [special]
        + tok.encode(" world", add_special_tokens=False)
    )
    for skip in (True, False):
        want = tok.hf.decode(output, skip_special_tokens=skip)
        for at_end in (False, True):
            params = SamplingParams(max_tokens=len(output), skip_special_tokens=skip)
            state = RequestState(0, [5], params, tok, text_at_end=at_end)
            for i, token in enumerate(output):
                finish = "length" if i == len(output) - 1 else None
                state.apply(RequestDelta(rid=0, token_ids=[token], finish_reason=finish))
            assert state.output.text == want, (skip, at_end)
    assert tok.hf.convert_ids_to_tokens(special) in tok.for_request(False).decode(output)
    assert tok.decode([special]) == "" and tok.for_request(True) is tok
    with pytest.raises(Exception, match="skip_special_tokens must be True or False"):
        SamplingParams(skip_special_tokens="no")
