"""The engine process's proof of life, and the frontend's test of it.

An engine process can stop serving without exiting, in two ways:

- its whole process is frozen: stopped (SIGSTOP, a debugger), swapped out, or deadlocked in code
  that holds the GIL. Nothing in it runs;
- one step never returns: a GPU kernel or a collective that hangs. Its other threads still run.

A `Pulse` is three counters in shared memory: `beats`, bumped every BEAT_S by a thread of the
engine process (`Heartbeat`), and `steps_begun` / `steps_done`, bumped by the engine's loop around
each step. The frontend's `StallWatch` reads them (counters, not clocks: a frontend that was busy
itself sees them move on, and raises no false alarm):

- no beat for `silence_s` (default 10 s): the process is frozen. A step does not silence the beats,
  however long it runs: the thread beats beside it (PyTorch releases the GIL in its kernels, and
  Python hands it over every few milliseconds otherwise). So the limit only has to outlast the
  scheduling hiccups of a loaded machine (a second at worst) and stays short;
- one step running for `step_timeout_s` (default 600 s): the step is hung. This limit must outlast
  the longest legitimate step, which is long: a prefill of --max-prefill-length tokens on a CPU
  (issue 29 measured 128 s for 4,000 tokens beside 8 streams), or the first step on a GPU, in which
  FlashInfer compiles its kernels (about 50 s each on Hopper). 600 s covers both with room to spare;
  a GPU deployment whose steps take milliseconds can lower it with --engine-step-timeout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BEAT_S = 0.25
DEFAULT_SILENCE_S = 10.0
DEFAULT_STEP_TIMEOUT_S = 600.0
BEATS, STEPS_BEGUN, STEPS_DONE = range(3)


@dataclass
class Pulse:
    """Counters shared by the engine process (the only writer of each) and the frontend."""

    counters: Any  # a multiprocessing RawArray of 3 unsigned 64-bit integers: aligned, so read whole

    @classmethod
    def create(cls, ctx: Any) -> Pulse:
        """`ctx`: the multiprocessing context the engine process is spawned with."""
        return cls(ctx.RawArray("Q", 3))

    def beat(self) -> None:
        self.counters[BEATS] += 1

    def step_begins(self) -> None:
        self.counters[STEPS_BEGUN] += 1

    def step_ends(self) -> None:
        self.counters[STEPS_DONE] += 1

    def read(self) -> tuple[int, int, int]:
        return self.counters[BEATS], self.counters[STEPS_BEGUN], self.counters[STEPS_DONE]


class Heartbeat(threading.Thread):
    """The engine process's beating thread."""

    def __init__(self, pulse: Pulse):
        super().__init__(name="engine-heartbeat", daemon=True)
        self.pulse = pulse
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(BEAT_S):
            self.pulse.beat()

    def stop(self) -> None:
        self.stopped.set()


class StallWatch:
    """The frontend's reading of a Pulse: `check()` says why the engine is hung, or None."""

    def __init__(
        self,
        pulse: Pulse,
        silence_s: float = DEFAULT_SILENCE_S,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.pulse, self.silence_s, self.step_timeout_s, self.clock = pulse, silence_s, step_timeout_s, clock
        now = clock()
        beats, begun, _ = pulse.read()
        self.beats, self.beats_changed_at = beats, now
        self.begun, self.step_seen_at = begun, now

    def check(self) -> str | None:
        now = self.clock()
        beats, begun, done = self.pulse.read()
        if beats != self.beats:
            self.beats, self.beats_changed_at = beats, now
        elif now - self.beats_changed_at > self.silence_s:
            return (
                f"the engine process has shown no sign of life for {now - self.beats_changed_at:.0f} s "
                "(stopped or frozen; --engine-silence-timeout)"
            )
        if begun != self.begun or begun == done:  # a new step, or none running
            self.begun, self.step_seen_at = begun, now
        elif self.step_timeout_s and now - self.step_seen_at > self.step_timeout_s:
            return f"one engine step has run for {now - self.step_seen_at:.0f} s (--engine-step-timeout)"
        return None
