"""build_engine: the one place that assembles an engine from what the user asked for.

    resolve   EngineConfig -> ResolvedConfig: every choice made once (engine/resolve.py)
    ranks     under --tp N, the other ranks started and met (ranks.py); nothing at --tp 1
    executor  the model loaded, the decode graphs captured, the KV pool sized (engine/executor.py)
    kv        the KV cache manager over the executor's pool, with the --cache prefix cache
    scheduler with the --chunk-policy policy
    core      EngineCore, the loop over them

The other ranks build their executor from the same ResolvedConfig (worker.py), never from the
user's config again.
"""

from __future__ import annotations

import logging
import weakref
from pathlib import Path

import torch

from ..core.config import EngineConfig
from ..core.devices import set_cpu_threads
from ..engine.core import EngineCore
from ..engine.executor import Executor
from ..engine.peers import NO_PEERS, SingleRank
from ..engine.resolve import resolve_config
from ..kvcache.manager import KVCacheManager
from ..kvcache.registry import create_prefix_cache
from ..scheduler.policy import create_policy
from ..scheduler.scheduler import Scheduler
from .ranks import RankGroup

log = logging.getLogger(__name__)


def build_engine(config: EngineConfig, model_dir: Path | None = None) -> EngineCore:
    """A ready engine for `config` (left as it is); `model_dir` when --model is resolved already.
    A UserError says what cannot work, before the weights are read where it can."""
    resolved = resolve_config(config, model_dir)
    if resolved.device.type == "cpu":  # one rule everywhere (core/devices.py); each rank its share
        log.info(set_cpu_threads(resolved.threads, resolved.ranks_per_node))
    if resolved.seed is not None:
        torch.manual_seed(resolved.seed)  # rank 0 alone samples
    if resolved.tp == 1:
        executor = Executor(resolved, resolved.device)
        ranks = None
    else:  # this process is rank 0; the others run in processes of their own
        ranks = RankGroup.start(resolved)
        try:
            with ranks.guard():
                executor = Executor(resolved, resolved.device, ranks.tp, ranks.channel or NO_PEERS)
        except BaseException:
            ranks.close()
            raise
    runner = executor.runner
    prefix_cache = create_prefix_cache(resolved.cache, resolved.page_size)
    kv = KVCacheManager(runner.num_pages, resolved.page_size, prefix_cache, runner.page_table)
    policy = create_policy(resolved.chunk_policy)
    scheduler = Scheduler(kv, resolved.max_running_requests, resolved.max_prefill_length, policy)
    core = EngineCore(resolved, executor, scheduler, ranks or SingleRank())
    if ranks is not None:
        # Whoever drops the engine without closing it (an LLM at exit) still stops the ranks.
        core.closer = weakref.finalize(core, _close_engine, executor, ranks)
    return core


def _close_engine(executor: Executor, ranks: RankGroup) -> None:
    executor.release_graphs()  # before the process groups: a graph holds NCCL's work
    ranks.close()
