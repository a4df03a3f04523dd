"""A tensor-parallel rank other than rank 0, in a process of its own (ranks.py starts it):

    python -m stages.07_tensor_parallel.worker --store HOST:PORT --rank R --local-rank L

It reads what to build from the rendezvous store, loads its shard of the model, and then runs the
steps rank 0 sends, in the order it sends them, until rank 0 says stop. It schedules nothing and
samples nothing: per step it applies rank 0's page-table writes, runs its shard of the forward
pass (meeting the other ranks in every all-reduce), and writes rank 0's sampled tokens into its
own token table. That mirrors `LLM.launch` line for line, so every rank issues the same
collectives in the same order. A heartbeat thread proves the rank alive to rank 0's watchdog,
and ends the process when rank 0 is gone.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import logging
import os
import pickle
import signal
import sys
import threading
import traceback
from pathlib import Path

import torch

from stages.common.devices import DTYPES
from stages.common.model_config import load_model_config

from .distributed import TPInfo, close_groups, init_groups
from .ranks import (
    HEARTBEAT_S,
    JOINED_KEY,
    LEFT_KEY,
    SPEC_KEY,
    START_TIMEOUT_S,
    RankSpec,
    heartbeat_key,
    open_store,
    parse_address,
    report_failure,
    silence_limit,
)
from .runner import ModelRunner

log = logging.getLogger(__name__)


# --8<-- [start:follow]
def follow_steps(runner: ModelRunner, tp: TPInfo) -> int:
    """Run rank 0's steps until it shuts the engine down; returns how many ran."""
    steps = 0
    while (message := tp.receive_step()) is not None:
        for row, start, pages in message.page_writes:
            runner.page_table.write(row, start, pages)
        runner.forward(message.batch())  # every rank gets the logits; sampling them is rank 0's job
        rows = message.sampled_rows
        if rows:  # rank 0 sampled: its tokens are these rows' next inputs here too
            tokens = tp.broadcast(torch.empty(len(rows), dtype=torch.long, device=runner.device))
            runner.record_tokens(rows, tokens)
        steps += 1
    return steps


# --8<-- [end:follow]


def run_rank(spec: RankSpec, store, rank: int, local_rank: int) -> None:
    device = torch.device("cuda", local_rank) if spec.device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tp = init_groups(store, rank, spec.size, device, spec.dist_timeout)
    folder = Path(spec.folder)
    config = load_model_config(folder, spec.max_context)
    runner = ModelRunner(folder, config, device, DTYPES[spec.dtype], **spec.runner_args, tp=tp)
    steps = follow_steps(runner, tp)
    log.debug("%d steps, shutting down", steps)
    del runner
    gc.collect()  # a captured graph holds NCCL's work: free it before the process groups go
    close_groups(tp)


class Heartbeat(threading.Thread):
    """The rank's proof of life for rank 0's watchdog, and its way out when rank 0 is gone (the
    main thread may be blocked in a collective that will never complete)."""

    def __init__(self, store, rank: int):
        super().__init__(name=f"heartbeat-{rank}", daemon=True)
        self.store, self.rank, self.parent = store, rank, os.getppid()
        self.stopped = threading.Event()

    def start(self) -> None:
        self.store.add(heartbeat_key(self.rank), 1)  # the first beat before the rank announces itself
        super().start()

    def run(self) -> None:
        while not self.stopped.wait(HEARTBEAT_S):
            if os.getppid() != self.parent:
                self._exit("the process that started it is gone")
            try:
                self.store.add(heartbeat_key(self.rank), 1)
            except Exception as err:  # the store lives in rank 0's process
                if not self.stopped.is_set():
                    self._exit(f"rank 0 does not answer ({type(err).__name__}: {err})")

    def _exit(self, why: str) -> None:
        log.error("tensor-parallel rank %d exits: %s", self.rank, why)
        logging.shutdown()
        os._exit(1)

    def stop(self) -> None:
        self.stopped.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stages.07_tensor_parallel.worker", description=__doc__)
    parser.add_argument("--store", required=True, help="HOST:PORT of rank 0's rendezvous store")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--local-rank", type=int, required=True, help="the rank's index on its node")
    args = parser.parse_args(argv)
    # Ctrl-C in a terminal reaches every process of the group: rank 0 decides, and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    host, port = parse_address(args.store)
    store = open_store(host, port, is_server=False, timeout_s=START_TIMEOUT_S)
    spec: RankSpec = pickle.loads(store.get(SPEC_KEY))
    logging.basicConfig(level=spec.log_level, format=f"%(levelname)s [rank {args.rank}] %(message)s")
    # Its own connection, whose calls give up as soon as rank 0 would count this rank lost.
    beat_store = open_store(host, port, is_server=False, timeout_s=silence_limit(spec.dist_timeout))
    heartbeat = Heartbeat(beat_store, args.rank)
    heartbeat.start()
    store.add(JOINED_KEY, 1)
    try:
        run_rank(spec, store, args.rank, args.local_rank)
    except BaseException as err:
        heartbeat.stop()
        log.error("tensor-parallel rank %d failed:\n%s", args.rank, traceback.format_exc())
        with contextlib.suppress(Exception):  # the store is gone with rank 0
            report_failure(store, args.rank, err)
        return 1
    heartbeat.stop()
    store.add(LEFT_KEY, 1)
    return 0


if __name__ == "__main__":
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: after a failure it could wait on a dead peer's group
