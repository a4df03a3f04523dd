"""Liveness under tensor parallelism: every rank proves it is alive, and rank 0 watches them all.

A rank that dies or hangs must end the engine with a message, never leave the others waiting in
a collective forever (an NCCL all-reduce inside a CUDA graph has no timeout of its own). So:

- every rank other than 0 runs a `Heartbeat` thread: it bumps its counter in the rendezvous store
  every HEARTBEAT_S, and exits its process when rank 0 is gone (the store stops answering) or
  when the process that started it is gone;
- rank 0 runs a `Watchdog` thread: a rank is lost when its process on this node has exited, when
  it wrote its own failure into the store (its last words: the exception that stopped it), or
  when its heartbeat has been silent for `silence_s` (a hung process, or a lost node).

The keys live under "final/" in the store, beside torch.distributed's own.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

import torch.distributed as dist

log = logging.getLogger(__name__)

HEARTBEAT_S = 1.0
POLL_S = 0.2
MAX_SILENCE_S = 30.0  # a rank silent this long is lost (less when --dist-timeout is shorter)
START_TIMEOUT_S = 600.0

ENGINE_KEY = "final/engine"  # what every rank needs to build its runner (ranks.RankSpec, pickled)
JOINED_KEY = "final/joined"  # ranks that reached the process-group rendezvous
LEFT_KEY = "final/left"  # ranks that left cleanly after rank 0's shutdown


def heartbeat_key(rank: int) -> str:
    return f"final/heartbeat/{rank}"


def failure_key(rank: int) -> str:
    return f"final/failed/{rank}"


def silence_limit(dist_timeout: float) -> float:
    return min(MAX_SILENCE_S, dist_timeout)


def start_timeout(dist_timeout: float) -> float:
    """How long the ranks wait for each other to arrive: a rank imports torch and the other nodes
    may be started by hand, so at least START_TIMEOUT_S, whatever a collective's timeout."""
    return max(START_TIMEOUT_S, dist_timeout)


def describe_exit(rank: int, pid: int, code: int) -> str:
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return f"tensor-parallel rank {rank} (pid {pid}) {how}"


class Heartbeat(threading.Thread):
    """A rank's proof of life, and its way out when the engine it serves is gone."""

    def __init__(self, store: dist.Store, rank: int, parent_pid: int):
        super().__init__(name=f"heartbeat-{rank}", daemon=True)
        self.store, self.rank, self.parent_pid = store, rank, parent_pid
        self.stopped = threading.Event()

    def start(self) -> None:
        # The first beat before the rank announces itself: rank 0 times every rank that has
        # arrived, even one that hangs a moment later.
        self.store.add(heartbeat_key(self.rank), 1)
        super().start()

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            if os.getppid() != self.parent_pid:
                self._exit("the process that started it is gone")
            try:
                self.store.add(heartbeat_key(self.rank), 1)
            except Exception as err:  # the store lives in rank 0's process
                if not self.stopped.is_set():
                    self._exit(f"rank 0 does not answer ({type(err).__name__}: {err})")

    def _exit(self, why: str) -> None:
        # The main thread may be blocked in a collective that will never complete: leave now.
        log.error("tensor-parallel rank %d exiting: %s", self.rank, why)
        logging.shutdown()
        os._exit(1)

    def stop(self) -> None:
        self.stopped.set()


class Watchdog(threading.Thread):
    """Rank 0's watch over ranks 1..size-1; the first loss found goes to `on_failure`, once."""

    def __init__(
        self,
        store: dist.Store,
        size: int,
        local: dict[int, subprocess.Popen],
        silence_s: float,
        on_failure: Callable[[str], None],
    ):
        super().__init__(name="tp-watchdog", daemon=True)
        self.store, self.size, self.local = store, size, local
        self.silence_s, self.on_failure = silence_s, on_failure
        self.stopped = threading.Event()
        # rank -> (last heartbeat count, when it changed); a rank is timed only once it has beaten.
        self.beats: dict[int, tuple[int, float]] = {}

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        while not self.stopped.wait(POLL_S):
            try:
                message = self.check()
            except Exception as err:  # the store itself failed: nothing more to watch with
                message = f"the tensor-parallel watchdog lost its store ({type(err).__name__}: {err})"
            if message is not None and not self.stopped.is_set():
                self.on_failure(message)
                return

    def check(self) -> str | None:
        now = time.monotonic()
        for rank in range(1, self.size):
            words = self.last_words(rank)
            proc = self.local.get(rank)
            code = proc.poll() if proc is not None else None
            if code is not None:
                words = words or self.last_words(rank)  # written just before it exited
                exit_message = describe_exit(rank, proc.pid, code)  # type: ignore[union-attr]
                return exit_message + (f": {words}" if words else "")
            if words:
                return f"tensor-parallel rank {rank} failed: {words}"
            count = self.store.add(heartbeat_key(rank), 0)
            last = self.beats.get(rank)
            if count and (last is None or count != last[0]):
                self.beats[rank] = (count, now)
            elif last is not None and now - last[1] > self.silence_s:
                return (
                    f"tensor-parallel rank {rank} has not been heard from for {now - last[1]:.0f} s "
                    "(it hung, or its node is gone)"
                )
        return None

    def last_words(self, rank: int) -> str | None:
        key = failure_key(rank)
        return self.store.get(key).decode() if self.store.check([key]) else None
