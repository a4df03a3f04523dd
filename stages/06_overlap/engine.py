"""The engine: requests in, one scheduled step at a time, finished outputs out.

`LLM.generate(prompts)` is the offline API; `add_request`, `step` and `abort` are what a server (or
a test that adds requests while others run) drives directly. `cache="radix"` (the default) reuses
the KV of shared prompt prefixes; `cache="naive"` recomputes every prompt, as stage 02 does. A step
computes at most `max_prefill_length` prompt tokens: longer prompts are prefilled in chunks. On a
GPU, decode steps of up to `cuda_graph_max_bs` requests replay CUDA graphs (None: automatic; 0: off).

A step is schedule -> launch -> process. `launch` queues the forward pass and the sampling on the
GPU, writes the sampled tokens into the runner's token table and starts their copy to the host; it
does not wait. `process` waits for those tokens and does the host's bookkeeping: append, stop
checks, detokenize, finish (a finished request's prompt and answer go to the prefix cache). Without overlap (`disable_overlap=True`, or
STAGE06_DISABLE_OVERLAP=1) a step is process(launch(schedule())), and the GPU idles while the host
processes and schedules. With overlap (the default on a GPU; on a CPU, where `launch` returns with
the step done and nothing can overlap, only with `disable_overlap=False` or STAGE06_DISABLE_OVERLAP=0,
as final/'s `--overlap auto`), `step` schedules and launches step N+1 first and processes step N
while N+1 runs. What keeps that correct:

1. One step in flight at most, and everything on one CUDA stream: a step reads what every
   earlier step wrote (K and V, the page table, the token table), and nothing later. So a prompt
   enters the prefix cache when the step that computes its end is launched, and a request
   scheduled next may reuse it at once.
2. Step N+1 is scheduled before step N's tokens reach the host: such a token is pending
   (`Request.num_pending`), and step N+1 reads it from the token table on the device.
3. A request that finishes at step N (EOS, stop token or string, length, abort) may sit in step
   N+1: its token from N+1 is dropped, and its pages, page-table row and cache locks go back only
   when N+1 is known complete (`Scheduler.retiring`). Nothing is freed under a running step.
4. A finish or an abort of a request that is gone already does nothing: no double free.
5. A request whose last allowed token is in flight is not scheduled again.
6. A preemption never happens while a step is in flight: the scheduler raises NeedsDrain, the
   engine processes that step first, then schedules again.
7. The launch path never waits for the GPU: host-to-device copies go through pinned memory, and
   the attention backend waits only for its previous plan's copy (stage 05's syncs are gone).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tqdm import tqdm

from stages.common.devices import pick_device, pick_dtype, to_host
from stages.common.errors import UserError
from stages.common.limits import finish_reason, max_new_tokens
from stages.common.model_config import load_model_config
from stages.common.model_source import resolve_model
from stages.common.outputs import RequestOutput
from stages.common.sampling import Logprobs, SamplingParams, sample_on_device
from stages.common.tokenizer import TextStream, Tokenizer

from .radix_cache import CACHES
from .request import Batch, Request, Status
from .runner import ModelRunner
from .scheduler import DEFAULT_MAX_PREFILL_LENGTH, POLICIES, NeedsDrain, Scheduler

DISABLE_OVERLAP_ENV = "STAGE06_DISABLE_OVERLAP"  # =1: the benchmark's switch, as --disable-overlap

Prompt = str | Sequence[int]


# --8<-- [start:launched]
@dataclass
class Launched:
    """A step on its way through the GPU: what `process` needs once it is complete."""

    requests: list[Request]  # the requests that get a token from it, in the order of `tokens`
    tokens: torch.Tensor | None  # on the host (pinned), valid once `done` has fired
    logprobs: Logprobs | None  # likewise
    done: torch.cuda.Event | None  # recorded after the copies; None on a CPU (done already)

    def wait(self) -> list[int]:
        if self.done is not None:
            self.done.synchronize()  # the only wait of a step: for its own tokens
        return [] if self.tokens is None else self.tokens.tolist()


# --8<-- [end:launched]


class LLM:
    """Offline API: `LLM(model).generate(prompts, SamplingParams(...))`, batched continuously."""

    def __init__(
        self, model: str | None = None, device: str = "auto", dtype: str = "auto", *, attn: str = "torch",
        page_size: int = 1, num_pages: int | None = None, memory_ratio: float = 0.9,
        max_running_requests: int = 256, max_context: int | None = None, cache: str = "radix",
        max_prefill_length: int = DEFAULT_MAX_PREFILL_LENGTH, chunk_policy: str = "mixed",
        cuda_graph_max_bs: int | None = None, disable_overlap: bool | None = None,
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
        if disable_overlap is None and os.environ.get(DISABLE_OVERLAP_ENV, ""):
            disable_overlap = os.environ[DISABLE_OVERLAP_ENV] != "0"
        if disable_overlap is None:  # auto, as final/'s: only a GPU runs a step while the host works
            disable_overlap = self.device.type != "cuda"
        self.overlap = not disable_overlap
        self.in_flight: Launched | None = None  # the step launched and not yet processed

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
        return self.scheduler.has_work() or self.in_flight is not None

    def abort(self, rid: int) -> bool:
        """Drop a request wherever it is; its output is never returned. False if it is not here
        (finished already, or unknown): then nothing happens. If the step in flight holds it, its
        pages wait for that step, and the token it gets there is dropped."""
        return self.scheduler.abort(rid, defer_release=self.in_flight is not None)

    # --8<-- [start:step]
    def step(self) -> list[tuple[int, RequestOutput]]:
        """Run one step; return the requests that finished (with overlap: in the step before)."""
        if not self.overlap:
            batch = self.scheduler.schedule()
            return [] if batch is None else self.process(self.launch(batch))
        finished = []
        try:
            batch = self.scheduler.schedule(can_preempt=self.in_flight is None)
        except NeedsDrain:  # the pool ran dry: complete the step in flight, then preempt
            previous, self.in_flight = self.in_flight, None
            finished += self.process(previous)
            batch = self.scheduler.schedule()
        previous, self.in_flight = self.in_flight, (self.launch(batch) if batch else None)
        if previous is not None:
            finished += self.process(previous)  # step N's results, while step N+1 runs
        return finished

    # --8<-- [end:step]

    # --8<-- [start:launch]
    def launch(self, batch: Batch) -> Launched:
        """Queue the step's forward pass and sampling on the GPU; do not wait for them."""
        logits = self.runner.forward(batch)
        sampled = []
        for req, q_len, gets_token in zip(batch.requests, batch.query_lens, batch.sampled, strict=True):
            # The end of its prompt: more than one token, or a first token (a full cache hit
            # computes just one).
            completes_prefill = gets_token and (q_len > 1 or req.num_generated == 0)
            req.num_computed += q_len  # its K and V are written by this step
            if gets_token:  # (a chunk cut mid-prompt gets none)
                sampled.append(req)
                req.num_pending += 1
            if completes_prefill:
                # Requests scheduled from now on may reuse the prompt: the steps that read it run
                # after this one, which writes it. (Duplicates it drops wait for this step.)
                self.scheduler.cache_request(req, defer_release=True)
        if not sampled:
            return Launched([], None, None, None)
        tokens, logprobs = sample_on_device(
            logits, [r.params for r in sampled], [r.generator for r in sampled]
        )
        self.runner.record_tokens([r.row for r in sampled], tokens)  # the next step's inputs
        # Start the copies to the host; an event says when they (and so the step) are done.
        host_tokens, host_logprobs = to_host(tokens), logprobs.to_host() if logprobs else None
        done = None
        if tokens.is_cuda:
            done = torch.cuda.Event()
            done.record()
        return Launched(sampled, host_tokens, host_logprobs, done)

    # --8<-- [end:launch]

    # --8<-- [start:process]
    def process(self, launched: Launched) -> list[tuple[int, RequestOutput]]:
        """Wait for a launched step's tokens, then do the host's work: append each token, check
        stops, detokenize, finish requests (their prompt and answer go to the prefix cache).
        Returns the finished requests."""
        tokens = launched.wait()
        # That step is complete: what requests that left while it ran still held can go back.
        self.scheduler.release_retired()
        entries = launched.logprobs.entries() if launched.logprobs else [None] * len(tokens)
        defer = self.in_flight is not None  # the next step runs already, and may hold these requests
        now = time.perf_counter()
        finished = []
        for req, token, logprobs in zip(launched.requests, tokens, entries, strict=True):
            req.num_pending -= 1
            if req.status is Status.FINISHED:
                continue  # finished or aborted after this step was launched: the token is dropped
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
                self.scheduler.finish(req, defer_release=defer)
                finished.append((req.rid, out))
        return finished

    # --8<-- [end:process]

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
