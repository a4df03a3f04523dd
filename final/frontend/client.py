"""Clients of the engine process: an asyncio one for the server, a blocking one for the shell.

Both connect to the two sockets the engine binds (see runtime/process.py): they PUSH
AddRequest / AbortRequest / StatsQuery and PULL StepOutputs / EngineStats. Sends never wait
on the engine (a PUSH queues the message), so an abort from a cancelled task always goes out.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
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
    StepOutputs,
)
from ..runtime.process import EngineProcess

log = logging.getLogger(__name__)

ENGINE_GONE = "the engine process stopped"


class AsyncEngineClient:
    def __init__(self, engine: EngineProcess):
        self.engine = engine
        self.rids = itertools.count()
        self.query_ids = itertools.count(1)
        self.queues: dict[int, asyncio.Queue[RequestDelta]] = {}
        self.stats_waiters: dict[int, asyncio.Future[EngineStats]] = {}
        self.last_stats = EngineStats(num_pages=engine.info.num_pages, free_pages=engine.info.num_pages)
        # Sends go through a plain socket: they never block, so they are safe in a `finally` of a
        # cancelled task; only the receiving side needs the event loop.
        self.sender = zmq.Context.instance().socket(zmq.PUSH)
        # No high-water mark (admission bounds what is in flight) and no blocking send: a stalled
        # engine must never stall the event loop, nor a shutdown.
        self.sender.setsockopt(zmq.SNDHWM, 0)
        self.sender.setsockopt(zmq.LINGER, 0)
        self.sender.connect(engine.request_addr)
        self.async_ctx = zmq.asyncio.Context()
        self.receiver = self.async_ctx.socket(zmq.PULL)
        self.receiver.connect(engine.output_addr)
        self.receive_task: asyncio.Task[None] | None = None
        self.dead = False
        self.closed = False
        # Called once when the engine is lost (engine_lost): the server stops then (server/launch.py).
        self.on_lost: Callable[[], None] | None = None

    def start(self) -> None:
        self.receive_task = asyncio.get_running_loop().create_task(self._receive_loop())

    @property
    def num_in_flight(self) -> int:
        return len(self.queues)

    def submit(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> tuple[int, asyncio.Queue[RequestDelta]]:
        rid = next(self.rids)
        queue: asyncio.Queue[RequestDelta] = asyncio.Queue()
        self.queues[rid] = queue
        if self.dead or not self._send(AddRequest(rid, prompt_ids, params)):
            queue.put_nowait(
                RequestDelta(
                    rid=rid, token_ids=[], finish_reason="error", error=ENGINE_GONE, error_code=ENGINE_DEAD
                )
            )
        return rid, queue

    def _send(self, msg: object) -> bool:
        try:
            self.sender.send_pyobj(msg, zmq.NOBLOCK)
        except zmq.ZMQError as err:  # Again (cannot happen without a high-water mark) or closed
            log.error("cannot send %s to the engine: %s", type(msg).__name__, err)
            return False
        return True

    def release(self, rid: int, abort: bool) -> None:
        """The caller is done with `rid`; with abort=True the engine drops it and frees its pages."""
        self.queues.pop(rid, None)
        if abort and not self.dead and not self.closed:
            self._send(AbortRequest(rid))

    def fail_all(self, message: str, code: str | None = None) -> None:
        """End every request in flight with an error (the server is shutting down): each of their
        handlers sends its client an error and aborts the request in the engine."""
        for rid, queue in self.queues.items():
            queue.put_nowait(
                RequestDelta(rid=rid, token_ids=[], finish_reason="error", error=message, error_code=code)
            )

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
                if not self.engine.is_alive():
                    self.engine_lost(f"exit code {self.engine.process.exitcode}")
                    return
                continue
            try:
                msg = await self.receiver.recv_pyobj()
            except Exception:  # a message we cannot read must not stop every other request
                log.exception("unreadable message from the engine")
                continue
            if isinstance(msg, StepOutputs):
                for delta in msg.deltas:
                    queue = self.queues.get(delta.rid)
                    if queue is not None:  # else: released already (a client that went away)
                        queue.put_nowait(delta)
            elif isinstance(msg, EngineStats):
                self.last_stats = msg
                future = self.stats_waiters.get(msg.query_id)
                if future is not None and not future.done():
                    future.set_result(msg)

    def engine_lost(self, reason: str) -> None:
        """The engine is gone (or hung, and killed: frontend/engine_monitor.py): every request in
        flight ends with `engine_dead`; the details go to the log, not to the clients."""
        if self.dead:
            return
        log.error("the engine is lost: %s", reason)
        self.dead = True
        for rid, queue in self.queues.items():
            queue.put_nowait(
                RequestDelta(
                    rid=rid, token_ids=[], finish_reason="error", error=ENGINE_GONE, error_code=ENGINE_DEAD
                )
            )
        if self.on_lost is not None:
            self.on_lost()

    async def close(self) -> None:
        self.closed = True  # handlers still finishing must not send on closed sockets
        if self.receive_task is not None:
            self.receive_task.cancel()
            try:
                await self.receive_task
            except asyncio.CancelledError:
                pass
        self.sender.close(linger=0)
        self.receiver.close(linger=0)
        self.async_ctx.term()


class SyncEngineClient:
    """One request at a time, blocking: what an interactive shell needs."""

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
                msg = self.receiver.recv_pyobj()
                if not isinstance(msg, StepOutputs):
                    continue
                for delta in msg.deltas:
                    if delta.rid == rid:
                        finished = delta.finish_reason is not None
                        yield delta
        finally:
            if not finished:
                self.sender.send_pyobj(AbortRequest(rid))

    def close(self) -> None:
        self.sender.close(linger=0)
        self.receiver.close(linger=0)
