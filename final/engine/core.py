"""EngineCore: requests in, one scheduled step at a time, token ids out.

It is the engine without any I/O: the offline `LLM` drives it in-process, and the engine process
(process.py) drives it from ZMQ messages. It knows nothing of text: stop strings are applied by
the frontend, which calls `abort` when one matches.

A step is two calls. `launch(batch)` prepares and runs the forward pass, samples on the device,
writes the sampled tokens into the runner's token table (where the next decode step reads them)
and starts their copy to the host; it returns a `StepHandle` without waiting for the device.
`collect(handle)` waits for the tokens and does the bookkeeping: outputs, finish checks, prefix
cache inserts.

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
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import torch

from ..attention import resolve_attention
from ..core.config import EngineConfig
from ..core.devices import DTYPES, pick_device, pick_dtype
from ..core.errors import UserError
from ..core.limits import finish_reason, max_new_tokens
from ..core.model_config import load_model_config
from ..core.sampling_params import SamplingParams
from ..distributed import TPInfo
from ..distributed.group import parse_address
from ..kvcache import KVCacheManager, create_prefix_cache
from ..models import check_tp_degree, resolve_model
from ..scheduler import NeedsDrain, Request, ScheduledBatch, Scheduler, Status
from .messages import EngineInfo, EngineStats, RequestDelta
from .ranks import RankGroup
from .runner import ModelRunner
from .sampler import Sampler, TopLogprobs, make_generator, to_host

log = logging.getLogger(__name__)


@dataclass
class StepHandle:
    """A launched step: what `collect` needs once the device is done."""

    batch: ScheduledBatch
    sampled: list[Request]  # the requests that get a token from this step, in row order
    tokens: torch.Tensor | None  # [len(sampled)] on the host (pinned) once `done` has fired
    done: torch.cuda.Event | None  # recorded after the copy; None on the CPU (already done)
    logprobs: TopLogprobs | None

    def wait(self) -> list[int]:
        if self.done is not None:
            self.done.synchronize()  # the one wait per step: the host needs the tokens
        return [] if self.tokens is None else self.tokens.tolist()


class EngineCore:
    def __init__(self, config: EngineConfig, model_dir: Path | None = None):
        self.engine_config = config
        self.model_dir = Path(model_dir) if model_dir is not None else resolve_model(config.model)
        self.model_config = load_model_config(self.model_dir, config.max_seq_len_override)
        self.device = pick_device(config.device)
        self.dtype = pick_dtype(config.dtype, self.model_config.dtype, self.device)
        # Fail on a bad --attn, --cache or --tp before spending time on the weights. A page size the
        # user left unset becomes the attention kernels' choice, in the config itself, so that
        # every part of the engine (and the caller's config) reads the size in use.
        choice = resolve_attention(
            config.attn, self.device, self.dtype, config.page_size, head_dim=self.model_config.head_dim
        )
        config.page_size = choice.page_size
        prefix_cache = create_prefix_cache(config.cache, config.page_size)
        check_tp(config, self.device)
        check_tp_degree(self.model_config, config.tp)
        # Tensor parallelism: this process is rank 0; the others run in processes of their own.
        self.ranks: RankGroup | None = None
        tp = TPInfo()
        if config.tp > 1:
            if self.device.type == "cuda":
                self.device = torch.device("cuda", 0)  # rank i on cuda:i
            self.ranks = RankGroup.start(config, self.model_dir, self.device, self.dtype)
            tp = self.ranks.tp
        try:
            with self._meeting_ranks():
                self.runner = ModelRunner(
                    config, self.model_dir, self.model_config, self.device, self.dtype, tp
                )
        except BaseException:
            if self.ranks is not None:
                self.ranks.close()
            raise
        # Whoever drops the engine without closing it (an LLM at exit) still stops the ranks.
        self._closer = (
            None if self.ranks is None else weakref.finalize(self, _close_engine, self.runner, self.ranks)
        )
        self.kv = KVCacheManager(
            self.runner.num_pages, config.page_size, prefix_cache, self.runner.page_table
        )
        self.scheduler = Scheduler(
            self.kv, config.max_running_requests, config.max_prefill_length, config.chunk_policy
        )
        self.sampler = Sampler(config.max_running_requests + 1, self.device)
        self.row_params: dict[int, Request] = {}  # row -> the request whose sampling params it holds
        self.generators: dict[int, torch.Generator] = {}  # seeded requests' private random streams
        self.eos_ids = set(self.model_config.eos_token_ids)
        self.stats = EngineStats(num_pages=self.runner.num_pages)
        self.overlap = config.overlap_enabled(self.device.type)
        self.in_flight: deque[StepHandle] = deque()  # launched, not yet collected (at most one)
        self.failed_alone: list[RequestDelta] = []  # requests dropped alone since the last step returned

    @property
    def kv_capacity(self) -> int:
        return self.kv.capacity

    def info(self) -> EngineInfo:
        return EngineInfo(
            model_dir=str(self.model_dir),
            vocab_size=self.model_config.vocab_size,
            max_context=self.model_config.max_context,
            eos_token_ids=tuple(self.model_config.eos_token_ids),
            num_pages=self.runner.num_pages,
            page_size=self.runner.page_size,
            device=str(self.device),
            dtype=str(self.dtype).removeprefix("torch."),
            attn=self.runner.backend.name,
            cache=self.engine_config.cache,
        )

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
            self.kv_capacity,
        )

    def add_request(self, rid: int, prompt_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; a UserError says why it cannot be served (nothing is queued then)."""
        cap = self.check_request(prompt_ids, params)
        generator = make_generator(params, self.device)  # before queueing: it may fail too
        self.scheduler.add(Request(rid=rid, prompt_ids=list(prompt_ids), params=params, max_new_tokens=cap))
        if generator is not None:
            self.generators[rid] = generator

    def abort(self, rid: int) -> bool:
        """Drop a request wherever it is; if a step in flight holds it, its pages wait for that step."""
        self._forget(rid)
        return self.scheduler.abort(rid, defer_release=bool(self.in_flight))

    def _forget(self, rid: int) -> None:
        self.generators.pop(rid, None)

    def has_work(self) -> bool:
        return self.scheduler.has_work() or bool(self.in_flight)

    @property
    def failed(self) -> bool:
        """A tensor-parallel rank was lost: every step from now on raises RankFailure."""
        return self.ranks is not None and self.ranks.failure is not None

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (nothing to do with one rank). Idempotent."""
        if self._closer is not None:
            self._closer()

    def _meeting_ranks(self):
        """Around work that meets the other ranks (a no-op at --tp 1): see RankGroup.guard."""
        return self.ranks.guard() if self.ranks is not None else contextlib.nullcontext()

    def step(self) -> list[RequestDelta]:
        """One iteration of the loop; one delta per request that got a token (or finished), and
        an error delta per request that failed alone."""
        with self._meeting_ranks():
            deltas = self._step()
        if self.failed_alone:
            deltas, self.failed_alone = self.failed_alone + deltas, []
        return deltas

    def _step(self) -> list[RequestDelta]:
        if not self.overlap:
            batch = self.scheduler.schedule()
            return [] if batch is None else self.collect(self.launch(batch))
        deltas: list[RequestDelta] = []
        try:
            batch = self.scheduler.schedule(can_preempt=not self.in_flight)
        except NeedsDrain:  # the pool ran dry: collect the step in flight, then preempt
            deltas += self.collect(self.in_flight.popleft())
            batch = self.scheduler.schedule()
        if batch is not None:
            self.in_flight.append(self.launch(batch))  # step N+1 is on its way ...
        if len(self.in_flight) > 1 or (batch is None and self.in_flight):
            deltas += self.collect(self.in_flight.popleft())  # ... while step N is collected
        return deltas

    def launch(self, batch: ScheduledBatch) -> StepHandle:
        """Run the step's forward pass and sampling on the device; do not wait for them."""
        batch = self._admit_rows(batch)
        if not batch.requests:
            return StepHandle(batch, [], None, None, None)
        step = batch.step_input()
        if self.ranks is not None:  # the other ranks run the same step: send it, with its page writes
            self.ranks.send_step(step, self.runner.page_table.pending_writes())
        logits = self.runner.forward(step)
        sampled: list[Request] = []
        prompts_done: list[Request] = []
        for req, q_len, is_sampled in zip(batch.requests, batch.query_lens, batch.sampled, strict=True):
            req.num_computed += q_len  # a chunk of a cut prompt: its KV is in, no token yet
            if is_sampled:
                sampled.append(req)
                # The prompt is in the pool now (a full cache hit computes just one token).
                if q_len > 1 or req.num_generated == 0:
                    prompts_done.append(req)
                req.num_pending += 1
                req.last_token_on_device = True  # record_tokens writes it into the request's row
        for req in prompts_done:
            # The prompt's K and V are being written by this step, and every later step runs after
            # it on the one stream: the cache can offer them now. Waiting for `collect` would let
            # the step scheduled meanwhile (overlap) miss them and compute them again.
            self.scheduler.cache_request(req)
        self.stats.num_steps += 1
        if not sampled:
            return StepHandle(batch, [], None, None, None)
        rows = self.runner.buffers.sampled_rows[: len(sampled)]
        generators = (
            [self.generators.get(r.rid) for r in sampled] if self.generators else [None] * len(sampled)
        )
        out = self.sampler.sample(logits, rows, [r.params for r in sampled], generators)
        if self.ranks is not None:  # sampled once, here: every rank's token table gets these tokens
            self.ranks.share_tokens(out.tokens)
        self.runner.record_tokens(out.tokens)  # the next decode step's inputs, on the device
        # Tokens (and logprobs) go to pinned host memory behind the step's kernels; `collect` waits
        # for this one event, never for the whole stream (which would include the next step).
        tokens, done = to_host(out.tokens), None
        logprobs = out.logprobs.to_host() if out.logprobs is not None else None
        if out.tokens.is_cuda:
            done = torch.cuda.Event()
            done.record()
        return StepHandle(batch, sampled, tokens, done, logprobs)

    def _admit_rows(self, batch: ScheduledBatch) -> ScheduledBatch:
        """Write the sampling parameters of requests new to their row (admitted, or readmitted
        after a preemption) into the sampler's device tables. A request whose parameters cannot be
        stored fails alone: it leaves the batch, its pages go back, its client gets an error."""
        failed: list[Request] = []
        for req in batch.requests:
            if self.row_params.get(req.kv.row) is req:
                continue
            try:
                self.sampler.admit(req.kv.row, req.params)
            except Exception as err:
                log.error("request %d: cannot store its sampling parameters: %r", req.rid, err)
                self._fail_request(req, f"invalid sampling parameters: {type(err).__name__}: {err}")
                failed.append(req)
                continue
            self.row_params[req.kv.row] = req
        if not failed:
            return batch
        keep = [i for i, req in enumerate(batch.requests) if req not in failed]
        return ScheduledBatch(
            requests=[batch.requests[i] for i in keep],
            query_lens=[batch.query_lens[i] for i in keep],
            sampled=[batch.sampled[i] for i in keep],
        )

    def _fail_request(self, req: Request, message: str) -> None:
        """Drop one running request that cannot go on; the next `step` reports it."""
        self.scheduler.finish(req, defer_release=bool(self.in_flight))
        self._forget(req.rid)
        self.failed_alone.append(
            RequestDelta(
                rid=req.rid, token_ids=[], finish_reason="error", error=message, error_code="invalid_request"
            )
        )

    def collect(self, handle: StepHandle) -> list[RequestDelta]:
        """Wait for a launched step's tokens; append them, finish and cache requests; one delta per
        sampled request still alive."""
        tokens = handle.wait()
        # That step is complete: pages of requests that finished while it ran can go back.
        self.scheduler.release_retired()
        logprobs = handle.logprobs.entries() if handle.logprobs is not None else [None] * len(tokens)
        deltas: list[RequestDelta] = []
        for req, token, entry in zip(handle.sampled, tokens, logprobs, strict=True):
            req.num_pending -= 1
            if req.status is Status.FINISHED:
                continue  # finished (or aborted) after this step was launched: its token is dropped
            req.output_ids.append(token)
            reason = finish_reason(token, req.params, self.eos_ids, len(req.output_ids), req.max_new_tokens)
            if reason:
                # Under overlap the next step is in flight and may hold this request.
                self.scheduler.finish(req, defer_release=bool(self.in_flight))
                self._forget(req.rid)
            deltas.append(
                RequestDelta(
                    rid=req.rid,
                    token_ids=[token],
                    logprobs=None if entry is None else [entry],
                    finish_reason=reason,
                    cached_tokens=req.cached_tokens,
                )
            )
        self.stats.generated_tokens += len(deltas)
        return deltas

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
        s = self.stats
        s.query_id = query_id
        s.num_running, s.num_waiting = self.scheduler.num_running, self.scheduler.num_waiting
        s.free_pages, s.cached_pages = self.kv.num_free_pages, self.kv.prefix_cache.num_cached_pages
        s.prompt_tokens = self.scheduler.num_prompt_tokens
        s.cached_prompt_tokens = self.scheduler.num_cached_tokens
        s.num_preemptions = self.scheduler.num_preemptions
        return EngineStats(**vars(s))

    def check_integrity(self) -> None:
        """Free + cache-held + live requests' own pages == all pages, and the cache's locks are the
        live requests'; AssertionError otherwise (tests call it after every step)."""
        self.scheduler.check_integrity()


def check_tp(config: EngineConfig, device: torch.device) -> None:
    """What --tp, --nnodes and --dist-init-addr need of the machine (the model's check is
    models.check_tp_degree)."""
    if config.dist_init_addr is not None:
        parse_address(config.dist_init_addr)
    if config.node_rank > 0:
        raise UserError(
            "a node other than node 0 runs no engine of its own: start it with `python -m final "
            "--node-rank K ...`, which starts its ranks for node 0's engine"
        )
    if config.tp == 1 or device.type != "cuda":
        return
    if device.index is not None:
        raise UserError(
            f"--device {device}: under --tp, rank i runs on cuda:i of its node; use --device cuda "
            "(CUDA_VISIBLE_DEVICES chooses the GPUs)"
        )
    per_node, visible = config.ranks_per_node, torch.cuda.device_count()
    if visible < per_node:
        raise UserError(f"--tp {config.tp} needs {per_node} GPUs on this node; PyTorch sees {visible}")


def _close_engine(runner: ModelRunner, ranks: RankGroup) -> None:
    runner.release_graphs()  # before the process groups: a graph holds NCCL's work
    ranks.close()


def validate_early(config: EngineConfig) -> None:
    """The checks that need no model: run them in the frontend before spawning anything."""
    config.validate()
    device = pick_device(config.device)
    dtype = DTYPES.get(config.dtype)  # None for auto, which is never float32 on CUDA
    # Not probing the GPU: the frontend process must not create a CUDA context. The engine process
    # checks the compute capability.
    resolve_attention(config.attn, device, dtype, config.page_size, probe_gpu=False)
    create_prefix_cache(config.cache, config.page_size or 1)
    check_tp(config, device)
