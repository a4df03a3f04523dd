"""From a validated request to prompt token ids, without blocking the event loop.

Text longer than the context could ever hold (`ServerState.max_prompt_chars`) is refused before
any of it is tokenized; the rest is tokenized in a worker thread, so a large prompt delays only
its own request, never /health or the streams already running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from ..core.errors import UserError
from .errors import APIError, bad_request
from .protocol import ChatCompletionRequest, CompletionRequest
from .state import ServerState

T = TypeVar("T")


def check_text_length(state: ServerState, chars: int, param: str) -> None:
    limit = state.max_prompt_chars
    if chars > limit:
        raise APIError(
            400,
            f"the prompt has {chars} characters, more than the model's context of "
            f"{state.info.max_context} tokens can hold (a token of this tokenizer covers at most "
            f"{state.tokenizer.max_token_chars} characters, so at most {limit})",
            param=param,
            code="context_length_exceeded",
        )


async def tokenize_off_loop(work: Callable[[], T], param: str) -> T:
    """`work` (tokenizing) in a worker thread; what the input's fault is becomes a 400 naming `param`."""
    try:
        return await asyncio.to_thread(work)
    except UserError as err:
        raise bad_request(str(err), param=param) from None
    except (TypeError, ValueError) as err:  # text the tokenizer cannot take: the input's fault
        raise bad_request(f"cannot tokenize the {param}: {err}", param=param) from None


async def chat_prompt(state: ServerState, req: ChatCompletionRequest) -> list[int]:
    def work() -> list[int]:  # the messages are built in the thread too: there may be 2048 of them
        messages = [m.for_template() for m in req.messages]
        check_text_length(state, sum(len(m["content"]) for m in messages), "messages")
        return state.tokenizer.encode_chat(messages, req.template_tools(), req.chat_template_kwargs)

    return await tokenize_off_loop(work, "messages")


async def completion_prompts(state: ServerState, req: CompletionRequest) -> list[list[int]]:
    def work() -> list[list[int]]:
        prompts = req.prompts()
        for text in prompts:
            if isinstance(text, str):
                check_text_length(state, len(text), "prompt")
        return [state.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]

    return await tokenize_off_loop(work, "prompt")
