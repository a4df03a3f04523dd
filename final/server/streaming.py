"""A streamed response: one SSE frame per engine step of each choice, written as it comes, and how
an engine failure reads to a client (for the streamed and the whole responses alike).

Each yield of `stream_sse` is one write to the client's socket (event_stream.py): the frames in
hand at once go out together, their events unchanged (an SSE client reads events, not writes). A
step's frames are usually one; they are several for the first chunks, a step that finishes a tool
call, or when the API process ran late and delivered several steps at once (frontend/client.py):
then one write instead of one per frame, which is where a late process spends its time."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import Request

from ..engine.messages import ENGINE_DEAD
from .errors import APIError, bad_request, engine_dead, engine_failed, internal_error
from .formatting import SSE_DONE, sse, with_field
from .generation import ClientGone, Served, Started, generate_many
from .state import ServerState

log = logging.getLogger(__name__)


def engine_error(request: Served) -> APIError:
    """What a request the engine failed (or refused) tells its client. The engine's own words are
    for the log: they name processes, signals and exceptions."""
    message = request.error or "the engine failed"
    if request.error_code == "invalid_request":  # the engine's own check refused the input
        return bad_request(message)
    if request.error_code == "shutting_down":
        return APIError(503, message, type="server_error", code="shutting_down")
    if request.error_code == ENGINE_DEAD:  # logged once, where the loss was found
        return engine_dead()
    log.error("request %d failed in the engine: %s", request.rid, message)
    return engine_failed()


async def stream_sse(
    state: ServerState,
    started: list[Started],
    http: Request,
    chunk: Any,
    first_chunks: list[dict],
    final_usage: Any,
    timing: bool = False,
) -> AsyncIterator[str]:
    """SSE frames: first_chunks, one chunk per engine step (chunk(index, out): dicts, or JSON text
    from formatting.TextFrame), written as they come (those in hand together), then usage and
    [DONE]. `timing` (stream_options.include_timing) adds to each frame
    with tokens when they reached the engine's host, left the detokenizer and left this process, and
    the first such frame of a request when this process sent the request to the engine
    (time.monotonic(): one clock for every process of the machine, so a client on the same machine
    splits its latency into the engine's part and the frontend's, its first token's too)."""
    completion_tokens, cached = 0, 0
    held: list[str] = []  # frames in hand, written together once no more are
    try:
        if first_chunks:  # at once: the client sees its stream start before the first token
            yield "".join(sse(first) for first in first_chunks)
        failed = False
        async with aclosing(generate_many(state, started, http.is_disconnected)) as deltas:
            async for index, out, request, more in deltas:
                if out.finish_reason == "error":
                    held.append(sse(engine_error(request).body()))
                    failed = True
                    break
                completion_tokens += len(out.token_ids)
                cached = max(cached, request.cached_tokens)
                frames = chunk(index, out)
                if timing and frames and out.token_ids:
                    stamps = {
                        "engine": out.tokens_at,
                        "detokenized": out.detokenized_at,
                        "sent": time.monotonic(),
                        "decode_step": out.decode_step,
                    }
                    if request.num_tokens == len(out.token_ids):  # the request's first tokens
                        stamps["submitted"] = request.submitted
                    frames[0] = with_field(frames[0], "timing", stamps)
                held.extend(sse(frame) for frame in frames)
                if held and not more:
                    yield "".join(held)
                    held.clear()
        if final_usage is not None and not failed:
            held.append(sse(final_usage(completion_tokens, cached)))
        yield "".join(held) + SSE_DONE
    except ClientGone:
        return  # nobody to send to; generate() has aborted the requests
    except Exception as err:  # the headers are sent: end the stream with an error event
        yield "".join(held) + sse(internal_error(err, "while streaming").body()) + SSE_DONE
