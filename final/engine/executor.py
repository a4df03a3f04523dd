"""The executor: the model runner and its decode graphs, and the one step every rank runs.

Every tensor-parallel rank builds the same executor from the same ResolvedConfig and runs the
same method per step, `execute`, so the ranks issue the same collectives in the same order
(Nano-vLLM's ModelRunner works the same way: rank 0 calls a method, the others call it on their
side). The only difference is who samples: rank 0 samples, and every rank takes rank 0's tokens
from a broadcast (a no-op on one rank) into its device token table, where the next decode step
reads them. Rank 0 sends each step to its peers first (`launch`); the others receive them
(`follow`, in runtime/worker.py).

Before the KV cache is sized, the decode graphs are captured once against a one-page scratch
pool, so what they take (the graphs' memory and the attention state) is measured and left out of
--memory-ratio's share for the pool.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from collections.abc import Callable

import torch

from ..core.devices import kv_dtype_name
from ..core.errors import UserError
from ..core.forward_batch import StepInput
from ..distributed.step_channel import StepChannel
from ..distributed.tp import TPInfo
from ..scheduler.request import Request
from .graph import GraphRunner
from .peers import NO_PEERS, Peers
from .prefill_graph import maybe_prefill_graphs
from .resolve import ResolvedConfig
from .runner import ModelRunner
from .sampler import SampleOutput, Sampler
from .structured import StructuredOutputs
from .warmup import timed_warm_up

log = logging.getLogger(__name__)

TOKEN_DTYPE = torch.int64  # of the sampled tokens' broadcast (the sampler's argmax): both ends agree


class Executor:
    # Tokens a step gives each sampled request: 1 here; an executor that speculates (draft k - 1
    # tokens, verify them in one step) gives up to k, and the engine's bookkeeping takes them.
    tokens_per_step = 1

    def __init__(
        self,
        resolved: ResolvedConfig,
        device: torch.device,
        tp: TPInfo | None = None,
        peers: Peers = NO_PEERS,
    ):
        self.tp, self.peers, self.device = tp or TPInfo(), peers, device
        self.runner = runner = ModelRunner(resolved, device, self.tp)
        graph_batch, prefill_tokens = resolved.graph_max_batch, resolved.prefill_graph_tokens
        reserve = 0
        if graph_batch or prefill_tokens:
            reserve, decode_ok, prefill_ok = self._measure_graphs(graph_batch, prefill_tokens)
            graph_batch = graph_batch if decode_ok else None  # the backend said no (logged)
            prefill_tokens = prefill_tokens if prefill_ok else None  # no memory or no split (logged)
        num_pages = resolved.num_pages or runner.pages_that_fit(resolved.memory_ratio, reserve)
        # Rank 0's page ids index every rank's pool: all ranks take the pool the tightest one fits.
        num_pages = self.tp.min_over_ranks(num_pages)
        if num_pages < 1:
            raise UserError("no memory left for the KV cache: use a smaller model or raise --memory-ratio")
        runner.build(num_pages)
        self.graphs: GraphRunner | None = None
        # Every rank logs the same lines under TP: rank 0's are enough.
        say = log.info if self.tp.is_first else log.debug
        # Prefill steps piece by piece (resolve.prefill_graph_tokens: on one GPU, every step size).
        self.prefill_graphs = maybe_prefill_graphs(runner, prefill_tokens)
        if graph_batch:
            self.graphs = GraphRunner(runner, graph_batch)
            say(
                "CUDA graphs: %d decode graphs for %d batch sizes (1..%d) captured in %.1f s; they and "
                "the attention state take %d MiB, measured before sizing the KV cache",
                len(self.graphs.graphs),
                len(self.graphs.sizes),
                graph_batch,
                self.graphs.capture_s,
                reserve >> 20,
            )
        if self.tp.one_shot is not None:  # every rank, after its last capture (distributed/one_shot.py)
            self.tp.one_shot.register_graphs()
        say(
            "KV cache: %d tokens in %d pages (page size %d) of %s%s; attention: %s",
            num_pages * runner.page_size,
            num_pages,
            runner.page_size,
            kv_dtype_name(runner.kv_dtype),
            _scales_note(runner),
            runner.backend.name,
        )
        if resolved.warmup:  # every rank, here: under TP their collectives meet
            shapes, seconds = timed_warm_up(
                runner, resolved.max_prefill_length, resolved.max_running_requests
            )
            say("warm-up: prefill steps of %s prompt tokens in %.2f s (--warmup off skips it)",
                " and ".join(f"{n} x {t}" for n, t in shapes), seconds)  # fmt: skip
        # Only rank 0 samples; the others keep an (unused) sampler so that every rank is alike.
        model = resolved.model
        structured = StructuredOutputs(resolved.model_dir, model.vocab_size, model.eos_token_ids)
        self.sampler = Sampler(resolved.max_running_requests + 1, device, model.vocab_size, structured)

    def _measure_graphs(self, max_batch: int | None, prefill_tokens: int | None) -> tuple[int, bool, bool]:
        """Capture every decode graph and the prefill graphs' largest bucket (the smaller ones
        reuse its memory) against a one-page scratch pool: (the device memory they and the
        attention state took, whether the decode graphs could be captured, whether the prefill
        graphs could). The KV cache is then sized without that memory, so the graphs fit inside
        --memory-ratio."""
        runner = self.runner
        torch.cuda.synchronize(self.device)
        free_before, _ = torch.cuda.mem_get_info(self.device)
        runner.build(1)
        decode_ok = prefill_ok = False
        kept = []  # alive until measured: each holds its graphs' memory pool and static buffers
        # The one-shot all-reduce's graph calls must live as long as its handle: these graphs,
        # dropped once measured, run NCCL (distributed/one_shot.py).
        one_shot = self.tp.one_shot
        with one_shot.paused() if one_shot is not None else contextlib.nullcontext():
            if max_batch:
                reason = runner.backend.graph_unsupported_reason(max_batch)
                if reason is not None:
                    log.info("CUDA graphs off, decode steps run eagerly: %s", reason)
                else:
                    kept.append(GraphRunner(runner, max_batch))
                    decode_ok = True
            if prefill_tokens:
                kept.append(maybe_prefill_graphs(runner, prefill_tokens, largest_only=True))
                prefill_ok = kept[-1] is not None
        taken = 0
        if decode_ok or prefill_ok:
            torch.cuda.synchronize(self.device)
            scratch_pool = 2 * runner.page_bytes()
            taken = max(free_before - torch.cuda.mem_get_info(self.device)[0] - scratch_pool, 1)
        kept.clear()  # before the scratch build they refer to goes
        runner.teardown()
        torch.cuda.empty_cache()
        return taken, decode_ok, prefill_ok

    def forward(self, step: StepInput, between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """Logits [sampled requests, vocab] for the token after each sampled request's last one:
        a decode step replays its CUDA graph when there is one (`between_layers` unused: a replay
        is one launch), anything else runs eagerly."""
        graphs = self.graphs
        if graphs is not None and graphs.can_run(step):
            return graphs.run(step)
        prefill = self.prefill_graphs
        if prefill is not None and prefill.can_run(step):
            return prefill.run(step, between_layers)
        return self.runner.forward(step, between_layers)

    # --8<-- [start:execute]
    def execute(
        self, step: StepInput, sampled: list[Request] | None, between_layers: Callable[[], None] | None = None
    ) -> SampleOutput | None:
        """Run `step` on this rank, without waiting for the device. `sampled`: on rank 0 the
        requests the step samples, in row order; None on the others, which take rank 0's tokens.
        Returns rank 0's sampled tokens (None elsewhere, or when the step samples nothing).
        `between_layers`: called after each layer of an eager step is queued (engine/delivery.py)."""
        logits = self.forward(step, between_layers)
        count = logits.shape[0]
        if not count:
            return None
        if sampled is not None:
            out = self.sampler.sample_requests(logits, self.runner.buffers.sampled_rows[:count], sampled)
            tokens = out.tokens
        else:
            out, tokens = None, torch.empty(count, dtype=TOKEN_DTYPE, device=self.device)
        # Every rank's token table gets rank 0's tokens: the next decode step's inputs, on the device.
        self.runner.record_tokens(self.tp.broadcast(tokens))
        return out

    # --8<-- [end:execute]

    def launch(
        self, step: StepInput, sampled: list[Request], between_layers: Callable[[], None] | None = None
    ) -> SampleOutput | None:
        """Rank 0: send the step (and the page-table writes it needs) to the other ranks, then run it."""
        self.peers.send(step, self.runner.page_table.pending_writes())
        return self.execute(step, sampled, between_layers)

    def follow(self, channel: StepChannel) -> int:
        """Every other rank: run rank 0's steps, in its order, until it shuts down; how many ran."""
        steps = 0
        while (message := channel.receive()) is not None:
            self.runner.page_table.queue_writes(*message.page_writes)
            self.execute(message.step, None)
            steps += 1
        return steps

    def release_graphs(self) -> None:
        """Drop the CUDA graphs (before the process groups go: a graph holds NCCL's work)."""
        self.graphs = None
        self.prefill_graphs = None
        gc.collect()


def _scales_note(runner: ModelRunner) -> str:
    """Where an FP8 pool's scales came from, for the start-up log."""
    if not runner.pool.is_fp8:
        return ""
    return " (the checkpoint's k_scale/v_scale)" if runner.kv_scales else " (scales 1.0)"
