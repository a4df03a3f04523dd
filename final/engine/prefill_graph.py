"""CUDA graphs for prefill steps, piece by piece: everything of a step but attention.

A decode step replays one graph (graph.py); a prefill step ran eagerly, its host launching some
ten kernels a layer one by one, and for prompts of a few thousand tokens that launch is most of
the step (`gpu_run.sh prefill-host`: a batch-1 prefill of 512 or 2,048 tokens is all but
entirely the host's launch; a server's first token waits on it). Attention is the one part that
cannot be recorded for every step of a size: its plan depends on each request's lengths. So a
step is cut at attention into L + 1 pieces, each recorded once per token bucket:

    piece 0     embedding; layer 0's norm, q/k/v projection, q/k norm + RoPE + K/V write
    piece i     layer i-1's o projection, norm and MLP; layer i's residual add, norm, projection, ...
    piece L     layer L-1's o projection, norm and MLP

and between piece i and i + 1 the backend attends eagerly over the real tokens, as it does in an
eager step, into a static buffer the next piece reads. A step of T tokens replays the smallest
bucket of B >= T tokens: the B - T padding tokens are token 0 at position 0 writing the pool's
padding slot; every op of a piece works row by row, so they never touch a real row, and the last
tokens' gather, the final norm and the LM head run eagerly on the real rows alone.

The static buffers: the runner's (input ids, positions, K/V slots) and four of this module's,
sized for the largest bucket (q, k and v for attention, attention's output, the residual stream,
the last layer's output). Between pieces the residual stream stays in its buffer (FlashInfer's
fused add + norm updates it in place; the torch path's result is copied back, a no-op for the
kernel's). Every bucket's graphs share one memory pool, their own (the decode graphs have theirs).

On by default on one GPU, every step size up to a full budget (--piecewise-cuda-graph-max-tokens;
FINAL_PREFILL_GRAPHS overrides it for an A/B): on an H200 it took a 512-token prefill from about
10 to 3.5 ms and the server's first tokens under load well under Mini-SGLang's (session 14,
benchmarks/logs/h200-2026-11-28-s14). Tested on the CPU against the eager step
(tests/final/engine/test_final_prefill_graph.py, with graph.EagerGraph stand-ins) and on a GPU
(tests/final/test_final_gpu.py). One GPU only (the row-parallel layers' all-reduce inside a piece
is not captured yet).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from ..core.flags import env_count
from ..core.forward_batch import StepInput
from .graph import CudaGraph, Graph

log = logging.getLogger(__name__)

ENV = "FINAL_PREFILL_GRAPHS"
SMALLEST_BUCKET = 256  # a prefill of fewer tokens pads to this: its GPU time is the launch's anyway


def override_max_tokens() -> int | None:
    """The largest bucket `FINAL_PREFILL_GRAPHS` asks for (0: off), overriding
    --piecewise-cuda-graph-max-tokens; None where it is not set (the benchmarks' A/B switch)."""
    return env_count(ENV, "a number of tokens (0: off)")


def buckets(max_tokens: int, limit: int) -> list[int]:
    """256, 512, 1024, ... up to max_tokens: the sizes that get graphs. `limit` is the step buffers'
    size, a full prefill budget plus a decode token for every running request: where max_tokens
    reaches it, it is the last bucket, so that a mixed step at a full budget replays too."""
    out, size = [], SMALLEST_BUCKET
    while size <= min(max_tokens, limit):
        out.append(size)
        size *= 2
    if max_tokens >= limit and limit >= SMALLEST_BUCKET and out[-1:] != [limit]:
        out.append(limit)
    return out


def bucket_for(sizes: list[int], tokens: int) -> int | None:
    return next((s for s in sizes if s >= tokens), None)


class PrefillGraphRunner:
    """Records the pieces of a prefill step for each bucket (largest first, so the smaller ones
    reuse its memory) and runs a step through them, attention eager in between."""

    def __init__(
        self,
        runner,
        max_tokens: int,
        graph_factory: Callable[[object], Graph] = CudaGraph,
        largest_only: bool = False,
    ):
        """`largest_only`: its bucket alone, to measure the memory (the others reuse its pool)."""
        self.runner = runner
        model = runner.model
        self.layers = list(model.model.layers)
        self.sizes = buckets(max_tokens, runner.buffers.max_tokens)
        if largest_only:
            self.sizes = self.sizes[-1:]
        top = self.sizes[-1] if self.sizes else 0
        cfg, device, dtype = runner.config, runner.device, runner.dtype
        attention = self.layers[0].self_attn
        q_width = attention.num_heads * attention.head_dim
        kv_width = attention.num_kv_heads * attention.head_dim

        def buffer(width: int) -> torch.Tensor:
            return torch.zeros(top, width, dtype=dtype, device=device)

        self.residual, self.output = buffer(cfg.hidden_size), buffer(cfg.hidden_size)
        self.q, self.attn_out = buffer(q_width), buffer(q_width)
        self.k, self.v = buffer(kv_width), buffer(kv_width)  # used where no kernel writes the pool
        self.writes_kv = False  # set at capture: whether projecting wrote k and v itself
        pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.graphs: dict[int, list[Graph]] = {}
        start = time.perf_counter()
        with torch.inference_mode():  # as the model's forward runs: the pool and buffers are written in place
            for size in reversed(self.sizes):
                self.graphs[size] = self._capture(size, graph_factory, pool)
        self.capture_s = time.perf_counter() - start

    def can_run(self, step: StepInput) -> bool:
        return step.is_prefill and bucket_for(self.sizes, step.num_tokens) is not None

    # ------------------------------------------------------------------ capture

    def _pad(self, tokens: int, size: int) -> None:
        """Padding tokens [tokens, size): token 0 at position 0, written into the padding slot."""
        buf = self.runner.buffers
        buf.input_ids[tokens:size].zero_()
        buf.positions[tokens:size].zero_()
        buf.out_slots[tokens:size].fill_(self.runner.pool.padding_page * self.runner.page_size)

    def _capture(self, size: int, graph_factory: Callable[[object], Graph], pool: object) -> list[Graph]:
        runner, layers = self.runner, self.layers
        model, buf, backend = runner.model, runner.buffers, runner.backend
        ids, positions, slots = buf.input_ids[:size], buf.positions[:size], buf.out_slots[:size]
        self._pad(0, size)  # capture touches the padding slot only

        def enter(layer, x: torch.Tensor, residual: torch.Tensor | None) -> None:
            """Layer `layer`'s half before attention, into the static q (k, v) and residual."""
            q, k, v, residual = layer.before_attention(x, residual, positions, model.rope, backend, slots)
            self.writes_kv = k is None
            self.q[:size].copy_(q.reshape(size, -1))
            if k is not None:
                self.k[:size].copy_(k.reshape(size, -1))
                self.v[:size].copy_(v.reshape(size, -1))
            self.residual[:size].copy_(residual)  # a no-op where the norm updated it in place

        def leave(layer) -> tuple[torch.Tensor, torch.Tensor]:
            return layer.after_attention(self.attn_out[:size], self.residual[:size])

        def first() -> None:
            enter(layers[0], model.model.embed_tokens(ids), None)

        def middle(i: int) -> Callable[[], None]:
            def piece() -> None:
                x, residual = leave(layers[i - 1])
                enter(layers[i], x, residual)

            return piece

        def last() -> None:
            x, residual = leave(layers[-1])
            self.output[:size].copy_(x)
            self.residual[:size].copy_(residual)

        pieces = [first, *(middle(i) for i in range(1, len(layers))), last]
        graphs = []
        for piece in pieces:
            graph = graph_factory(pool)
            graph.capture(piece)
            graphs.append(graph)
        return graphs

    # ------------------------------------------------------------------ run

    @torch.inference_mode()
    def run(self, step: StepInput, between_layers: Callable[[], None] | None = None) -> torch.Tensor:
        """The step's logits [sampled requests, vocab], as ModelRunner.forward computes them."""
        runner, model = self.runner, self.runner.model
        size = bucket_for(self.sizes, step.num_tokens)
        assert size is not None and self.can_run(step)
        batch = runner.prepare(step)
        tokens = step.num_tokens
        self._pad(tokens, size)
        runner.backend.prepare(batch)
        graphs = self.graphs[size]
        # Attention's inputs and output: the same views of the static buffers for every layer.
        attention = self.layers[0].self_attn
        q = self.q[:tokens].view(tokens, attention.num_heads, attention.head_dim)
        k = v = None
        if not self.writes_kv:
            k = self.k[:tokens].view(tokens, attention.num_kv_heads, attention.head_dim)
            v = self.v[:tokens].view(tokens, attention.num_kv_heads, attention.head_dim)
        attn_out = self.attn_out[:tokens]
        into = attn_out.view(tokens, attention.num_heads, -1)  # where a backend may write directly
        for i, layer in enumerate(self.layers):
            graphs[i].replay()
            out = runner.backend.forward(layer.self_attn.layer, q, k, v, batch, out=into)
            if out.data_ptr() != attn_out.data_ptr():  # the backend's own tensor (torch, TRT-LLM)
                attn_out.copy_(out.reshape(tokens, -1))
            if between_layers is not None:
                between_layers()  # host work while the GPU runs what is queued (delivery.py)
        graphs[-1].replay()
        last = batch.last_token_index
        x, _ = model.model.norm.add_and_norm(self.output[last], self.residual[last])
        return model.lm_head(x)


def maybe_prefill_graphs(
    runner, max_tokens: int | None, largest_only: bool = False
) -> PrefillGraphRunner | None:
    """The prefill graphs up to `max_tokens` (resolve.prefill_graph_tokens: None, off), where this
    model's layers split around attention and the GPU has the memory left to record them
    (`largest_only`: the executor's measurement of their memory before it sizes the KV cache)."""
    if not max_tokens:
        return None
    if not all(hasattr(layer, "before_attention") for layer in runner.model.model.layers):
        log.info("prefill graphs off: this model's layers are not split around attention")
        return None
    try:
        graphs = PrefillGraphRunner(runner, max_tokens, largest_only=largest_only)
    except torch.cuda.OutOfMemoryError:
        # Their memory is measured before the KV cache is sized (Executor._measure_graphs), but a
        # GPU may not have it even then (a small card, a high --memory-ratio, another process).
        # Eager prefill steps still work.
        torch.cuda.empty_cache()
        log.warning("prefill graphs off: out of GPU memory recording them (lower --memory-ratio "
                    "or --piecewise-cuda-graph-max-tokens to keep them)")  # fmt: skip
        return None
    if not graphs.sizes:
        return None
    if largest_only:
        return graphs
    log.info("prefill graphs: %d buckets (%d..%d tokens) of %d pieces captured in %.1f s",
             len(graphs.sizes), graphs.sizes[0], graphs.sizes[-1], len(graphs.layers) + 1, graphs.capture_s)  # fmt: skip
    return graphs
