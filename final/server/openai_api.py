"""The two generation endpoints: /v1/chat/completions and /v1/completions, streamed or not.

A handler validates the body (protocol.py), takes its places in flight (admission.py: 503 when
full, 400 when it could never fit), tokenizes off the event loop (prompts.py), and only then talks
to the engine. Its places are given back however the response ends: returned, failed, streamed to
the end, or cut off by the client.
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..core.errors import UserError
from ..core.sampling_params import SamplingParams
from ..frontend.mailbox import TokenUpdate
from ..frontend.sampling_defaults import fit_default_max_tokens
from .admission import Ticket
from .chat_answer import ChatFrames, answer
from .errors import bad_request, engine_dead, model_not_found
from .event_stream import EventStream
from .formatting import TextFrame, TextOffsets, chat_logprobs, completion_logprobs, usage
from .generation import Job, abandon, check_request, generate_many, sampling_for_choice, submit
from .prompts import chat_prompt, completion_prompts
from .protocol import ChatCompletionRequest, CommonFields, CompletionRequest, structured_outputs
from .request_body import read_request
from .state import ServerState
from .streaming import engine_error, stream_sse

log = logging.getLogger(__name__)


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
            skip_special_tokens=req.skip_special_tokens,
            logprobs=logprobs,
            presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty,
            repetition_penalty=req.repetition_penalty,
            structured_outputs=structured_outputs(req),
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


async def _collect(state: ServerState, jobs: list[Job], http: Request) -> tuple[list[Choice], int]:
    choices = [Choice() for _ in jobs]
    cached = 0
    async with aclosing(generate_many(state, submit(state, jobs), http.is_disconnected)) as deltas:
        async for index, out, request, _ in deltas:
            if out.finish_reason == "error":
                raise engine_error(request)
            choice = choices[index]
            choice.text += out.text
            choice.token_ids += out.token_ids
            choice.logprobs += out.logprobs or []
            choice.finish_reason = out.finish_reason or choice.finish_reason
            cached = max(cached, request.cached_tokens)
    return choices, cached


# ------------------------------------------------------------------------------------- chat


async def _serve(
    http: Request, model: type[ChatCompletionRequest | CompletionRequest], respond: Any
) -> Response:
    """Parse, check the model, take the request's places, respond; give the places back unless a
    stream now owns them."""
    state: ServerState = http.app.state.server
    if state.client.dead:
        raise engine_dead()
    req = await read_request(http, state, model)
    check_model(state, req.model)
    ticket = state.admission.reserve(req.num_sequences())
    handed_over = False
    try:
        response = await respond(state, req, http, ticket)
        handed_over = isinstance(response, EventStream)
        return response
    finally:
        if not handed_over:
            ticket.release()


async def chat_completions(http: Request) -> Response:
    return await _serve(http, ChatCompletionRequest, _chat)


async def completions(http: Request) -> Response:
    return await _serve(http, CompletionRequest, _completion)


async def _chat(state: ServerState, req: ChatCompletionRequest, http: Request, ticket: Ticket) -> Response:
    req.check_tools()
    params = sampling_params(state, req, req.requested_max_tokens(), req.num_logprobs())
    prompt_ids = await chat_prompt(state, req)
    if req.requested_max_tokens() is None:  # the default cap shrinks to the room left, never fails
        info = state.info
        params = fit_default_max_tokens(
            params, prompt_ids, info.max_context, info.vocab_size, info.kv_capacity
        )
    check_request(state, prompt_ids, params)
    jobs = [Job(i, prompt_ids, sampling_for_choice(params, i)) for i in range(req.n)]
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "created": int(time.time()),
        "model": state.served_model_name,
    }
    want_logprobs = req.logprobs

    if not req.stream:
        choices, cached = await _collect(state, jobs, http)
        answers = [
            answer(req, c.text, c.finish_reason, state.reasoning_parser, state.tool_call_parser)
            for c in choices
        ]
        return JSONResponse(
            {
                **head,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": i,
                        "message": message,
                        "logprobs": chat_logprobs(state.tokenizer, c.token_ids, c.logprobs)
                        if want_logprobs
                        else None,
                        "finish_reason": finish_reason,
                    }
                    for i, (c, (message, finish_reason)) in enumerate(zip(choices, answers, strict=True))
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

    # The common chunk, text alone, serialized once per choice (formatting.TextFrame).
    texts = [TextFrame(lambda text, i=i: frame(i, {"content": text})) for i in range(req.n)]
    parts = ChatFrames(req, frame, state.reasoning_parser, state.tool_call_parser)

    def chunk(index: int, out: TokenUpdate) -> list[dict | str]:
        if parts.active:
            return parts.chunk(index, out, state.tokenizer if want_logprobs else None)
        if out.text and not want_logprobs and not out.finish_reason:
            return [texts[index].json(out.text)]
        frames: list[dict | str] = []
        if out.text or (want_logprobs and out.token_ids):
            lp = chat_logprobs(state.tokenizer, out.token_ids, out.logprobs or []) if want_logprobs else None
            frames.append(frame(index, {"content": out.text}, lp))
        if out.finish_reason:
            frames.append(frame(index, {}, finish=out.finish_reason))
        return frames

    def final_usage(completion_tokens: int, cached: int) -> dict | None:
        return {**base, "choices": [], "usage": usage(len(prompt_ids), completion_tokens, cached)}

    firsts = [frame(i, {"role": "assistant", "content": ""}) for i in range(req.n)]
    return _event_stream(state, jobs, http, ticket, chunk, firsts, final_usage if req.include_usage else None,
                         req.include_timing)  # fmt: skip


# ------------------------------------------------------------------------------ completions


async def _completion(state: ServerState, req: CompletionRequest, http: Request, ticket: Ticket) -> Response:
    params = sampling_params(state, req, req.max_tokens, req.logprobs)
    prompts = await completion_prompts(state, req)
    for ids in prompts:
        check_request(state, ids, params)
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
                        "logprobs": completion_logprobs(
                            state.tokenizer,
                            c.token_ids,
                            c.logprobs,
                            TextOffsets(state.tokenizer, job.prompt_ids),
                        )
                        if want_logprobs
                        else None,
                        "finish_reason": c.finish_reason,
                    }
                    for i, (c, job) in enumerate(zip(choices, jobs, strict=True))
                ],
                "usage": usage(prompt_tokens, sum(len(c.token_ids) for c in choices), cached),
            }
        )

    base = {**head, "object": "text_completion"}
    if req.include_usage:
        base["usage"] = None
    offsets = [TextOffsets(state.tokenizer, job.prompt_ids) for job in jobs]  # of each choice's next token

    def text_choice(index: int, text: str) -> dict:
        return {**base, "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": None}]}

    # The common chunk, text alone, serialized once per choice (formatting.TextFrame).
    texts = [TextFrame(lambda text, i=i: text_choice(i, text)) for i in range(len(jobs))]

    def chunk(index: int, out: TokenUpdate) -> list[dict | str]:
        if out.text and not want_logprobs and not out.finish_reason:
            return [texts[index].json(out.text)]
        if not (out.text or out.finish_reason or (want_logprobs and out.token_ids)):
            return []
        lp = None
        if want_logprobs:
            lp = completion_logprobs(state.tokenizer, out.token_ids, out.logprobs or [], offsets[index])
        choice = {"index": index, "text": out.text, "logprobs": lp, "finish_reason": out.finish_reason}
        return [{**base, "choices": [choice]}]

    def final_usage(completion_tokens: int, cached: int) -> dict | None:
        return {**base, "choices": [], "usage": usage(prompt_tokens, completion_tokens, cached)}

    return _event_stream(state, jobs, http, ticket, chunk, [], final_usage if req.include_usage else None,
                         req.include_timing)  # fmt: skip


def _event_stream(
    state: ServerState,
    jobs: list[Job],
    http: Request,
    ticket: Ticket,
    chunk: Any,
    first_chunks: list[dict],
    final_usage: Any,
    timing: bool,
) -> EventStream:
    """The jobs handed to the engine now, then their stream: the engine starts on the prompt while
    the response's headers go out (generation.Started says why), and a response that never
    starts aborts them."""
    started = submit(state, jobs)
    stream = stream_sse(state, started, http, chunk, first_chunks, final_usage, timing)
    return EventStream(ticket, stream, on_close=lambda: abandon(state, started))
