"""The engine's counters, apart from the loop that bumps them, and the snapshot a StatsQuery
(the server's /metrics) gets: the counters plus what the scheduler and the KV cache hold now."""

from __future__ import annotations

from ..scheduler.scheduler import Scheduler
from .messages import EngineStats


class EngineCounters:
    def __init__(self, num_pages: int):
        self.num_pages = num_pages
        self.num_steps = 0  # steps launched
        self.generated_tokens = 0  # tokens handed to requests

    def snapshot(self, scheduler: Scheduler, query_id: int = 0) -> EngineStats:
        kv = scheduler.kv
        return EngineStats(
            query_id=query_id,
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            num_pages=self.num_pages,
            free_pages=kv.num_free_pages,
            cached_pages=kv.prefix_cache.num_cached_pages,
            prompt_tokens=scheduler.num_prompt_tokens,
            cached_prompt_tokens=scheduler.num_cached_tokens,
            generated_tokens=self.generated_tokens,
            num_preemptions=scheduler.num_preemptions,
            num_steps=self.num_steps,
        )
