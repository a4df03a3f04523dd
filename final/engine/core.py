"""EngineCore: requests in, one scheduled step at a time, token ids out: the schedule -> launch
-> collect loop, and nothing else (runtime/build.py assembles its parts).

It is the engine without any I/O: the offline `LLM` drives it in-process, and the engine process
(runtime/process.py) drives it from ZMQ messages. It knows nothing of text: stop strings are
applied by the frontend, which calls `abort` when one matches.

A step is two calls. `launch(batch)` has the executor run the forward pass, sample on the device,
write the tokens into the token table (the next decode step's inputs) and start their copy to the
host, without waiting. `collect(handle)` waits for the tokens and does the bookkeeping: outputs,
finish checks. A step gives each sampled request a list of tokens: one today, up to k for an
executor that speculates (`Executor.tokens_per_step`).

Without overlap, `step` is `collect(launch(schedule()))`: the GPU idles while the host collects
step N and schedules and prepares step N+1. With overlap (stage 06; on by default on a GPU),
`step` schedules and launches step N+1 *before* collecting step N, so the host's work hides
behind the GPU's. The invariants that make that safe:

1. One step in flight at most, and every device access (copies, kernels, graph replays, the
   attention plan's copies) on one stream: step N+1 cannot read or write before step N is done.
2. Step N+1 is scheduled before step N's tokens are known: a request's token from step N is
   pending (`Request.num_pending`), and its decode input is read from the device token table.
3. A request that finishes at step N (EOS, length, stop string, abort) may already sit in step
   N+1: its token from N+1 is dropped, and its pages go back to the pool only once N+1 is known
   complete (`Scheduler.retiring`, released when the next step is collected), never under a
   running step. A finish or abort of a request already gone is a no-op (no double free).
4. A request that used up max_tokens is not scheduled again while its last token is in flight.
5. A preemption never happens with a step in flight (its victim's pages and pending token are the
   step's): the scheduler raises NeedsDrain, the in-flight step is collected, and it schedules
   again. Pool exhaustion is rare, so this costs a bubble rarely.
6. The attention backend's host staging buffers (FlashInfer's plan) are not rewritten before the
   previous step's copy from them has run (the backend waits on an event).
7. Step N may be collected *during* step N+1's launch, between its layers, once it is done
   (delivery.py: the engine process publishes its tokens without waiting for an eager launch).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import torch

from ..core.errors import UserError
from ..core.limits import finish_reason, max_new_tokens
from ..core.sampling_params import SamplingParams
from ..scheduler.request import Request, ScheduledBatch, Status
from ..scheduler.scheduler import NeedsDrain, Scheduler
from .delivery import early_delivery
from .executor import Executor
from .handle import StepHandle
from .logprobs import to_host
from .messages import EngineInfo, EngineStats, RequestDelta
from .peers import Ranks, SingleRank
from .resolve import ResolvedConfig
from .sampler import Sampler
from .stats import EngineCounters

log = logging.getLogger(__name__)


class EngineCore:
    def __init__(
        self,
        config: ResolvedConfig,
        executor: Executor,
        scheduler: Scheduler,
        ranks: Ranks | None = None,
    ):
        self.config, self.executor, self.scheduler = config, executor, scheduler
        self.model_config, self.model_dir = config.model, config.model_dir
        self.kv = scheduler.kv
        self.sampler: Sampler = executor.sampler
        self.ranks: Ranks = ranks or SingleRank()
        self.closer: Callable[[], object] = self.ranks.close  # build_engine may wrap it (weakref.finalize)
        self.eos_ids = set(config.model.eos_token_ids)
        self.stats = EngineCounters(num_pages=executor.runner.num_pages)
        self.overlap = config.overlap
        self.in_flight: deque[StepHandle] = deque()  # launched, not yet collected (at most one)
        self.failed_alone: list[RequestDelta] = []  # requests dropped alone since the last step returned
        self.tokens_ready_at = 0.0  # monotonic time the last collected step's tokens reached the host
        self.collected_decode_only = False  # that step computed no prompt tokens (a decode step)
        self.publish: Callable[[list[RequestDelta]], None] | None = None  # sends deltas at once (process.py)

    @property
    def device(self) -> torch.device:
        return self.config.device

    @property
    def dtype(self) -> torch.dtype:
        return self.config.dtype

    def info(self) -> EngineInfo:
        runner = self.executor.runner
        return EngineInfo.of(self.config, runner.num_pages, runner.backend.name)

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> int:
        """A UserError saying why a request cannot be served, without queueing it; else how many
        tokens it may generate."""
        params.validate()
        Sampler.check(params)
        return max_new_tokens(
            prompt_ids,
            params.max_tokens,
            self.model_config.max_context,
            self.model_config.vocab_size,
            self.kv.capacity,
        )

    def add_request(self, rid: int, prompt_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; a UserError says why it cannot be served (nothing is queued then)."""
        cap = self.check_request(prompt_ids, params)
        if rid in self.scheduler.by_rid:  # before the sampler takes the id: it holds the other one's state
            raise UserError(f"request id {rid} is already in the engine")
        self.sampler.add(rid, params)  # first: a seed or a grammar that cannot be used queues nothing
        self.scheduler.add(Request(rid=rid, prompt_ids=list(prompt_ids), params=params, max_new_tokens=cap))

    def abort(self, rid: int) -> bool:
        """Drop a request wherever it is; if a step in flight holds it, its pages wait for that step."""
        self.sampler.forget(rid)
        return self.scheduler.abort(rid, defer_release=bool(self.in_flight))

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self.in_flight)

    @property
    def failed(self) -> bool:
        """A tensor-parallel rank was lost: every step from now on raises RankFailure."""
        return self.ranks.failure is not None

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do with one rank). Idempotent."""
        self.closer()

    # --8<-- [start:loop]
    def step(self) -> list[RequestDelta]:
        """One iteration of the loop; one delta per request that got tokens (or finished), and
        an error delta per request that failed alone."""
        with self.ranks.guard():  # a lost tensor-parallel rank fails the step (a no-op at --tp 1)
            deltas = self._overlapped_step() if self.overlap else self._serial_step()
        if self.failed_alone:
            deltas, self.failed_alone = self.failed_alone + deltas, []
        return deltas

    def _serial_step(self) -> list[RequestDelta]:
        batch = self.scheduler.schedule()
        return [] if batch is None else self.collect(self.launch(batch))

    def _overlapped_step(self) -> list[RequestDelta]:
        """Step N+1 is scheduled and launched before step N is collected (the invariants above)."""
        # A grammar needs a request's last token before it masks the next (structured.py).
        deltas = self.collect(self.in_flight.popleft()) if self.in_flight and self.sampler.matchers else []
        try:
            batch = self.scheduler.schedule(can_preempt=not self.in_flight)
        except NeedsDrain:  # the pool ran dry: collect the step in flight, then preempt
            deltas += self.collect(self.in_flight.popleft())
            batch = self.scheduler.schedule()
        if batch is not None:  # step N+1 is on its way (step N delivered during it, if it can be) ...
            early = early_delivery(self.in_flight, self.collect, self.publish)
            self.in_flight.append(self.launch(batch, early))
        if len(self.in_flight) > 1 or (batch is None and self.in_flight):
            deltas += self.collect(self.in_flight.popleft())  # ... while step N is collected
        return deltas

    # --8<-- [end:loop]

    def launch(self, batch: ScheduledBatch, between_layers: Callable[[], None] | None = None) -> StepHandle:
        """Run the step's forward pass and sampling on the device; do not wait for them."""
        batch = self._admit_rows(batch)
        if not batch.requests:
            return StepHandle(batch, [], None, None, None)
        step = batch.step_input()
        pending = self.executor.tokens_per_step
        sampled: list[Request] = []
        prompts_done: list[Request] = []
        for req, q_len, is_sampled in zip(batch.requests, batch.query_lens, batch.sampled, strict=True):
            req.num_computed += q_len  # a chunk of a cut prompt: its KV is in, no token yet
            if is_sampled:
                sampled.append(req)
                # The prompt is in the pool now (a full cache hit computes just one token).
                if q_len > 1 or req.num_generated == 0:
                    prompts_done.append(req)
                req.num_pending += pending
                req.last_token_on_device = True  # the executor writes it into the request's row
        # The other ranks (if any) get the step first; then every rank runs it, rank 0 samples.
        out = self.executor.launch(step, sampled, between_layers)
        for req in prompts_done:
            # The prompt's K and V are being written by this step, and every later step runs after
            # it on the one stream: the cache can offer them now. Waiting for `collect` would let
            # the step scheduled meanwhile (overlap) miss them and compute them again.
            self.scheduler.cache_request(req)
        self.stats.num_steps += 1
        if out is None:  # nothing sampled (a prompt cut mid-way)
            return StepHandle(batch, [], None, None, None)
        # Tokens (and logprobs) go to pinned host memory behind the step's kernels; `collect` waits
        # for this one event, never for the whole stream (which would include the next step).
        tokens, done = to_host(out.tokens.view(len(sampled), -1)), None
        logprobs = out.logprobs.to_host() if out.logprobs is not None else None
        if out.tokens.is_cuda:
            done = torch.cuda.Event()
            done.record()
        return StepHandle(batch, sampled, tokens, done, logprobs, pending, decode_only=not step.is_prefill)

    def _admit_rows(self, batch: ScheduledBatch) -> ScheduledBatch:
        """The sampler stores the parameters of requests new to their row; one it cannot store fails
        alone (it leaves the batch, its pages go back, its client gets an error)."""
        failed = self.sampler.bind(batch.requests)
        if not failed:
            return batch
        for req, err in failed:
            log.error("request %d: cannot store its sampling parameters: %r", req.rid, err)
            self._fail_request(req, f"invalid sampling parameters: {type(err).__name__}: {err}")
        dropped = {id(req) for req, _ in failed}
        keep = [i for i, req in enumerate(batch.requests) if id(req) not in dropped]
        requests, query_lens = [batch.requests[i] for i in keep], [batch.query_lens[i] for i in keep]
        return ScheduledBatch(
            requests=requests, query_lens=query_lens, sampled=[batch.sampled[i] for i in keep]
        )

    def _fail_request(self, req: Request, message: str) -> None:
        """Drop one running request that cannot go on; the next `step` reports it."""
        self.scheduler.finish(req, defer_release=bool(self.in_flight))
        self.sampler.forget(req.rid)
        self.failed_alone.append(
            RequestDelta(
                rid=req.rid, token_ids=[], finish_reason="error", error=message, error_code="invalid_request"
            )
        )

    def collect(self, handle: StepHandle) -> list[RequestDelta]:
        """Wait for a launched step's tokens; append them, finish and cache requests; one delta per
        sampled request still alive."""
        per_request = handle.wait()
        self.tokens_ready_at = time.monotonic()
        self.collected_decode_only = handle.decode_only
        # That step is complete: pages of requests that finished while it ran can go back.
        self.scheduler.release_retired()
        entries = handle.logprobs.entries() if handle.logprobs is not None else [None] * len(per_request)
        deltas: list[RequestDelta] = []
        eos_ids, pending, matchers = self.eos_ids, handle.pending, self.sampler.matchers
        one = pending == 1  # one token each (every step but a speculative one): no inner loop
        for req, tokens, entry in zip(handle.sampled, per_request, entries, strict=True):
            req.num_pending -= pending
            if req.status is Status.FINISHED:
                continue  # finished (or aborted) after this step was launched: its tokens are dropped
            if one:
                token = tokens[0]
                req.output_ids.append(token)
                reason = finish_reason(token, req.params, eos_ids, len(req.output_ids), req.max_new_tokens)
            else:
                reason = self._accept(req, tokens)
            reason = self.sampler.accept(req.rid, tokens, reason) if matchers else reason  # grammars
            if reason:
                # Under overlap the next step is in flight and may hold this request.
                self.scheduler.finish(req, defer_release=bool(self.in_flight))
                self.sampler.forget(req.rid)
            deltas.append(
                RequestDelta(
                    rid=req.rid,
                    token_ids=tokens,
                    logprobs=None if entry is None else [entry],
                    finish_reason=reason,
                    cached_tokens=req.cached_tokens,
                )
            )
        self.stats.generated_tokens += len(deltas)
        return deltas

    def _accept(self, req: Request, tokens: list[int]) -> str | None:
        """Append a step's tokens to the request up to the first that finishes it (the rest are
        cut from `tokens`); that token's finish reason, or None."""
        for n, token in enumerate(tokens, 1):
            req.output_ids.append(token)
            reason = finish_reason(token, req.params, self.eos_ids, len(req.output_ids), req.max_new_tokens)
            if reason:
                del tokens[n:]
                return reason
        return None

    def fail_all(self, message: str) -> list[RequestDelta]:
        """After an unexpected error in a step: drop every request, and say so to their clients."""
        rids = list(self.scheduler.by_rid)
        self.in_flight.clear()  # its results cannot be trusted
        for rid in rids:
            self.abort(rid)
        self.scheduler.release_retired()
        failed, self.failed_alone = self.failed_alone, []
        return failed + [
            RequestDelta(rid=rid, token_ids=[], finish_reason="error", error=message) for rid in rids
        ]

    def snapshot(self, query_id: int = 0) -> EngineStats:
        return self.stats.snapshot(self.scheduler, query_id)

    def check_integrity(self) -> None:
        """Free + cache-held + live requests' own pages == all pages, and the cache's locks are the
        live requests'; AssertionError otherwise (tests call it after every step)."""
        self.scheduler.check_integrity()
