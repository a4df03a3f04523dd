"""The two generation endpoints: /v1/chat/completions and /v1/completions, streamed or not."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..core.errors import UserError
from ..core.sampling_params import SamplingParams
from ..frontend.request_state import OutputDelta, RequestState
from ..frontend.sampling_defaults import fit_default_max_tokens
from .errors import APIError, bad_request, model_not_found
from .formatting import SSE_DONE, SSE_HEADERS, chat_logprobs, completion_logprobs, sse, usage
from .generation import ClientGone, Job, admit, check_request, generate_many, sampling_for_choice
from .protocol import ChatCompletionRequest, CommonFields, CompletionRequest, parse
from .state import ServerState


async def read_json(request: Request) -> Any:
    body = await request.body()
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise bad_request(f"malformed JSON in the request body: {err}") from None


def check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model not in state.accepted_model_names:
        state.metrics.rejected["model_not_found"] += 1
        raise model_not_found(model, state.served_model_name)


def sampling_params(
    state: ServerState, req: CommonFields, max_tokens: int | None, logprobs: int | None
) -> SamplingParams:
    """The request's sampling parameters; those it leaves out (max_tokens None included) come from
    the server's defaults: its flags, the model's generation_config.json (frontend/sampling_defaults.py)."""

    def given(name: str) -> Any:
        return getattr(req, name) if name in req.model_fields_set else None

    try:
        return state.sampling_defaults.params(
            temperature=given("temperature"),
            top_k=given("top_k"),
            top_p=given("top_p"),
            min_p=given("min_p"),
            seed=req.seed,
            max_tokens=max_tokens,
            stop=req.stops(),
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
        )
    except UserError as err:
        raise bad_request(str(err)) from None


@dataclass
class Choice:
    """What a non-streamed response accumulates for one choice."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None


def _engine_error(request: RequestState) -> APIError:
    return APIError(500, request.error or "the engine failed", type="server_error", code="engine_error")


async def _collect(state: ServerState, jobs: list[Job], http: Request) -> tuple[list[Choice], int]:
    choices = [Choice() for _ in jobs]
    cached = 0
    async with aclosing(generate_many(state, jobs, http.is_disconnected)) as deltas:
        async for index, out, request in deltas:
            if out.finish_reason == "error":
                raise _engine_error(request)
            choice = choices[index]
            choice.text += out.text
            choice.token_ids += out.token_ids
            choice.logprobs += out.logprobs
            choice.finish_reason = out.finish_reason or choice.finish_reason
            cached = max(cached, request.output.cached_tokens)
    return choices, cached


async def _stream(
    state: ServerState, jobs: list[Job], http: Request, chunk: Any, first_chunks: list[dict], final_usage: Any
) -> AsyncIterator[str]:
    """SSE frames: first_chunks, one chunk per delta (chunk(index, out)), then usage and [DONE]."""
    completion_tokens, cached = 0, 0
    try:
        for first in first_chunks:
            yield sse(first)
        failed = False
        async with aclosing(generate_many(state, jobs, http.is_disconnected)) as deltas:
            async for index, out, request in deltas:
                if out.finish_reason == "error":
                    yield sse(_engine_error(request).body())
                    failed = True
                    break
                completion_tokens += len(out.token_ids)
                cached = max(cached, request.output.cached_tokens)
                for frame in chunk(index, out):
                    yield sse(frame)
        if final_usage is not None and not failed:
            yield sse(final_usage(completion_tokens, cached))
        yield SSE_DONE
    except ClientGone:
        return  # nobody to send to; generate() has aborted the requests


# ------------------------------------------------------------------------------------- chat


async def chat_completions(http: Request) -> Response:
    state: ServerState = http.app.state.server
    req = parse(ChatCompletionRequest, await read_json(http))
    check_model(state, req.model)
    messages = [{"role": m.template_role(), "content": m.text()} for m in req.messages]
    try:
        prompt_ids = state.tokenizer.encode_chat(messages)
    except UserError as err:
        raise bad_request(str(err), param="messages") from None
    params = sampling_params(state, req, req.requested_max_tokens(), req.num_logprobs())
    if req.requested_max_tokens() is None:  # the default cap shrinks to the room left, never fails
        info = state.info
        params = fit_default_max_tokens(
            params, prompt_ids, info.max_context, info.vocab_size, info.kv_capacity
        )
    check_request(state, prompt_ids, params)
    admit(state, req.n)
    jobs = [Job(i, prompt_ids, sampling_for_choice(params, i)) for i in range(req.n)]
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": state.served_model_name,
    }
    want_logprobs = req.logprobs

    if not req.stream:
        choices, cached = await _collect(state, jobs, http)
        return JSONResponse(
            {
                **head,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": chat_logprobs(state.tokenizer, c.token_ids, c.logprobs)
                        if want_logprobs
                        else None,
                        "finish_reason": c.finish_reason,
                    }
                    for i, c in enumerate(choices)
                ],
                "usage": usage(len(prompt_ids), sum(len(c.token_ids) for c in choices), cached),
            }
        )

    base = {**head, "object": "chat.completion.chunk"}
    if req.include_usage:
        base["usage"] = None  # OpenAI: every chunk but the last carries "usage": null

    def frame(index: int, delta: dict[str, Any], logprobs: Any = None, finish: str | None = None) -> dict:
        return {
            **base,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }

    def chunk(index: int, out: OutputDelta) -> list[dict]:
        frames = []
        if out.text or (want_logprobs and out.token_ids):
            lp = chat_logprobs(state.tokenizer, out.token_ids, out.logprobs) if want_logprobs else None
            frames.append(frame(index, {"content": out.text}, lp))
        if out.finish_reason:
            frames.append(frame(index, {}, finish=out.finish_reason))
        return frames

    def final_usage(completion_tokens: int, cached: int) -> dict | None:
        return {**base, "choices": [], "usage": usage(len(prompt_ids), completion_tokens, cached)}

    firsts = [frame(i, {"role": "assistant", "content": ""}) for i in range(req.n)]
    stream = _stream(state, jobs, http, chunk, firsts, final_usage if req.include_usage else None)
    return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)


# ------------------------------------------------------------------------------ completions


async def completions(http: Request) -> Response:
    state: ServerState = http.app.state.server
    req = parse(CompletionRequest, await read_json(http))
    check_model(state, req.model)
    params = sampling_params(state, req, req.max_tokens, req.logprobs)
    prompts: list[list[int]] = []
    for prompt in req.prompts():
        ids = state.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        check_request(state, ids, params)
        prompts.append(ids)
    admit(state, req.n * len(prompts))
    jobs = [
        Job(p * req.n + i, ids, sampling_for_choice(params, i))
        for p, ids in enumerate(prompts)
        for i in range(req.n)
    ]
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": state.served_model_name}
    prompt_tokens = sum(len(ids) for ids in prompts)
    want_logprobs = req.logprobs is not None

    if not req.stream:
        choices, cached = await _collect(state, jobs, http)
        return JSONResponse(
            {
                **head,
                "object": "text_completion",
                "choices": [
                    {
                        "index": i,
                        "text": c.text,
                        "logprobs": completion_logprobs(state.tokenizer, c.token_ids, c.logprobs)
                        if want_logprobs
                        else None,
                        "finish_reason": c.finish_reason,
                    }
                    for i, c in enumerate(choices)
                ],
                "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in choices), cached),
            }
        )

    base = {**head, "object": "text_completion"}
    if req.include_usage:
        base["usage"] = None
    offsets = [0] * len(jobs)  # text_offset of each choice's next token

    def chunk(index: int, out: OutputDelta) -> list[dict]:
        if not (out.text or out.finish_reason or (want_logprobs and out.token_ids)):
            return []
        lp = None
        if want_logprobs:
            lp = completion_logprobs(state.tokenizer, out.token_ids, out.logprobs, offsets[index])
            offsets[index] += sum(len(t) for t in lp["tokens"])
        choice = {"index": index, "text": out.text, "logprobs": lp, "finish_reason": out.finish_reason}
        return [{**base, "choices": [choice]}]

    def final_usage(completion_tokens: int, cached: int) -> dict | None:
        return {**base, "choices": [], "usage": usage(prompt_tokens, completion_tokens, cached)}

    stream = _stream(state, jobs, http, chunk, [], final_usage if req.include_usage else None)
    return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)
