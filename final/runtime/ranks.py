"""Tensor parallelism's processes: rank 0 starts the other ranks, watches them, and feeds them steps.

    python -m final --tp 4        rank 0 is the engine process; it starts ranks 1-3 on this machine
    LLM(model, tp=2)              rank 0 is your process
    python -m final --tp 8 --nnodes 2 --node-rank 1 --dist-init-addr HOST:PORT
                                  node 1 starts ranks 4-7, which meet node 0's ranks at HOST:PORT

No launcher is needed: rank 0 serves the rendezvous store, publishes in it what every rank needs
(the engine's config, the model folder, the dtype), and starts each rank of its node as a fresh
interpreter (`python -m final.runtime.worker`, worker.py), rank i on cuda:i (or the CPU, with
gloo). Every other node's `python -m final --node-rank k` only starts its node's ranks and
waits on them (node.py); it takes every engine flag from node 0.

Rank 0 alone schedules, samples and talks to the frontend. Per step it sends the batch
(distributed/step_channel.py), then every rank runs the same executor step (engine/executor.py):
its shard of the forward pass (their all-reduces meet), rank 0's sampling, and the broadcast of
the sampled tokens into every rank's device token table, where the next decode step reads them.

When a rank is lost (watchdog.py), `RankGroup` records why, stops the ranks of this node, and the
step in progress fails with a `RankFailure` carrying that message. If rank 0 is stuck in a
collective that cannot complete (NCCL inside a CUDA graph), its process exits after GRACE_S with
the message on stderr rather than hang.
"""

from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.devices import cpu_threads
from ..distributed.group import LOOPBACK, close_tp, init_tp, open_store, parse_address
from ..distributed.one_shot import wanted as one_shot_wanted
from ..distributed.step_channel import StepChannel
from ..distributed.tp import TPInfo
from ..engine.resolve import ResolvedConfig
from .watchdog import (
    ENGINE_KEY,
    JOINED_KEY,
    LEFT_KEY,
    POLL_S,
    Watchdog,
    silence_limit,
    start_timeout,
)

log = logging.getLogger(__name__)

EXPLAIN_S = 5.0  # how long a failed step waits for the watchdog to say which rank was lost
GRACE_S = 15.0  # how long rank 0 may stay stuck in a step after a loss before its process exits
STOP_S = 30.0  # how long a rank may take to leave after rank 0's shutdown before it is killed
FAILED_EXIT_CODE = 3  # rank 0's process status when a lost rank ends it (the engine process's too)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding final/, for the ranks' imports


class RankFailure(RuntimeError):
    """A tensor-parallel rank was lost (or a step failed on rank 0): the engine cannot go on."""


@dataclass
class RankSpec:
    """What rank 0 publishes for the others: they build the same executor it did, from the same
    resolved config (rank i of a node runs on cuda:i, or the CPU)."""

    config: ResolvedConfig
    log_level: str


def cpu_threads_per_rank(config: ResolvedConfig) -> int | None:
    """On the CPU, each rank's share of the node's cores (core/devices.py's rule; None when
    OMP_NUM_THREADS is set): the ranks meet in every all-reduce, so one rank whose threads wait for
    a core stalls them all. Rank 0 has set its own already (build.py)."""
    return cpu_threads(config.threads, config.ranks_per_node) if config.device.type == "cpu" else None


def spawn_rank(host: str, port: int, rank: int, local_rank: int, threads: int | None) -> subprocess.Popen:
    """Start one rank: a fresh interpreter that connects to the store at host:port."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    argv = [sys.executable, "-m", "final.runtime.worker", "--store", f"{host}:{port}", "--rank", str(rank)]
    return subprocess.Popen([*argv, "--local-rank", str(local_rank)], env=env)


class RankGroup:
    """Rank 0's handle on the other ranks: the process groups, the step channel, the watchdog."""

    def __init__(self, config: ResolvedConfig):
        self.config, self.device = config, config.device
        self.tp = TPInfo()
        self.channel: StepChannel | None = None
        self.local: dict[int, subprocess.Popen] = {}
        self.failure: str | None = None
        self.failed = threading.Event()
        self.idle = threading.Event()  # rank 0 is not inside a step (see `guard`)
        self.idle.set()
        self.lock = threading.Lock()
        self.closed = False
        self.watchdog: Watchdog | None = None
        self.store: Any = None  # the rendezvous server (a TCPStore), while the ranks run

    @classmethod
    def start(cls, config: ResolvedConfig) -> RankGroup:
        """Serve the rendezvous, start this node's other ranks, and join the process groups once
        every rank (those of the other nodes too) has arrived."""
        group = cls(config)
        try:
            group._start()
        except BaseException:
            group.close()
            raise
        return group

    def _start(self) -> None:
        config = self.config
        host, port = parse_address(config.dist_init_addr) if config.dist_init_addr else (LOOPBACK, 0)
        self.store = open_store(host, port, config.tp, is_server=True, timeout_s=config.dist_timeout)
        port = self.store.port  # the port it took, when asked for any free one
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        self.store.set(ENGINE_KEY, pickle.dumps(RankSpec(config, level)))
        threads = cpu_threads_per_rank(config)
        for rank in range(1, config.ranks_per_node):
            self.local[rank] = spawn_rank(host, port, rank, rank, threads)
        watch_store = open_store(host, port, config.tp, is_server=False, timeout_s=config.dist_timeout)
        silence = silence_limit(config.dist_timeout)
        self.watchdog = Watchdog(watch_store, config.tp, self.local, silence, self._on_watchdog_failure)
        self.watchdog.start()
        self._wait_for_ranks(host, port)
        one_shot = one_shot_wanted(self.device, config.tp, config.nnodes)
        self.tp = init_tp(self.store, 0, config.tp, self.device, config.dist_timeout, one_shot)
        self.channel = StepChannel(self.tp)
        log.info(
            "tensor parallelism: %d ranks on %d node(s), rendezvous %s:%d",
            config.tp,
            config.nnodes,
            host,
            port,
        )

    def _wait_for_ranks(self, host: str, port: int) -> None:
        """Wait (watching for losses) until every rank has reached the rendezvous."""
        deadline = time.monotonic() + start_timeout(self.config.dist_timeout)
        others = self.config.tp - 1
        while (joined := self.store.add(JOINED_KEY, 0)) < others:
            if self.failed.wait(POLL_S):  # a rank died while starting: its message says why
                raise RankFailure(self.failure)
            if time.monotonic() > deadline:
                hint = ""
                if self.config.nnodes > 1:
                    hint = (
                        f"; start `python -m final --tp {self.config.tp} --nnodes {self.config.nnodes} "
                        f"--node-rank K --dist-init-addr {host}:{port}` on every other node"
                    )
                raise RankFailure(
                    f"{others - joined} of {others} tensor-parallel ranks did not arrive within "
                    f"{start_timeout(self.config.dist_timeout):.0f} s{hint}"
                )

    # ------------------------------------------------------------------ every step

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Around anything that meets the other ranks: a loss (now or before) becomes a RankFailure
        with the watchdog's message. Any exception does: the ranks' collectives are out of step."""
        if self.failure is not None:
            raise RankFailure(self.failure)
        self.idle.clear()
        try:
            yield
        except Exception as err:
            if not self.failed.wait(EXPLAIN_S):  # the watchdog saw no loss: the step failed here
                self._fail(f"a step failed on tensor-parallel rank 0 ({type(err).__name__}: {err})")
            raise RankFailure(self.failure) from err
        except BaseException:  # Ctrl-C in the middle of a step: the ranks are out of step for good
            self._fail("a step on tensor-parallel rank 0 was interrupted")
            raise
        finally:
            self.idle.set()
        # A loss while the step ran voids its results, even when it returned (an aborted NCCL call).
        if self.failure is not None:
            raise RankFailure(self.failure)

    # ------------------------------------------------------------------ failure and shutdown

    def _fail(self, message: str) -> bool:
        """Record the first loss and stop this node's ranks; False when one was recorded already."""
        with self.lock:
            if self.failure is not None:
                return False
            self.failure = message
        log.error("%s; stopping the engine", message)
        self.failed.set()
        for proc in self.local.values():
            if proc.poll() is None:
                proc.kill()  # a hung rank may not answer SIGTERM
        return True

    def _on_watchdog_failure(self, message: str) -> None:
        if not self._fail(message) or self.idle.is_set():
            return  # between steps: the next step raises
        # A gloo collective fails as soon as its peers are gone; NCCL's (in a CUDA graph above all)
        # may wait forever: abort its communicators, and if rank 0 is still stuck, exit.
        if self.device.type == "cuda":
            try:
                self.tp.group._get_backend(self.device).abort()
            except Exception as err:
                log.warning("aborting NCCL failed: %s", err)
        if not self.idle.wait(GRACE_S):
            sys.stderr.write(f"error: {message}; rank 0 is stuck in a collective and exits\n")
            sys.stderr.flush()
            logging.shutdown()
            os._exit(FAILED_EXIT_CODE)

    def close(self) -> None:
        """Stop every rank: after a clean run, rank 0's shutdown message and a wait for them to
        leave; after a loss, this node's ranks are killed. Idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.watchdog is not None:
            self.watchdog.stop()
        clean = self.failure is None and self.channel is not None  # the ranks are listening
        if clean:
            try:
                self.channel.send_shutdown()  # type: ignore[union-attr]
            except Exception as err:
                log.warning("tensor-parallel shutdown: %s", err)
                clean = False
        if clean:  # the ranks leave the groups together (close_tp): rank 0 with them, then they exit
            self._leave_groups(abort=False)
            self._wait_for_ranks_to_leave()
        for rank, proc in self.local.items():
            try:
                proc.wait(STOP_S if clean else 0.1)
            except subprocess.TimeoutExpired:
                if clean:
                    log.warning("tensor-parallel rank %d (pid %d) did not exit; killing it", rank, proc.pid)
                proc.kill()
                proc.wait()
        if not clean:  # the ranks are gone (lost, or killed above): nobody to leave together with
            self._leave_groups(abort=True)
        self.store = None  # the rendezvous server stops: ranks of other nodes still waiting exit

    def _leave_groups(self, abort: bool) -> None:
        try:
            close_tp(self.tp, abort=abort)
        except Exception as err:
            log.warning("leaving the process groups: %s", err)

    def _wait_for_ranks_to_leave(self) -> None:
        deadline = time.monotonic() + STOP_S
        while self.store.add(LEFT_KEY, 0) < self.config.tp - 1 and time.monotonic() < deadline:
            time.sleep(POLL_S)  # the ranks of other nodes are not our children: poll the store
