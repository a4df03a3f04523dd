"""OpenAI response shapes: usage, logprobs in the chat and the completions formats, SSE frames
(`sse` takes a chunk as a dict, or as JSON text: TextFrame's)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..frontend.tokenizer import Tokenizer


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _token(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    text = tokenizer.token_text(token_id)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(
    tokenizer: Tokenizer, token_ids: list[int], entries: list[dict[str, Any]]
) -> dict[str, Any]:
    """{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}"""
    content = []
    for token_id, entry in zip(token_ids, entries, strict=False):
        item = _token(tokenizer, token_id, entry["token_logprob"])
        item["top_logprobs"] = [
            _token(tokenizer, i, lp) for i, lp in zip(entry["top_ids"], entry["top_logprobs"], strict=True)
        ]
        content.append(item)
    return {"content": content}


class TextOffsets:
    """Where each token of an answer starts in its text (the legacy `text_offset`).

    A token moves the offset by what it adds to the decoded text, with the tokens before it as
    context: nothing for a special token (in `tokens`, never in the text), one character for the
    bytes of a multi-byte character together. Summing the tokens' own lengths (what it was) put
    every offset after `<|endoftext|>` 13 characters too far."""

    CONTEXT = 6  # tokens decoded before the new one: a character spans at most 4 bytes

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int]):
        self.tokenizer = tokenizer
        self.window: list[int] = list(prompt_ids[-self.CONTEXT :])
        self.length = 0  # characters of the answer so far

    def take(self, token_id: int) -> int:
        """The offset of this token, the answer's next one."""
        offset = self.length
        before = self.tokenizer.decode(self.window) if self.window else ""
        after = self.tokenizer.decode([*self.window, token_id])
        self.length += max(0, len(after) - len(before))
        self.window = [*self.window, token_id][-self.CONTEXT :]
        return offset


def completion_logprobs(
    tokenizer: Tokenizer, token_ids: list[int], entries: list[dict[str, Any]], offsets: TextOffsets
) -> dict[str, Any]:
    """The legacy format: parallel lists of tokens, their logprobs, top-n dicts and text offsets."""
    tokens, token_logprobs, top, text_offset = [], [], [], []
    for token_id, entry in zip(token_ids, entries, strict=False):
        tokens.append(tokenizer.token_text(token_id))
        token_logprobs.append(entry["token_logprob"])
        top.append(
            {
                tokenizer.token_text(i): lp
                for i, lp in zip(entry["top_ids"], entry["top_logprobs"], strict=True)
            }
        )
        text_offset.append(offsets.take(token_id))
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": top,
        "text_offset": text_offset,
    }


class TextFrame:
    """One chunk shape serialized once, with a hole for its text: `json(text)` is what json.dumps
    gives for the chunk with that text, at a fifth of its cost. Streaming writes a chunk per token
    of every request, and at saturation serializing whole dicts was a share of the API process's
    time worth taking back. `make(placeholder)` builds the chunk; the text goes where it is."""

    PLACEHOLDER = "\x00text\x00"  # a control character is always escaped: it cannot collide

    def __init__(self, make: Any):
        dumped = json.dumps(make(self.PLACEHOLDER), ensure_ascii=False)
        self.head, self.tail = dumped.split(json.dumps(self.PLACEHOLDER, ensure_ascii=False))

    def json(self, text: str) -> str:
        return self.head + json.dumps(text, ensure_ascii=False) + self.tail


def with_field(frame: dict[str, Any] | str, key: str, value: Any) -> dict[str, Any] | str:
    """The chunk (a dict, or a JSON object's text) with one more key, last."""
    if isinstance(frame, dict):
        return {**frame, key: value}
    return f"{frame[:-1]}, {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}}}"


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


SSE_DONE = sse("[DONE]")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
