"""/tokenize and /detokenize, as vLLM serves them: a prompt or a conversation to the token ids the
model would see (a client counts its tokens, or checks its chat template), and token ids back to
text. Nothing reaches the engine; tokenizing runs off the event loop (prompts.py)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import Field, model_validator

from .chat_messages import MAX_MESSAGES, MAX_TOOLS, ChatMessage, Tool
from .errors import bad_request
from .openai_api import check_model
from .prompts import tokenize_off_loop
from .protocol import MAX_TEMPLATE_KWARGS, TokenId
from .request_body import read_request
from .state import ServerState
from .strict_model import StrictModel, only


class TokenizeRequest(StrictModel):
    """A prompt (`prompt`) or a conversation (`messages`, rendered as /v1/chat/completions does)."""

    model: str | None = None
    prompt: str | None = Field(None, description="a text, tokenized as /v1/completions does")
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = None
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, json_schema_extra={"maxProperties": MAX_TEMPLATE_KWARGS}
    )
    add_generation_prompt: bool = only(True)
    add_special_tokens: bool | None = Field(
        None, description="default: true for a prompt; for messages false (the template writes them)"
    )
    return_token_strs: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give prompt or messages, one of them")
        if self.prompt is not None and (self.tools or self.chat_template_kwargs):
            raise ValueError("tools and chat_template_kwargs go with messages")
        if not self.add_generation_prompt:
            raise ValueError("add_generation_prompt is only true here: the prompt /v1/chat/completions sends")
        return self


class DetokenizeRequest(StrictModel):
    model: str | None = None
    tokens: list[TokenId] = Field(description="token ids below the vocabulary size")


async def tokenize(http: Request) -> JSONResponse:
    state: ServerState = http.app.state.server
    req = await read_request(http, state, TokenizeRequest)
    check_model(state, req.model)
    tokenizer = state.tokenizer

    def work() -> list[int]:
        if req.messages is None:
            assert req.prompt is not None
            special = True if req.add_special_tokens is None else req.add_special_tokens
            return tokenizer.encode(req.prompt, add_special_tokens=special)
        messages = [m.for_template() for m in req.messages]
        tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
        text = tokenizer.render_chat(messages, tools=tools, template_kwargs=req.chat_template_kwargs)
        return tokenizer.encode(text, add_special_tokens=bool(req.add_special_tokens))

    ids = await tokenize_off_loop(work, "messages" if req.messages is not None else "prompt")
    body: dict[str, Any] = {"count": len(ids), "max_model_len": state.info.max_context, "tokens": ids}
    body["token_strs"] = [tokenizer.token_text(i) for i in ids] if req.return_token_strs else None
    return JSONResponse(body)


async def detokenize(http: Request) -> JSONResponse:
    state: ServerState = http.app.state.server
    req = await read_request(http, state, DetokenizeRequest)
    check_model(state, req.model)
    vocab = state.info.vocab_size
    if any(i >= vocab for i in req.tokens):
        raise bad_request(f"token ids must be in [0, {vocab})", param="tokens")
    text = await tokenize_off_loop(lambda: state.tokenizer.decode_with_special_tokens(req.tokens), "tokens")
    return JSONResponse({"prompt": text})
