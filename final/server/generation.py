"""From a validated request to text deltas: limits, admission, the engine round trip, metrics.

`check_request` (and admission.py) raise APIErrors before anything is sent to the engine, so a
bad request gets a 400 or 503 (never a hung stream). `submit` hands the checked jobs to the engine;
`generate` follows one of them: it yields its TokenUpdates (text included), each with whether
another is already in hand (a stream writes what is in hand in one send), and, however it ends
(finished, stop string, client gone, task cancelled), releases the request, aborting it in the
engine if it is still running there, so its KV pages come back; `abandon` does that for a job no
`generate` ever followed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

from ..core.errors import ContextLengthError, UserError
from ..core.limits import max_new_tokens
from ..core.sampling_params import SamplingParams
from ..frontend.mailbox import Mailbox, TokenUpdate
from .errors import bad_request
from .state import ServerState

log = logging.getLogger(__name__)

DISCONNECT_CHECK_S = 0.5  # how often a request checks that its client is still there


class ClientGone(Exception):
    """The client closed the connection: normal, one INFO line (generate's finally), no error."""


def check_request(state: ServerState, prompt_ids: list[int], params: SamplingParams) -> None:
    """Answer 400 now, before anything is sent, for a request the engine would refuse: the engine
    applies the same rule (core/limits.max_new_tokens) when it admits the request."""
    info = state.info
    try:
        max_new_tokens(prompt_ids, params.max_tokens, info.max_context, info.vocab_size, info.kv_capacity)
    except UserError as err:
        code = "context_length_exceeded" if isinstance(err, ContextLengthError) else None
        raise bad_request(str(err), code=code) from None


def sampling_for_choice(params: SamplingParams, index: int) -> SamplingParams:
    """Choice i of n: its own random stream (seed + i), so the n choices differ yet a seeded
    request is still reproducible (the offline API's rule: SamplingParams.for_choice)."""
    return params.for_choice(index)


@dataclasses.dataclass
class Served:
    """One request as the API process follows it: what its updates have said so far (the text
    is the detokenizer process's: frontend/detokenizer_process.py)."""

    rid: int
    arrival: float  # time.perf_counter() at submission
    # time.monotonic() once the request is on its way to the engine (tokenized, sent): the first
    # frame's timing carries it, so a client splits its first token's wait at the engine's door.
    submitted: float = 0.0
    finish_reason: str | None = None
    num_tokens: int = 0
    cached_tokens: int = 0
    error: str | None = None
    error_code: str | None = None  # see engine/messages.py's RequestDelta.error_code

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def apply(self, update: TokenUpdate) -> None:
        self.num_tokens += len(update.token_ids)
        self.cached_tokens = update.cached_tokens
        self.finish_reason = update.finish_reason
        if update.error is not None:
            self.error, self.error_code = update.error, update.error_code


async def generate(
    state: ServerState, started: Started, is_disconnected: Callable[[], Awaitable[bool]]
) -> AsyncIterator[tuple[TokenUpdate, Served, bool]]:
    """The request's updates, one per engine step that gave it tokens (never two steps merged:
    each becomes its own frame), as they come, each with `more`: whether the next one is already
    here (the API process delivered several steps at once because it ran late), so that a stream
    can write them in one send."""
    client, metrics = state.client, state.metrics
    mailbox, request = started.mailbox, started.request
    rid = request.rid
    last_token_at: float | None = None
    last_check = time.monotonic()
    try:
        while not request.finished:
            updates = await mailbox.get()  # woken by the step's update, or every NUDGE_S
            if time.monotonic() - last_check >= DISCONNECT_CHECK_S:
                last_check = time.monotonic()
                if await is_disconnected():
                    raise ClientGone
            for i, update in enumerate(updates):
                request.apply(update)
                if update.token_ids:
                    now = time.perf_counter()
                    if last_token_at is None:
                        metrics.ttft.observe(now - request.arrival)
                    else:
                        metrics.itl.observe(now - last_token_at)
                    metrics.itl.observe_many(0.0, len(update.token_ids) - 1)  # tokens of one step
                    last_token_at = now
                    metrics.generation_tokens += len(update.token_ids)
                    if update.tokens_at:
                        metrics.frontend.observe(time.monotonic() - update.tokens_at)
                yield update, request, i + 1 < len(updates) and not request.finished
                if request.finished:
                    break
    finally:
        # Still running in the engine: the client went away, the task was cancelled, or the
        # server is shutting down. Abort it there so its pages return to the pool. (A stop string
        # is the detokenizer process's to abort: it tells the engine itself.)
        started.followed = True
        engine_still_has_it = not request.finished or request.error_code == "shutting_down"
        client.release(rid, abort=engine_still_has_it)
        if request.finished:
            metrics.finished[request.finish_reason or "unknown"] += 1
            metrics.prompt_tokens += len(started.job.prompt_ids)
            metrics.e2e.observe(time.perf_counter() - request.arrival)
        else:
            metrics.finished["abort"] += 1
            # A client that goes away is normal: one INFO line. A stream learns it as ClientGone
            # (our poll) or as a cancellation (Starlette's own disconnect watch), whichever is first.
            log.info("request %d: the client went away; aborted after %d tokens", rid, request.num_tokens)


@dataclasses.dataclass
class Job:
    """One choice to generate: its index in the response, its prompt and its sampling params."""

    index: int
    prompt_ids: list[int]
    params: SamplingParams


@dataclasses.dataclass
class Started:
    """A job handed to the engine, its updates gathering in `mailbox` until `generate` follows it.

    A stream submits its jobs as soon as they are checked, before its response starts: sending
    the headers and starting the response's task took the API process a millisecond or more per
    request on a loaded event loop (a 2-core CPU: 1.2 ms of a 4.3 ms way in, 2026-11-27), and the
    engine can prefill in that time. `followed` is set once `generate` has run and released it;
    `abandon` releases those it never reached (the client left before the first byte)."""

    job: Job
    mailbox: Mailbox
    request: Served  # its rid is the engine's
    followed: bool = False


def submit(state: ServerState, jobs: list[Job]) -> list[Started]:
    """Send every job to the engine now (checked already: check_request)."""
    started = []
    for job in jobs:
        rid, mailbox = state.client.submit(job.prompt_ids, job.params)
        request = Served(rid, time.perf_counter(), submitted=time.monotonic())
        started.append(Started(job, mailbox, request))
    return started


def abandon(state: ServerState, started: list[Started]) -> None:
    """Abort in the engine every started job that `generate` never followed. Idempotent."""
    for job in started:
        if not job.followed:
            job.followed = True
            state.client.release(job.request.rid, abort=True)
            state.metrics.finished["abort"] += 1


async def generate_many(
    state: ServerState, started: list[Started], is_disconnected: Callable[[], Awaitable[bool]]
) -> AsyncIterator[tuple[int, TokenUpdate, Served, bool]]:
    """Every started job followed concurrently, their deltas interleaved as they come: (index,
    delta, state, more), `more` when another delta of any job is already here. However it ends,
    no job stays in the engine unfollowed."""
    try:
        if len(started) == 1:
            one = started[0]
            async for out, request, more in generate(state, one, is_disconnected):
                yield one.job.index, out, request, more
            return
        async for item in _interleaved(state, started, is_disconnected):
            yield item
    finally:
        abandon(state, started)  # a job whose pump was cancelled before it began


async def _interleaved(
    state: ServerState, started: list[Started], is_disconnected: Callable[[], Awaitable[bool]]
) -> AsyncIterator[tuple[int, TokenUpdate, Served, bool]]:
    Item = tuple[int, TokenUpdate, Served, bool]
    merged: asyncio.Queue[Item | Exception | None] = asyncio.Queue()

    async def pump(one: Started) -> None:
        try:
            async for out, request, more in generate(state, one, is_disconnected):
                await merged.put((one.job.index, out, request, more))
        except Exception as err:  # handed to the consumer, which re-raises it
            await merged.put(err)
            return
        await merged.put(None)

    tasks = [asyncio.create_task(pump(one)) for one in started]
    try:
        done = 0
        here: deque[Item | Exception | None] = deque()  # taken off the queue, not yet handled
        while done < len(started):
            if not here:
                here.append(await merged.get())
            while not merged.empty():
                here.append(merged.get_nowait())
            item = here.popleft()
            if item is None:  # a job's end
                done += 1
            elif isinstance(item, Exception):
                raise item
            else:  # more: another delta is here (a job's end is not one)
                index, out, request, more = item
                yield index, out, request, more or any(isinstance(x, tuple) for x in here)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
