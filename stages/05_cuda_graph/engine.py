"""The engine: requests in, one scheduled step at a time, finished outputs out.

`LLM.generate(prompts)` is the offline API; `add_request` and `step` are what a server (or a test
that adds requests while others run) drives directly. `cache="radix"` (the default) reuses the KV
of shared prompt prefixes; `cache="naive"` recomputes every prompt, as stage 02 does. A step
computes at most `max_prefill_length` prompt tokens: longer prompts are prefilled in chunks. On a
GPU, decode steps of up to `cuda_graph_max_bs` requests replay CUDA graphs (None: automatic; 0: off).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tqdm import tqdm

from stages.common.devices import pick_device, pick_dtype
from stages.common.errors import UserError
from stages.common.limits import finish_reason, max_new_tokens
from stages.common.model_config import load_model_config
from stages.common.model_source import resolve_model
from stages.common.outputs import RequestOutput
from stages.common.sampling import SamplingParams, sample
from stages.common.tokenizer import TextStream, Tokenizer

from .radix_cache import CACHES
from .request import Request
from .runner import ModelRunner
from .scheduler import DEFAULT_MAX_PREFILL_LENGTH, POLICIES, Scheduler

Prompt = str | Sequence[int]


class LLM:
    """Offline API: `LLM(model).generate(prompts, SamplingParams(...))`, batched continuously."""

    def __init__(
        self, model: str | None = None, device: str = "auto", dtype: str = "auto", *, attn: str = "torch",
        page_size: int = 1, num_pages: int | None = None, memory_ratio: float = 0.9,
        max_running_requests: int = 256, max_context: int | None = None, cache: str = "radix",
        max_prefill_length: int = DEFAULT_MAX_PREFILL_LENGTH, chunk_policy: str = "mixed",
        cuda_graph_max_bs: int | None = None,
    ):  # fmt: skip
        folder = resolve_model(model)
        self.config = load_model_config(folder, max_context)
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.config.dtype, self.device)
        self.tokenizer = Tokenizer(folder)
        if max_running_requests < 1:
            raise UserError(f"--max-running-requests must be >= 1, got {max_running_requests}")
        if max_prefill_length < 1:
            raise UserError(f"--max-prefill-length must be >= 1, got {max_prefill_length}")
        if chunk_policy not in POLICIES:
            raise UserError(f"unknown chunk policy {chunk_policy!r}; choose from {', '.join(POLICIES)}")
        if cache not in CACHES:
            raise UserError(f"unknown prefix cache {cache!r}; choose from {', '.join(CACHES)}")
        if cuda_graph_max_bs is not None and cuda_graph_max_bs < 0:
            raise UserError(f"--cuda-graph-max-bs must be >= 0 (0 turns graphs off), got {cuda_graph_max_bs}")
        self.runner = ModelRunner(
            folder, self.config, self.device, self.dtype, attn=attn, page_size=page_size, num_pages=num_pages,
            memory_ratio=memory_ratio, max_running=max_running_requests, cuda_graph_max_bs=cuda_graph_max_bs,
        )  # fmt: skip
        prefix_cache = CACHES[cache](page_size)
        self.scheduler = Scheduler(
            self.runner.allocator, self.runner.page_table, page_size, max_running_requests, prefix_cache,
            max_prefill_length=max_prefill_length, policy=chunk_policy,
        )  # fmt: skip
        self.eos_ids = set(self.config.eos_token_ids)
        self.next_rid = 0

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None) -> int:
        params = params or SamplingParams()
        params.validate()
        ids = self.tokenizer.encode_prompt(prompt, chat=False) if isinstance(prompt, str) else list(prompt)
        max_new = max_new_tokens(ids, params, self.config.max_context, self.config.vocab_size)
        capacity = self.runner.allocator.num_pages * self.runner.page_size
        if len(ids) + max_new > capacity:
            raise UserError(
                f"the request needs up to {len(ids) + max_new} tokens of KV cache but the pool holds "
                f"{capacity}: lower max_tokens or raise --num-pages"
            )
        req = Request(
            rid=self.next_rid, prompt_ids=ids, params=params, max_new_tokens=max_new,
            stream=TextStream(self.tokenizer, ids, params.stop), generator=params.make_generator(self.device),
        )  # fmt: skip
        self.next_rid += 1
        self.scheduler.add(req)
        return req.rid

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # --8<-- [start:step]
    def step(self) -> list[tuple[int, RequestOutput]]:
        """Run one batch; return the requests that finished in it."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        logits = self.runner.forward(batch)
        work = list(zip(batch.requests, batch.query_lens, batch.sampled, strict=True))
        for req, q_len, gets_token in work:
            if not gets_token:
                req.num_computed += q_len  # a chunk of a cut prompt: its KV is in, no token yet
        done = [(req, q_len) for req, q_len, gets_token in work if gets_token]
        if not done:
            return []
        sampled = sample(logits, [r.params for r, _ in done], [r.generator for r, _ in done])
        tokens = sampled.tokens.tolist()  # the one sync per step: the host needs the tokens
        now = time.perf_counter()
        finished = []
        for (req, q_len), token, logprobs in zip(done, tokens, sampled.logprobs, strict=True):
            completes_prefill = q_len > 1 or not req.output_ids  # (a full cache hit computes one token)
            req.num_computed = req.seq_len
            req.output_ids.append(token)
            out = req.output
            if logprobs is not None:
                out.logprobs.append(logprobs)
            out.token_times.append(now - req.arrival)
            if len(req.output_ids) == 1:
                out.ttft_s = now - req.arrival
            _, hit_stop = req.stream.push([token])
            out.finish_reason = finish_reason(
                token, req.params, self.eos_ids, len(req.output_ids), req.max_new_tokens, hit_stop
            )
            if out.finish_reason:
                if not hit_stop:
                    req.stream.finish()
                out.token_ids, out.text, out.latency_s = req.output_ids, req.stream.text, now - req.arrival
                self.scheduler.finish(req)
                finished.append((req.rid, out))
            elif completes_prefill:
                # The prompt is in the pool now: requests that arrive while this one decodes reuse it.
                self.scheduler.cache_request(req)
        return finished

    # --8<-- [end:step]

    def generate(
        self, prompts: Sequence[Prompt], params: SamplingParams | Sequence[SamplingParams] | None = None,
        progress: bool = False,
    ) -> list[RequestOutput]:  # fmt: skip
        params = params or SamplingParams()
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        order = {
            self.add_request(p, sp): i for i, (p, sp) in enumerate(zip(prompts, per_prompt, strict=True))
        }
        results: list[RequestOutput | None] = [None] * len(prompts)
        with tqdm(total=len(prompts), disable=not progress, desc="generate", unit="req") as bar:
            while self.has_unfinished():
                for rid, out in self.step():
                    results[order[rid]] = out
                    bar.update(1)
        return results  # type: ignore[return-value]
