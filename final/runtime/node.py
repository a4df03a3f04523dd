"""`python -m final --node-rank K` (K > 0) under a multi-node --tp: this node runs no engine, only
its share of the ranks, which join node 0's at --dist-init-addr and take every engine setting from
node 0's published spec (ranks.py)."""

from __future__ import annotations

import logging
import pickle
import subprocess
import time

from ..core.config import EngineConfig
from ..core.errors import UserError
from ..distributed.group import open_store, parse_address
from .ranks import RankSpec, cpu_threads_per_rank, spawn_rank
from .watchdog import ENGINE_KEY, POLL_S, describe_exit, start_timeout

log = logging.getLogger(__name__)


def serve_node(config: EngineConfig) -> int:
    """`python -m final --node-rank K` (K > 0): start this node's ranks, which join node 0's at
    --dist-init-addr, and wait until they exit. The engine flags come from node 0."""
    assert config.dist_init_addr is not None and config.node_rank > 0
    host, port = parse_address(config.dist_init_addr)
    log.info("node %d of %d: waiting for node 0 at %s:%d", config.node_rank, config.nnodes, host, port)
    store = open_store(host, port, config.tp, is_server=False, timeout_s=start_timeout(config.dist_timeout))
    spec: RankSpec = pickle.loads(store.get(ENGINE_KEY))  # waits until node 0 has published it
    if (spec.config.tp, spec.config.nnodes) != (config.tp, config.nnodes):
        raise UserError(
            f"node 0 runs --tp {spec.config.tp} --nnodes {spec.config.nnodes}; this node was started "
            f"with --tp {config.tp} --nnodes {config.nnodes}"
        )
    per_node = config.ranks_per_node
    first = config.node_rank * per_node
    threads = cpu_threads_per_rank(spec.config)
    procs = {
        rank: spawn_rank(host, port, rank, rank - first, threads) for rank in range(first, first + per_node)
    }
    names = f"rank {first}" if per_node == 1 else f"ranks {first}-{first + per_node - 1}"
    log.info("node %d: %s started for %s", config.node_rank, names, spec.config.model_dir)
    try:
        return _supervise(procs)
    except KeyboardInterrupt:
        log.info("node %d: interrupted; stopping its ranks", config.node_rank)
        _kill(procs)
        return 130


def _supervise(procs: dict[int, subprocess.Popen]) -> int:
    """Wait for every rank; the first one that fails takes the others down with it."""
    running = dict(procs)
    while running:
        for rank, proc in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            del running[rank]
            if code != 0:
                log.error("%s; stopping this node's other ranks", describe_exit(rank, proc.pid, code))
                _kill(running)
                return 1
        time.sleep(POLL_S)  # children of this process: nothing to wake us but polling
    return 0


def _kill(procs: dict[int, subprocess.Popen]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()
