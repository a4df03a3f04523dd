"""--reasoning-parser (final/server/reasoning.py): a <think> block into reasoning_content, whole and
streamed at every split, in both styles; and a live server whose chat answers carry it."""

from __future__ import annotations

import pytest

from final.frontend.tokenizer import Tokenizer
from final.server import reasoning
from tests.fixtures.live_server import serving

TEXTS = [
    "<think>\nLet me see.\n</think>\n\nParis.",
    "  <think>a</think>b",
    "<think>still thinking, cut by max_tokens",
    "No block at all.",
    "reasoning the prompt opened\n</think>\n\nthe answer",
    "<think></think>",
    "<thi",
    "  \n ",
    "a < b </thin but not closed",
]


@pytest.mark.parametrize(
    ("style", "text", "want"),
    [
        ("qwen3", "<think>\nLet me see.\n</think>\n\nParis.", ("Let me see.", "Paris.")),
        ("qwen3", "No block at all.", (None, "No block at all.")),
        ("qwen3", "<think>cut", ("cut", "")),
        ("deepseek_r1", "the prompt opened it\n</think>\n\nParis.", ("the prompt opened it", "Paris.")),
        ("deepseek_r1", "<think>written anyway</think>Paris.", ("written anyway", "Paris.")),
        ("deepseek_r1", "still thinking", ("still thinking", "")),
    ],
)
def test_a_whole_answer_splits_into_reasoning_and_content(style, text, want):
    assert reasoning.split(text, style) == want


@pytest.mark.parametrize("style", ["qwen3", "deepseek_r1"])
@pytest.mark.parametrize("text", TEXTS)
def test_a_streamed_answer_split_anywhere_adds_up_to_the_whole_split(style, text):
    want_reasoning, want_content = reasoning.split(text, style)
    for cut in range(len(text) + 1):
        for pieces in ([text[:cut], text[cut:]], [text[:cut], *text[cut:]]):
            stream = reasoning.ReasoningStream(style)
            got = ["", ""]
            for piece in [*pieces, None]:
                more = stream.finish() if piece is None else stream.feed(piece)
                got = [got[0] + more[0], got[1] + more[1]]
            assert got == [want_reasoning or "", want_content], (cut, pieces)


def test_nothing_that_may_close_the_block_is_sent_as_reasoning_too_early():
    stream = reasoning.ReasoningStream("qwen3")
    assert stream.feed("<thi") == ("", "")  # may open a block: undecided
    assert stream.feed("nk>Hmm </th") == ("Hmm", "")
    assert stream.feed("ink> Yes") == ("", "Yes")


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    # deepseek-r1: SGLang's spelling of the style
    yield from serving(tiny_qwen3_dir, tmp_path_factory.mktemp("reasoning"), "--served-model-name", "tiny",
                       "--reasoning-parser", "deepseek-r1", "--log-level", "warning")  # fmt: skip


def test_the_server_sends_the_reasoning_apart_streamed_or_not(server, tiny_qwen3_dir):
    """deepseek_r1: the prompt opened the block, so an answer that never closes it (a random tiny
    model's) is reasoning only: reasoning_content is the text the same prompt completes to."""
    client = server.client()
    messages = [{"role": "user", "content": "Why is the sky blue?"}]
    greedy = {"model": "tiny", "max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
    prompt = Tokenizer(tiny_qwen3_dir).encode_chat(messages)
    text = client.completions.create(prompt=prompt, **greedy).choices[0].text
    out = client.chat.completions.create(messages=messages, **greedy).choices[0]
    assert out.message.reasoning_content == text.strip() and out.message.content == ""
    thought = content = ""
    for chunk in client.chat.completions.create(messages=messages, stream=True, **greedy):
        delta = chunk.choices[0].delta
        thought += getattr(delta, "reasoning_content", None) or ""
        content += delta.content or ""
    assert (thought, content) == (text.strip(), "")
    # A grammar writes this one: no block to look for, the JSON is the content.
    constrained = client.chat.completions.create(messages=messages, response_format={"type": "json_object"},
                                                 **{**greedy, "extra_body": {}})  # fmt: skip
    assert constrained.choices[0].message.content.lstrip().startswith("{")
    assert getattr(constrained.choices[0].message, "reasoning_content", None) is None
