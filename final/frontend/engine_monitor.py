"""The server's watch over its engine process: dead, frozen, or stuck in a step.

Every POLL_S, on the event loop: has the process exited (or the detokenizer process, through
which the server's tokens come)? is its heartbeat silent? has one step
run too long (runtime/heartbeat.py says why these are different limits)? The first loss found is
handed to `on_lost(reason)`, once: the client ends every request in flight with `engine_dead`, and
the server stops (server/launch.py). A hung engine is killed first (SIGKILL: it may be stopped, or
stuck where SIGTERM cannot reach it), so that it frees its memory and its GPU and takes its
tensor-parallel ranks along (they exit when their parent does).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from ..runtime.heartbeat import DEFAULT_SILENCE_S, DEFAULT_STEP_TIMEOUT_S, StallWatch
from ..runtime.process import EngineProcess
from .detokenizer_process import DetokenizerProcess

log = logging.getLogger(__name__)

POLL_S = 0.5


@dataclass(frozen=True)
class Liveness:
    """How long the engine may be silent, and one step may run, before it counts as hung."""

    silence_s: float = DEFAULT_SILENCE_S  # --engine-silence-timeout
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S  # --engine-step-timeout; 0: no limit


def describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"the engine process was killed by {signal.Signals(-code).name}"
    return f"the engine process exited with code {code}"


class EngineMonitor:
    def __init__(
        self,
        engine: EngineProcess,
        liveness: Liveness,
        on_lost: Callable[[str], None],
        detokenizer: DetokenizerProcess | None = None,
    ):
        self.engine, self.on_lost, self.detokenizer = engine, on_lost, detokenizer
        pulse = engine.pulse
        self.watch = None if pulse is None else StallWatch(pulse, liveness.silence_s, liveness.step_timeout_s)
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            reason = self.check()
            if reason is not None:
                self.on_lost(reason)
                return

    def check(self) -> str | None:
        """Why the engine is lost, or None while it serves."""
        process = self.engine.process
        if not process.is_alive():
            return describe_exit(process.exitcode)
        detok = self.detokenizer
        if detok is not None and not detok.is_alive():  # the server's text comes through it
            process.kill()  # the engine would go on generating for nobody
            return "the detokenizer process stopped: " + describe_exit(detok.process.exitcode).removeprefix(
                "the engine process "
            )
        stall = self.watch.check() if self.watch is not None else None
        if stall is None:
            return None
        process.kill()  # not joined here: the event loop must not wait; the server's exit reaps it
        return f"{stall}; killed it"
