"""Clients of the engine: an asyncio one for the server, a blocking one for the shell.

The server's client talks to the detokenizer process (detokenizer_process.py), which stands between
it and the engine: it PUSHes AddRequest / AbortRequest / StatsQuery there and PULLs each step's
text (engine/wire.py) and EngineStats back. Its receiving task hands each request its share of a
step in one `TokenUpdate` through its `Mailbox` (mailbox.py): one wake-up per request per step
while the process keeps up. When it runs late (a step's tokens older than `catch_up_s`, the
server's --stream-catch-up-ms), it delivers the steps already waiting, up to CATCH_UP_STEPS, before
the requests run: one wake-up and one write per stream for all of them (server/streaming.py), so
the lag shrinks instead of growing, and those streams' frames arrive in bunches.
The shell's client talks to the engine process directly (one request: it detokenizes itself).
Sends never wait on the other side (a PUSH queues the message), so an abort from a cancelled task
always goes out.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import time
from collections.abc import Callable, Iterator

import zmq
import zmq.asyncio

from ..core.sampling_params import SamplingParams
from ..engine.messages import (
    ENGINE_DEAD,
    AbortRequest,
    AddRequest,
    EngineStats,
    RequestDelta,
    StatsQuery,
)
from ..engine.wire import FINISH_REASONS, StepColumns, decode
from ..runtime.process import EngineProcess
from .detokenizer_process import DetokenizerProcess
from .mailbox import Mailbox, TokenUpdate
from .options import DEFAULT_CATCH_UP_MS

log = logging.getLogger(__name__)

ENGINE_GONE = "the engine process stopped"
NUDGE_S = 0.5  # how often a waiting request is woken to check that its client is still there


# Off by default (--stream-catch-up-ms 0): past saturation the lag then grows with the load, but
# every stream's frames stay a step apart (issue 27). 50 ms, the value measured: several engine
# steps of a loaded server (5-10 ms each on an H200), far above the few ms a token spends in the
# detokenizer and this process while they keep up (docs/serving/index.md has both readings).
def catch_up_seconds(ms: int) -> float | None:
    """--stream-catch-up-ms as the client takes it: seconds, or None for 0 (never)."""
    return ms / 1000 if ms else None


BEHIND_S = catch_up_seconds(DEFAULT_CATCH_UP_MS)
CATCH_UP_STEPS = 16  # steps delivered at most before the requests run: a turn stays short


class AsyncEngineClient:
    def __init__(
        self, engine: EngineProcess, detokenizer: DetokenizerProcess, catch_up_s: float | None = BEHIND_S
    ):
        """`catch_up_s`: how old a step's tokens are when this process counts as behind (module
        docstring); None: never, every step is delivered on a turn of its own."""
        self.engine, self.detokenizer = engine, detokenizer
        self.catch_up_s = catch_up_s
        self.rids = itertools.count()
        self.query_ids = itertools.count(1)
        self.mailboxes: dict[int, Mailbox] = {}
        self.stats_waiters: dict[int, asyncio.Future[EngineStats]] = {}
        self.last_stats = EngineStats(num_pages=engine.info.num_pages, free_pages=engine.info.num_pages)
        # Sends go through a plain socket: they never block, so they are safe in a `finally` of a
        # cancelled task; only the receiving side needs the event loop.
        self.sender = zmq.Context.instance().socket(zmq.PUSH)
        # No high-water mark (admission bounds what is in flight) and no blocking send: a stalled
        # engine must never stall the event loop, nor a shutdown.
        self.sender.setsockopt(zmq.SNDHWM, 0)
        self.sender.setsockopt(zmq.LINGER, 0)
        self.sender.connect(detokenizer.request_addr)
        self.async_ctx = zmq.asyncio.Context()
        self.receiver = self.async_ctx.socket(zmq.PULL)
        self.receiver.connect(detokenizer.output_addr)
        self.tasks: list[asyncio.Task[None]] = []
        self.dead = False
        self.closed = False
        # Called once when the engine is lost (engine_lost): the server stops then (server/launch.py).
        self.on_lost: Callable[[], None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._receive_loop()), loop.create_task(self._nudge_loop())]

    @property
    def num_in_flight(self) -> int:
        return len(self.mailboxes)

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> tuple[int, Mailbox]:
        rid = next(self.rids)
        mailbox = self.mailboxes[rid] = Mailbox()
        if self.dead or not self._send(AddRequest(rid, prompt_ids, params)):
            mailbox.put(_failure(ENGINE_GONE, ENGINE_DEAD))
        return rid, mailbox

    def _send(self, msg: object) -> bool:
        try:
            self.sender.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL), zmq.NOBLOCK)
        except zmq.ZMQError as err:  # Again (cannot happen without a high-water mark) or closed
            log.error("cannot send %s to the engine: %s", type(msg).__name__, err)
            return False
        return True

    def release(self, rid: int, abort: bool) -> None:
        """The caller is done with `rid`; with abort=True the engine drops it and frees its pages."""
        self.mailboxes.pop(rid, None)
        if abort and not self.dead and not self.closed:
            self._send(AbortRequest(rid))

    def fail_all(self, message: str, code: str | None = None) -> None:
        """End every request in flight with an error (the server is shutting down): each of their
        handlers sends its client an error and aborts the request in the engine."""
        for mailbox in self.mailboxes.values():
            mailbox.put(_failure(message, code))

    async def stats(self, timeout: float = 5.0) -> EngineStats:
        """A fresh snapshot from the engine (the last one known if it does not answer in time)."""
        if self.dead:
            return self.last_stats
        query_id = next(self.query_ids)
        future: asyncio.Future[EngineStats] = asyncio.get_running_loop().create_future()
        self.stats_waiters[query_id] = future
        self._send(StatsQuery(query_id))
        try:
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            return self.last_stats
        finally:
            self.stats_waiters.pop(query_id, None)

    async def _receive_loop(self) -> None:
        while True:
            if not await self.receiver.poll(1000):
                lost = self._lost_process()
                if lost is not None:
                    self.engine_lost(lost)
                    return
                continue
            frames: list[zmq.Frame] | None = await self.receiver.recv_multipart(copy=False)
            steps = 0
            while frames is not None:
                msg = self._read(frames)
                if isinstance(msg, StepColumns):
                    self._deliver(msg)
                    steps += 1
                    # On time: let the requests just woken write their frames before the next
                    # step is read, so each stream's frames leave a step apart. Behind: deliver
                    # the steps already here first (module docstring).
                    if steps >= CATCH_UP_STEPS or not self._behind(msg):
                        break
                elif isinstance(msg, EngineStats):
                    self._stats_arrived(msg)
                frames = self._waiting_message()
            if steps:
                await asyncio.sleep(0)

    @staticmethod
    def _read(frames: list[zmq.Frame]) -> object:
        try:
            return decode(frames)
        except Exception:  # a message we cannot read must not stop every other request
            log.exception("unreadable message from the engine")
            return None

    def _waiting_message(self) -> list[zmq.Frame] | None:
        """The next message if one is already here, without waiting (None otherwise)."""
        try:
            return self.receiver.recv_multipart(zmq.NOBLOCK, copy=False).result()
        except zmq.Again:
            return None

    def _behind(self, step: StepColumns) -> bool:
        limit = self.catch_up_s
        return limit is not None and bool(step.tokens_at) and time.monotonic() - step.tokens_at > limit

    def _stats_arrived(self, msg: EngineStats) -> None:
        self.last_stats = msg
        future = self.stats_waiters.get(msg.query_id)
        if future is not None and not future.done():
            future.set_result(msg)

    def _deliver(self, step: StepColumns) -> None:
        """Each row of a detokenized step to its request: one update, one wake-up."""
        texts, extras, mailboxes = step.texts or [""] * len(step.rids), step.extras, self.mailboxes
        start = 0
        for row, rid in enumerate(step.rids):
            count = step.counts[row]
            mailbox = mailboxes.get(rid)
            if mailbox is not None:  # else: released already (a client that went away)
                update = TokenUpdate(
                    step.tokens[start : start + count], texts[row], FINISH_REASONS[step.finish[row]],
                    step.cached[row], None, None, None, step.tokens_at, step.detokenized_at, step.decode_only,
                )  # fmt: skip
                extra = extras.get(row)
                if extra is not None:
                    update.logprobs, update.error, update.error_code = (
                        extra.logprobs,
                        extra.error,
                        extra.error_code,
                    )
                mailbox.put(update)
            start += count

    async def _nudge_loop(self) -> None:
        """Wake every request every NUDGE_S, so a request waiting for a slow engine still checks its
        client (generation.py): one timer for all of them, not one per request and token."""
        while True:
            await asyncio.sleep(NUDGE_S)
            for mailbox in list(self.mailboxes.values()):
                mailbox.nudge()

    def _lost_process(self) -> str | None:
        if not self.engine.is_alive():
            return f"exit code {self.engine.process.exitcode}"
        if not self.detokenizer.is_alive():
            return f"the detokenizer process exited (exit code {self.detokenizer.process.exitcode})"
        return None

    def engine_lost(self, reason: str) -> None:
        """The engine is gone (or hung, and killed: frontend/engine_monitor.py): every request in
        flight ends with `engine_dead`; the details go to the log, not to the clients."""
        if self.dead:
            return
        log.error("the engine is lost: %s", reason)
        self.dead = True
        for mailbox in self.mailboxes.values():
            mailbox.put(_failure(ENGINE_GONE, ENGINE_DEAD))
        if self.on_lost is not None:
            self.on_lost()

    async def close(self) -> None:
        self.closed = True  # handlers still finishing must not send on closed sockets
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.sender.close(linger=0)
        self.receiver.close(linger=0)
        self.async_ctx.term()


def _failure(message: str, code: str | None) -> TokenUpdate:
    return TokenUpdate([], "", "error", error=message, error_code=code)


class SyncEngineClient:
    """One request at a time, blocking: what an interactive shell needs. It reads the engine's
    token ids itself (frontend/request_state.py detokenizes them)."""

    def __init__(self, engine: EngineProcess):
        self.engine = engine
        self.rids = itertools.count()
        ctx = zmq.Context.instance()
        self.sender = ctx.socket(zmq.PUSH)
        self.sender.connect(engine.request_addr)
        self.receiver = ctx.socket(zmq.PULL)
        self.receiver.connect(engine.output_addr)

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[RequestDelta]:
        """Deltas of one request until it finishes. Closing the iterator early (a break, a
        KeyboardInterrupt) aborts the request in the engine."""
        rid = next(self.rids)
        self.sender.send_pyobj(AddRequest(rid, prompt_ids, params))
        finished = False
        try:
            while not finished:
                if not self.receiver.poll(1000):
                    if not self.engine.is_alive():
                        yield RequestDelta(rid=rid, token_ids=[], finish_reason="error", error=ENGINE_GONE)
                        return
                    continue
                msg = decode(self.receiver.recv_multipart(copy=False))
                if not isinstance(msg, StepColumns):
                    continue
                for delta in msg.deltas():
                    if delta.rid == rid:
                        finished = delta.finish_reason is not None
                        yield delta
        finally:
            if not finished:
                self.sender.send_pyobj(AbortRequest(rid))

    def close(self) -> None:
        self.sender.close(linger=0)
        self.receiver.close(linger=0)
