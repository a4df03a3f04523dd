"""EngineCore: requests in, one scheduled step at a time, token ids out.

It is the engine without any I/O: the offline `LLM` drives it in-process, and the engine process
(process.py) drives it from ZMQ messages. It knows nothing of text: stop strings are applied by
the frontend, which calls `abort` when one matches.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..attention import resolve_names
from ..core.config import EngineConfig
from ..core.devices import DTYPES, pick_device, pick_dtype
from ..core.limits import finish_reason, max_new_tokens
from ..core.model_config import load_model_config
from ..core.sampling_params import SamplingParams
from ..engine import ModelRunner, make_generator, sample
from ..kvcache import KVCacheManager, create_prefix_cache
from ..models import resolve_model
from .messages import EngineInfo, EngineStats, RequestDelta
from .request import Request
from .scheduler import Scheduler

log = logging.getLogger(__name__)


class EngineCore:
    def __init__(self, config: EngineConfig, model_dir: Path | None = None):
        self.engine_config = config
        self.model_dir = Path(model_dir) if model_dir is not None else resolve_model(config.model)
        self.model_config = load_model_config(self.model_dir, config.max_seq_len_override)
        self.device = pick_device(config.device)
        self.dtype = pick_dtype(config.dtype, self.model_config.dtype, self.device)
        # Fail on a bad --attn or --cache before spending time on the weights.
        resolve_names(config.attn, self.device.type, self.dtype)
        prefix_cache = create_prefix_cache(config.cache, config.page_size)
        self.runner = ModelRunner(config, self.model_dir, self.model_config, self.device, self.dtype)
        self.kv = KVCacheManager(self.runner.num_pages, config.page_size, prefix_cache)
        self.scheduler = Scheduler(
            self.kv,
            self.runner.page_table,
            config.page_size,
            config.max_running_requests,
            config.max_prefill_length,
            config.chunk_policy,
        )
        self.eos_ids = set(self.model_config.eos_token_ids)
        self.stats = EngineStats(num_pages=self.runner.num_pages)

    @property
    def kv_capacity(self) -> int:
        return self.runner.num_pages * self.runner.page_size

    def info(self) -> EngineInfo:
        return EngineInfo(
            model_dir=str(self.model_dir), vocab_size=self.model_config.vocab_size,
            max_context=self.model_config.max_context, eos_token_ids=tuple(self.model_config.eos_token_ids),
            num_pages=self.runner.num_pages, page_size=self.runner.page_size, device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."), attn=self.runner.backend.name, cache=self.engine_config.cache,
        )  # fmt: skip

    def add_request(self, rid: int, prompt_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; a UserError says why it cannot be served (nothing is queued then)."""
        params.validate()
        budget = max_new_tokens(
            prompt_ids, params, self.model_config.max_context, self.model_config.vocab_size, self.kv_capacity
        )
        req = Request(
            rid=rid, prompt_ids=list(prompt_ids), params=params, max_new_tokens=budget,
            generator=make_generator(params, self.device),
        )  # fmt: skip
        self.scheduler.add(req)

    def abort(self, rid: int) -> bool:
        return self.scheduler.abort(rid)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestDelta]:
        """Run one batch; return one delta per request that sampled a token in it."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        logits = self.runner.forward(batch.step_input())
        work = list(zip(batch.requests, batch.query_lens, batch.sampled, strict=True))
        for req, q_len, sampled in work:
            if not sampled:
                req.num_computed += q_len  # a chunk of a cut prompt: its KV is in, no token yet
        done = [(req, q_len) for req, q_len, sampled in work if sampled]
        self.stats.num_steps += 1
        if not done:
            return []
        reqs = [r for r, _ in done]
        sampled = sample(logits, [r.params for r in reqs], [r.generator for r in reqs])
        tokens = sampled.tokens.tolist()  # the one sync per step: the host needs the tokens
        deltas: list[RequestDelta] = []
        for (req, q_len), token, logprobs in zip(done, tokens, sampled.logprobs, strict=True):
            completes_prefill = q_len > 1 or not req.output_ids  # (a full cache hit computes one token)
            req.num_computed += q_len
            req.output_ids.append(token)
            reason = finish_reason(token, req.params, self.eos_ids, len(req.output_ids), req.max_new_tokens)
            if reason:
                self.scheduler.finish(req)
            elif completes_prefill:
                # The prompt is in the pool now: requests that arrive while this one decodes reuse it.
                self.scheduler.cache_request(req)
            deltas.append(
                RequestDelta(
                    rid=req.rid,
                    token_ids=[token],
                    logprobs=None if logprobs is None else [logprobs],
                    finish_reason=reason,
                    cached_tokens=req.cached_tokens,
                )  # fmt: skip
            )
        self.stats.generated_tokens += len(tokens)
        return deltas

    def fail_all(self, message: str) -> list[RequestDelta]:
        """After an unexpected error in a step: drop every request, and say so to their clients."""
        rids = list(self.scheduler.by_rid)
        for rid in rids:
            self.abort(rid)
        return [RequestDelta(rid=rid, token_ids=[], finish_reason="error", error=message) for rid in rids]

    def snapshot(self, query_id: int = 0) -> EngineStats:
        s = self.stats
        s.query_id = query_id
        s.num_running, s.num_waiting = self.scheduler.num_running, self.scheduler.num_waiting
        s.free_pages, s.cached_pages = self.kv.num_free_pages, self.kv.prefix_cache.num_cached_pages
        s.prompt_tokens, s.cached_prompt_tokens = (
            self.scheduler.num_prompt_tokens,
            self.scheduler.num_cached_tokens,
        )
        s.num_preemptions = self.scheduler.num_preemptions
        return EngineStats(**vars(s))

    def check_integrity(self) -> None:
        """Free + cache-held + live requests' own pages == all pages, and the cache's locks are the
        live requests'; AssertionError otherwise (tests call it after every step)."""
        self.scheduler.check_integrity()


def validate_early(config: EngineConfig) -> None:
    """The checks that need no model: run them in the frontend before spawning anything."""
    config.validate()
    device = pick_device(config.device)
    dtype = DTYPES.get(config.dtype)  # None for auto, which is never float32 on CUDA
    resolve_names(config.attn, device.type, dtype)
    create_prefix_cache(config.cache, config.page_size)
