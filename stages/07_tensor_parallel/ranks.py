"""Tensor parallelism's processes: rank 0 starts the other ranks, watches them, and stops them.

    python -m stages.07_tensor_parallel --tp 2 ...   this process is rank 0; it starts rank 1
    LLM(model, tp=2)                                 the same, from Python
    python -m stages.07_tensor_parallel --tp 4 --nnodes 2 --node-rank 1 --dist-init-addr HOST:PORT
                                                     node 1 starts ranks 2 and 3 for node 0's engine

No launcher is needed. Rank 0 serves the rendezvous, a TCPStore (on a free loopback port, or at
--dist-init-addr across machines), publishes there what the other ranks need to build their
runner (`RankSpec`), and starts each rank of its node as a fresh interpreter running worker.py,
rank i on cuda:i (or on the CPU). Then every rank joins the process groups (distributed.py).

A lost rank must end the engine with a message, never leave the others waiting in a collective
(NCCL's, inside a CUDA graph, waits forever). So every other rank beats a heartbeat into the
store, and rank 0 runs a watchdog thread: a rank is lost when its process exits or when its
heartbeat stops for `silence_s`. Rank 0 then kills the ranks of its node (their collectives with
it fail at once; the ranks of other nodes exit when the store stops answering), and the step in
progress raises `RankFailure` naming the rank. If rank 0 stays stuck in a collective that will
never complete (NCCL on a GPU), its process exits after GRACE_S with the message on stderr.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from stages.common.devices import cpu_threads
from stages.common.errors import UserError

from .distributed import TPInfo, close_groups, init_groups

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
POLL_S = 0.2  # how often the watchdog looks
HEARTBEAT_S = 1.0  # how often a rank proves it is alive
MAX_SILENCE_S = 30.0  # a rank silent this long is lost (less when dist_timeout is shorter)
START_TIMEOUT_S = 600.0  # ranks import torch and read weights; other nodes may be started by hand
EXPLAIN_S = 5.0  # how long a failed collective waits for the watchdog to name the lost rank
GRACE_S = 15.0  # how long rank 0 may stay stuck in a step after a loss before its process exits
STOP_S = 30.0  # how long the ranks may take to leave after rank 0's shutdown message
FAILED_EXIT_CODE = 3  # the status of a process that a lost rank ends
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding stages/, for the ranks' imports

SPEC_KEY, JOINED_KEY, LEFT_KEY = "stage07/spec", "stage07/joined", "stage07/left"
FAILURES_KEY = "stage07/failures"  # how many ranks have failed so far


def heartbeat_key(rank: int) -> str:
    return f"stage07/heartbeat/{rank}"


def failure_key(rank: int) -> str:
    return f"stage07/failed/{rank}"


def report_failure(store: dist.Store, rank: int, err: BaseException) -> None:
    """A failing rank's last words, for the watchdog, with a ticket: how many ranks failed before it."""
    ticket = store.add(FAILURES_KEY, 1)
    store.set(failure_key(rank), f"{ticket} {type(err).__name__}: {err}")


class RankFailure(RuntimeError):
    """A tensor-parallel rank was lost (or a step failed on rank 0): the engine cannot go on."""


@dataclass
class RankSpec:
    """What rank 0 publishes for the others: they build the runner it built, from the same folder."""

    folder: str
    max_context: int | None
    device_type: str  # cuda or cpu; rank i takes cuda:<its index on its node>
    dtype: str  # float32, bfloat16, float16
    runner_args: dict[str, Any]  # ModelRunner's keyword arguments
    size: int
    nnodes: int
    dist_timeout: float
    log_level: int

    @property
    def ranks_per_node(self) -> int:
        return self.size // self.nnodes


def parse_address(address: str) -> tuple[str, int]:
    """'HOST:PORT' (an IPv6 host in brackets: '[::1]:29500') -> (host, port)."""
    host, sep, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--dist-init-addr takes HOST:PORT (e.g. 10.0.0.1:29500), got {address!r}")
    return host, int(port)


def open_store(host: str, port: int, is_server: bool, timeout_s: float) -> dist.TCPStore:
    """Rank 0 serves the store (port 0: any free port, read back from `store.port`); every other
    rank connects to it, retrying until `timeout_s` (a node may start before node 0 does)."""
    try:
        return dist.TCPStore(host, port, is_master=is_server, timeout=timedelta(seconds=timeout_s),
                             wait_for_workers=False)  # fmt: skip
    except (RuntimeError, OSError) as err:
        where = f"{host}:{port}"
        if is_server:
            raise UserError(f"cannot serve the tensor-parallel rendezvous on {where}: {err}") from err
        raise UserError(
            f"cannot reach the tensor-parallel rendezvous at {where} (is node 0 up?): {err}"
        ) from err


def silence_limit(dist_timeout: float) -> float:
    """How long a rank may stay silent: at most half the collectives' timeout, so that a hung rank
    is found before its peers' collectives time out (they would fail too, and hide which one hung)."""
    return min(MAX_SILENCE_S, dist_timeout / 2)


def describe_exit(rank: int, pid: int, code: int) -> str:
    how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
    return f"tensor-parallel rank {rank} (pid {pid}) {how}"


def cpu_threads_per_rank(ranks_on_node: int) -> int | None:
    """On the CPU, each rank's share of the node's cores, by the rule of every stage and final/
    (stages/common/devices.py; None when OMP_NUM_THREADS says): the ranks meet in every
    all-reduce, so one rank whose threads wait for a core stalls them all."""
    return cpu_threads(None, ranks_on_node)


# --8<-- [start:spawn]
def spawn_rank(host: str, port: int, rank: int, local_rank: int, threads: int | None) -> subprocess.Popen:
    """Start one rank: a fresh interpreter running worker.py, which connects to the store."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    argv = ["--store", f"{host}:{port}", "--rank", str(rank), "--local-rank", str(local_rank)]
    return subprocess.Popen([sys.executable, "-m", f"{__package__}.worker", *argv], env=env,
                            stdin=subprocess.DEVNULL)  # fmt: skip


# --8<-- [end:spawn]


class RankGroup:
    """Rank 0's handle on the other ranks: the process groups, their processes, the watchdog."""

    def __init__(self, spec: RankSpec, device: torch.device):
        self.spec, self.device = spec, device
        self.tp = TPInfo()
        self.local: dict[int, subprocess.Popen] = {}  # the other ranks of this node
        self.silence_s = silence_limit(spec.dist_timeout)
        self.failure: str | None = None
        self.lost = threading.Event()  # set with `failure`
        self.idle = threading.Event()  # rank 0 is not inside a step (see `guard`)
        self.idle.set()
        self.stopped = threading.Event()  # the watchdog's stop signal
        self.lock = threading.Lock()
        self.closed = False
        self.store: Any = None  # the rendezvous server, while the ranks run

    # --8<-- [start:start]
    @classmethod
    def start(cls, spec: RankSpec, device: torch.device, address: str | None) -> RankGroup:
        """Serve the rendezvous, start this node's other ranks, watch them, and join the process
        groups once every rank (those of the other nodes too) has arrived."""
        group = cls(spec, device)
        try:
            group._start(address)
        except BaseException:
            group.close()  # the ranks it started go too
            raise
        return group

    def _start(self, address: str | None) -> None:
        spec = self.spec
        if dist.is_initialized():  # one engine's rank 0 per process: it holds the process group
            raise UserError(
                "this process has a torch.distributed process group already (another tensor-parallel "
                "engine, or torchrun): close that engine first; the stage starts its own ranks"
            )
        host, port = parse_address(address) if address else (LOOPBACK, 0)
        self.store = open_store(host, port, is_server=True, timeout_s=START_TIMEOUT_S)
        port = self.store.port  # the one it took, when asked for any free port
        self.store.set(SPEC_KEY, pickle.dumps(spec))
        threads = cpu_threads_per_rank(spec.ranks_per_node) if spec.device_type == "cpu" else None
        if threads is not None and threads < torch.get_num_threads():
            torch.set_num_threads(threads)
        for rank in range(1, spec.ranks_per_node):
            self.local[rank] = spawn_rank(host, port, rank, rank, threads)
        watch_store = open_store(host, port, is_server=False, timeout_s=START_TIMEOUT_S)
        threading.Thread(target=self._watch, args=(watch_store,), name="tp-watchdog", daemon=True).start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while (joined := self.store.add(JOINED_KEY, 0)) < spec.size - 1:
            if self.lost.wait(POLL_S):  # a rank died while starting: the watchdog says how
                raise RankFailure(self.failure)
            if time.monotonic() > deadline:
                raise RankFailure(
                    f"{spec.size - 1 - joined} of {spec.size - 1} tensor-parallel ranks did not arrive within "
                    f"{START_TIMEOUT_S:.0f} s (with --nnodes, start every other node with --dist-init-addr "
                    f"{host}:{port})"
                )
        self.tp = init_groups(self.store, 0, spec.size, self.device, spec.dist_timeout)
        log.info("tensor parallelism: %d ranks on %d node(s), rendezvous at %s:%d", spec.size, spec.nnodes,
                 host, port)  # fmt: skip

    # --8<-- [end:start]

    # --8<-- [start:watch]
    def _watch(self, store: dist.TCPStore) -> None:
        """The watchdog thread (its own connection to the store). On the first loss: record it,
        kill this node's ranks, and if rank 0 stays stuck in its step, end the process."""
        beats: dict[int, tuple[int, float]] = {}  # rank -> (heartbeat count, when it last changed)
        while not self.stopped.wait(POLL_S):
            try:
                message = self._check(store, beats)
            except Exception as err:  # the store itself failed: nothing left to watch with
                message = f"the tensor-parallel watchdog lost the rendezvous ({type(err).__name__}: {err})"
            if message is None or self.stopped.is_set():
                continue
            if self._fail(message) and not self.idle.wait(GRACE_S):
                sys.stderr.write(f"error: {message}; rank 0 is stuck in a collective and exits\n")
                sys.stderr.flush()
                os._exit(FAILED_EXIT_CODE)
            return

    def _check(self, store: dist.TCPStore, beats: dict[int, tuple[int, float]]) -> str | None:
        """The lost rank to report, if any. One loss brings others: a rank whose collective breaks
        because a peer is gone fails too. So a rank that died without a word (a signal, a crash) or
        fell silent is reported first, then the one that failed first (its ticket: report_failure)."""
        now, losses = time.monotonic(), []
        for rank in range(1, self.spec.size):
            key = failure_key(rank)
            ticket, _, words = store.get(key).decode().partition(" ") if store.check([key]) else ("", "", "")
            order = int(ticket) if ticket else 0  # 0: no last words
            proc = self.local.get(rank)
            code = None if proc is None else proc.poll()
            if code is not None:
                how = describe_exit(rank, proc.pid, code) + (f": {words}" if words else "")  # type: ignore[union-attr]
                losses.append((order, rank, how))
            elif words:
                losses.append((order, rank, f"tensor-parallel rank {rank} failed: {words}"))
            count = store.add(heartbeat_key(rank), 0)
            if rank not in beats or count != beats[rank][0]:
                beats[rank] = (count, now)
            elif count and now - beats[rank][1] > self.silence_s:  # timed once it has beaten
                losses.append((0, rank, f"tensor-parallel rank {rank} has not been heard from for more than "
                                        f"{self.silence_s:g} s (it hung, or its node is gone)"))  # fmt: skip
        return min(losses)[2] if losses else None

    def _fail(self, message: str) -> bool:
        """Record the first loss and kill this node's ranks; False if a loss was recorded already."""
        with self.lock:
            if self.failure is not None:
                return False
            self.failure = message
        log.error("%s; stopping the engine", message)
        self.lost.set()
        for proc in self.local.values():
            if proc.poll() is None:
                proc.kill()  # a hung rank may not answer SIGTERM
        return True

    # --8<-- [end:watch]

    # --8<-- [start:guard]
    @contextmanager
    def guard(self) -> Iterator[None]:
        """Around whatever meets the other ranks. A loss, now or before, raises RankFailure with the
        watchdog's message; so does any error inside, since the ranks' collectives are out of step."""
        if self.failure is not None:
            raise RankFailure(self.failure)
        self.idle.clear()
        try:
            yield
        except UserError as err:  # on rank 0 (rank 0's checks come first): stays the user's error
            self._fail(str(err))
            raise
        except Exception as err:
            if not self.lost.wait(EXPLAIN_S):  # no rank was lost: the step failed here
                self._fail(f"a step failed on tensor-parallel rank 0 ({type(err).__name__}: {err})")
            raise RankFailure(self.failure) from err
        except BaseException:  # Ctrl-C in a step: the other ranks are out of step for good
            self._fail("a step on tensor-parallel rank 0 was interrupted")
            raise
        finally:
            self.idle.set()
        if self.failure is not None:  # a loss while the step ran voids its results
            raise RankFailure(self.failure)

    # --8<-- [end:guard]

    # --8<-- [start:close]
    def close(self) -> None:
        """Stop every rank: after a clean run, with rank 0's shutdown message and a wait for them
        to leave; after a loss, this node's ranks are killed already. Idempotent."""
        if self.closed:
            return
        self.closed = True
        self.stopped.set()  # ranks leaving from now on are not lost
        clean = self.failure is None and self.tp.size > 1
        if clean:
            try:
                self.tp.send_step(None)
                self._leave_groups(together=True)  # with the ranks, as they leave (close_groups)
                deadline = time.monotonic() + STOP_S
                while self.store.add(LEFT_KEY, 0) < self.spec.size - 1 and time.monotonic() < deadline:
                    time.sleep(POLL_S)  # ranks of other nodes are not our children: poll the store
            except Exception as err:
                log.warning("tensor-parallel shutdown: %s", err)
                clean = False
        for rank, proc in self.local.items():
            if clean:
                try:
                    proc.wait(STOP_S)
                    continue
                except subprocess.TimeoutExpired:
                    log.warning("tensor-parallel rank %d (pid %d) did not leave; killing it", rank, proc.pid)
            proc.kill()  # after a loss, or a start that failed
            proc.wait()
        if not clean:  # the ranks are gone: nobody to leave together with
            self._leave_groups(together=False)
        self.store = None  # the rendezvous stops: ranks of other nodes still waiting on it exit

    def _leave_groups(self, together: bool) -> None:
        try:
            close_groups(self.tp, together)
        except Exception as err:
            log.warning("leaving the process groups: %s", err)

    # --8<-- [end:close]


# --8<-- [start:serve_node]
def serve_node(size: int, nnodes: int, node_rank: int, address: str) -> int:
    """A node other than node 0: start this node's ranks, which meet node 0's at `address`, and wait
    until they exit. Every engine setting comes from node 0."""
    host, port = parse_address(address)
    store = open_store(host, port, is_server=False, timeout_s=START_TIMEOUT_S)
    spec: RankSpec = pickle.loads(store.get(SPEC_KEY))  # waits until node 0 has published it
    if (spec.size, spec.nnodes) != (size, nnodes):
        raise UserError(f"node 0 runs --tp {spec.size} --nnodes {spec.nnodes}; this node was started with "
                        f"--tp {size} --nnodes {nnodes}")  # fmt: skip
    per_node = spec.ranks_per_node
    first = node_rank * per_node
    threads = cpu_threads_per_rank(per_node) if spec.device_type == "cpu" else None
    procs = {
        rank: spawn_rank(host, port, rank, rank - first, threads) for rank in range(first, first + per_node)
    }
    log.info("node %d: ranks %d-%d started for %s", node_rank, first, first + per_node - 1, spec.folder)
    try:
        while procs:
            for rank, proc in list(procs.items()):
                code = proc.poll()
                if code == 0:
                    del procs[rank]
                elif code is not None:  # one failed: take the others down with it
                    log.error("%s; stopping this node's other ranks", describe_exit(rank, proc.pid, code))
                    return 1
            time.sleep(POLL_S)  # our children: nothing to wake us but polling
        return 0
    except KeyboardInterrupt:
        return 130
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# --8<-- [end:serve_node]
