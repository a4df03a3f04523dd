"""From the bytes of a POST to a validated request, without holding up the event loop.

A body of 4 MB can hold 120,000 chat messages or 1.3 million token ids. Validating every one of
them (pydantic), then building and templating the conversation, took seconds on the event loop,
and every stream waited (issue 29, item 5). So:

- the sizes are counted first, on the decoded JSON, before any element is validated: a list longer
  than its field allows is a 400 at once (pydantic's own max_length counts only after validating
  every item). Token ids are bounded by the context (a longer prompt can never fit), prompts by
  the sequences one request may hold, messages and their content parts by MAX_MESSAGES;
- a body larger than body.THREAD_ABOVE_BYTES is decoded, counted and validated in a worker
  thread; what remains on the event loop is bounded by the counts above.

The JSON decoder and pydantic hold the GIL while they run, so a thread alone would not help; the
counts are what bound the time. Decoding stays bounded by --max-request-bytes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import Request

from .body import THREAD_ABOVE_BYTES, check_content_type, decode_json, read_body
from .chat_messages import MAX_MESSAGES, MAX_TOOLS
from .errors import APIError, bad_request, never_fits
from .protocol import MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, MAX_TEMPLATE_KWARGS
from .state import ServerState
from .validation import parse

# The most items of any list or object of a body (the prompt aside, see check_prompt_sizes), and
# the fields whose own limit is lower, counted before validation too.
MAX_ITEMS = MAX_MESSAGES
LIST_LIMITS = {
    "stop": MAX_STOP_STRINGS,
    "stop_token_ids": MAX_STOP_TOKEN_IDS,
    "tools": MAX_TOOLS,
    "chat_template_kwargs": MAX_TEMPLATE_KWARGS,
}


async def read_request(http: Request, state: ServerState, model: type) -> Any:
    """The body as a validated `model`, or an APIError (415, 413, 408, 400)."""
    check_content_type(http)
    raw = await read_body(http, state.max_request_bytes, state.read_timeout)

    def work() -> Any:
        body = decode_json(raw)
        check_sizes(body, state.info.max_context, state.admission.per_request)
        return parse(model, body)

    if len(raw) > THREAD_ABOVE_BYTES:
        return await asyncio.to_thread(work)
    return work()


def check_sizes(body: Any, max_context: int, max_sequences: int) -> None:
    """A 400 for a list longer than its field allows, counted without looking at its items."""
    if not isinstance(body, dict):
        return  # parse() says what is wrong
    for name, value in body.items():
        # /detokenize's ids: no more than a context holds (what an answer or a prompt can be)
        limit = max_context if name == "tokens" else LIST_LIMITS.get(name, MAX_ITEMS)
        if name != "prompt" and isinstance(value, (list, dict)) and len(value) > limit:
            raise bad_request(f"{name}: at most {limit} items, got {len(value)}", param=name)
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = sum(
            len(m["content"]) for m in messages if isinstance(m, dict) and isinstance(m.get("content"), list)
        )
        if parts > MAX_MESSAGES:
            raise bad_request(
                f"messages: at most {MAX_MESSAGES} content parts in all, got {parts}", param="messages"
            )
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        check_prompt_sizes(prompt, max_context, max_sequences)


def check_prompt_sizes(prompt: list[Any], max_context: int, max_sequences: int) -> None:
    """A prompt is a list of token ids, of texts, or of lists of token ids (protocol.py)."""
    if prompt and isinstance(prompt[0], int):
        prompts = [prompt]
    else:
        if len(prompt) > max_sequences:  # each prompt is at least one sequence
            raise never_fits(len(prompt), max_sequences)
        prompts = [p for p in prompt if isinstance(p, list)]
    for ids in prompts:
        if len(ids) >= max_context:
            raise APIError(
                400,
                f"a prompt has {len(ids)} token ids but the model's context holds {max_context} (prompt and "
                f"answer together), so at most {max_context - 1}",
                param="prompt",
                code="context_length_exceeded",
            )
