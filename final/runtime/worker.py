"""A tensor-parallel rank other than rank 0, in its own process (started by runtime/ranks.py):

    python -m final.runtime.worker --store HOST:PORT --rank R --local-rank L

It reads rank 0's resolved config from the rendezvous store, builds the same executor from it
(engine/executor.py: its shard of the model, its own KV pool and decode graphs), and then runs
whatever step rank 0 sends, in the order it sends them, until rank 0 says stop: the executor's
own `follow` loop, which runs the one step method every rank runs. It schedules nothing and
samples nothing; rank 0's tokens reach it in that step's broadcast.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import pickle
import sys
import time
import traceback
from datetime import timedelta

import torch

from ..core.heap import freeze_startup_heap
from ..core.logs import setup_logging
from ..distributed.group import close_tp, init_tp, open_store, parse_address
from ..distributed.one_shot import wanted as one_shot_wanted
from ..distributed.step_channel import StepChannel
from ..engine.executor import Executor
from .lifeline import ignore_stop_signals
from .ranks import RankSpec
from .watchdog import (
    ENGINE_KEY,
    JOINED_KEY,
    LEFT_KEY,
    POLL_S,
    Heartbeat,
    failure_key,
    silence_limit,
    start_timeout,
)

log = logging.getLogger(__name__)


def run_rank(spec: RankSpec, store, rank: int, local_rank: int) -> None:
    config = spec.config
    if config.device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    # Meet the others before the rendezvous: its barrier has the collectives' timeout, and a
    # rank on another node may start much later than this one.
    store.add(JOINED_KEY, 1)
    deadline = time.monotonic() + start_timeout(config.dist_timeout)
    while store.add(JOINED_KEY, 0) < config.tp - 1:
        if time.monotonic() > deadline:
            raise TimeoutError("the other tensor-parallel ranks did not arrive")
        time.sleep(POLL_S)  # they announce themselves in the store: nothing to wait on but it
    one_shot = one_shot_wanted(device, config.tp, config.nnodes)
    tp = init_tp(store, rank, config.tp, device, config.dist_timeout, one_shot)
    try:
        executor = Executor(config, device, tp)
        freeze_startup_heap(f"tensor-parallel rank {rank}")  # a rank that pauses stalls them all
        steps = executor.follow(StepChannel(tp))
        log.debug("tensor-parallel rank %d: %d steps, shutting down", rank, steps)
        executor.release_graphs()  # before the groups go: a captured graph holds NCCL's work
    except BaseException:
        close_tp(tp, abort=True)  # the others will not meet this rank to leave together
        raise
    close_tp(tp)  # with rank 0 and the others, right after rank 0's shutdown message


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m final.runtime.worker", description=__doc__)
    parser.add_argument("--store", required=True, help="HOST:PORT of rank 0's rendezvous store")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--local-rank", type=int, required=True, help="this rank's index on its node")
    args = parser.parse_args(argv)
    # Ctrl-C in the terminal (or a group's SIGTERM) reaches every process of the group; rank 0 (or
    # the node's launcher) decides what it means, and stops us.
    ignore_stop_signals()
    multiprocessing.current_process().name = f"tp-rank-{args.rank}"  # the log lines' [name]
    host, port = parse_address(args.store)
    store = open_store(host, port, None, is_server=False, timeout_s=60)
    spec: RankSpec = pickle.loads(store.get(ENGINE_KEY))
    store.set_timeout(timedelta(seconds=start_timeout(spec.config.dist_timeout)))  # others may join late
    setup_logging(spec.log_level)
    timeout = silence_limit(spec.config.dist_timeout)
    heartbeat = Heartbeat(
        open_store(host, port, None, is_server=False, timeout_s=timeout), args.rank, os.getppid()
    )
    heartbeat.start()
    try:
        run_rank(spec, store, args.rank, args.local_rank)
    except BaseException as err:
        heartbeat.stop()
        log.error("tensor-parallel rank %d failed:\n%s", args.rank, traceback.format_exc())
        try:  # its last words, for rank 0's watchdog (the store is gone if rank 0 is)
            store.set(failure_key(args.rank), f"{type(err).__name__}: {err}")
        except Exception:
            pass
        return 1
    heartbeat.stop()
    store.add(LEFT_KEY, 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
