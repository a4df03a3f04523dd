"""OpenAI response shapes: usage, logprobs in the chat and the completions formats, SSE frames."""

from __future__ import annotations

import json
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


def completion_logprobs(
    tokenizer: Tokenizer, token_ids: list[int], entries: list[dict[str, Any]], text_offset: int = 0
) -> dict[str, Any]:
    """The legacy format: parallel lists of tokens, their logprobs, top-n dicts and text offsets."""
    tokens, token_logprobs, top, offsets = [], [], [], []
    offset = text_offset
    for token_id, entry in zip(token_ids, entries, strict=False):
        text = tokenizer.token_text(token_id)
        tokens.append(text)
        token_logprobs.append(entry["token_logprob"])
        top.append(
            {
                tokenizer.token_text(i): lp
                for i, lp in zip(entry["top_ids"], entry["top_logprobs"], strict=True)
            }
        )
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets}


def sse(data: dict[str, Any] | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"


SSE_DONE = sse("[DONE]")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
