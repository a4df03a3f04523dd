"""A tensor-parallel rank other than rank 0, in its own process (started by engine/ranks.py):

    python -m final.engine.worker --store HOST:PORT --rank R --local-rank L

It reads what to build from the rendezvous store, loads its shard of the model, and then runs
whatever step rank 0 sends, in the order it sends them, until rank 0 says stop. It schedules
nothing and samples nothing: per step it applies rank 0's page-table writes, runs its shard of
the forward pass (meeting the other ranks in every all-reduce), and writes rank 0's sampled
tokens into its own device token table. That mirrors `EngineCore.launch` line for line, so
every rank issues the same collectives in the same order.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch

from ..core.devices import DTYPES
from ..core.logs import setup_logging
from ..core.model_config import load_model_config
from ..distributed import TPInfo
from ..distributed.group import close_tp, init_tp, open_store, parse_address
from ..distributed.step_channel import StepChannel
from .ranks import TOKEN_DTYPE, RankSpec
from .runner import ModelRunner
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


def follow_steps(runner: ModelRunner, channel: StepChannel, tp: TPInfo) -> int:
    """Run rank 0's steps until it shuts down; returns how many ran."""
    steps = 0
    while (message := channel.receive()) is not None:
        runner.page_table.queue_writes(*message.page_writes)
        runner.forward(message.step)  # its logits are rank 0's business
        sampled = sum(message.step.sampled)
        if sampled:
            tokens = torch.empty(sampled, dtype=TOKEN_DTYPE, device=runner.device)
            runner.record_tokens(tp.broadcast(tokens))
        steps += 1
    return steps


def run_rank(spec: RankSpec, store, rank: int, local_rank: int) -> None:
    config = spec.config
    if spec.device_type == "cuda":
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
    tp = init_tp(store, rank, config.tp, device, config.dist_timeout)
    try:
        folder = Path(spec.model_dir)
        model_config = load_model_config(folder, config.max_seq_len_override)
        runner = ModelRunner(config, folder, model_config, device, DTYPES[spec.dtype], tp)
        steps = follow_steps(runner, StepChannel(tp), tp)
        log.debug("tensor-parallel rank %d: %d steps, shutting down", rank, steps)
        runner.release_graphs()
    finally:
        close_tp(tp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m final.engine.worker", description=__doc__)
    parser.add_argument("--store", required=True, help="HOST:PORT of rank 0's rendezvous store")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--local-rank", type=int, required=True, help="this rank's index on its node")
    args = parser.parse_args(argv)
    # Ctrl-C in the terminal reaches every process of the group; rank 0 (or the node's launcher)
    # decides what it means, and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
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
