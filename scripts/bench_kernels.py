"""Check and time final/kernels on a CUDA GPU against the torch code they replace, at Qwen3-0.6B's
shapes: the K/V write, the fused q/k norm + RoPE + K/V write, sampling, the small-M GEMV (and a
chain of them with programmatic dependent launch and without), and a decode step's metadata (inputs, positions and slots; the attention plan's page list). It also
times FlashInfer's decode attention with and without tensor cores at several batches and
contexts (even and uneven lengths; eager, and replayed in a graph as the engine runs it), the
measurement `use_tensor_cores` in final/attention/flashinfer_backend.py follows. `--only` runs
some parts (`gpu_run.sh decode-attn`: the decode attention alone).

Every kernel is first checked against its reference on fresh random inputs (pools poisoned with
NaN, page sizes 1, 16 and 64, CUDA-graph padding rows), then both are timed: `graph_us` is the
median of CUDA-graph replays (triton.testing.do_bench_cudagraph: launch cost out, as in a
captured decode step), `gpu_us` the GPU's kernel time per call under the torch profiler (for the
sampler, which runs outside the graphs, its host time shows in `wall_us`). One JSON result,
a short table, and exit status 1 if a check failed:

    python -m scripts.bench_kernels --out benchmarks/results/h200/kernels_h200.json

`--smoke` runs the same code on the CPU at toy shapes through Triton's interpreter (float16, no
fp8, no FlashInfer, wall-clock times that mean nothing): tests/final/kernels/test_final_kernels_interpret.py
runs it, so the script cannot rot between GPU runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from final.core.sampling_params import SamplingParams
from final.engine.sampler import Sampler
from final.kernels import gemv, kv_write, qk_norm_rope_kv, step_metadata
from final.kernels import sampling as sampling_kernels
from final.models import fused
from stages.common.bench import stamp_run_id
from stages.common.hardware import describe, versions

BF16, FP16, FP8 = torch.bfloat16, torch.float16, torch.float8_e4m3fn


@dataclass(frozen=True)
class Setup:
    device: str
    heads: int
    kv_heads: int
    dim: int
    vocab: int
    gemv_shapes: dict[str, tuple[int, int]]  # name -> (N, K) of W
    tokens: tuple[int, ...]
    batches: tuple[int, ...]
    ms: tuple[int, ...]
    act: torch.dtype
    cache_dtypes: tuple[torch.dtype, ...]


QWEN3_06B = Setup(
    "cuda", 16, 8, 128, 151936,
    {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072), "lm_head": (151936, 1024)},
    (1, 64, 256, 4096), (1, 64, 256), (1, 2, 4, 8), BF16, (BF16, FP8),
)  # fmt: skip
SMOKE = Setup(
    "cpu", 4, 2, 16, 64, {"qkv": (64, 32), "o": (32, 64), "gate_up": (96, 32), "down": (32, 48), "lm_head": (64, 32)},
    (1, 5), (1, 3), (1, 2), FP16, (FP16,),
)  # fmt: skip
LAYER_SHAPES = ("qkv", "o", "gate_up", "down")


def gpu_kernels(fn, iters: int = 30) -> dict[str, float]:
    """GPU time per call of each kernel (name cut to 80 characters), in a profiled window."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/trace.json")
        events = json.loads(Path(f"{tmp}/trace.json").read_text())["traceEvents"]
    kinds = ("kernel", "gpu_memcpy", "gpu_memset")
    per_kernel: dict[str, float] = {}
    for e in events:
        if e.get("cat") in kinds:
            name = str(e.get("name", "?"))[:80]
            per_kernel[name] = per_kernel.get(name, 0.0) + e.get("dur", 0) / iters
    return per_kernel


def gpu_us(fn, iters: int = 30) -> float:
    """GPU time per call: the kernels' durations in a profiled window, summed."""
    return sum(gpu_kernels(fn, iters).values())


def graph_us(fn) -> float:
    """Median time of one call, replayed in a CUDA graph (launch cost out)."""
    import triton.testing

    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")


def timed(fn, graph: bool = True) -> dict[str, float]:
    if not torch.cuda.is_available():  # --smoke: the code path only
        start = time.perf_counter()
        fn()
        return {"wall_us": (time.perf_counter() - start) * 1e6}
    import triton.testing

    out = {"gpu_us": gpu_us(fn)}
    if graph:
        out["graph_us"] = graph_us(fn)
    else:  # eager, host included: how the sampler runs in the engine
        out["wall_us"] = 1e3 * triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
    return out


class Report:
    def __init__(self):
        self.checks: list[dict] = []
        self.rows: list[dict] = []
        self.metrics: dict[str, float] = {}

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        self.checks.append({"name": name, "ok": bool(ok), "detail": detail})
        if not ok:
            print(f"CHECK FAILED: {name} {detail}", flush=True)

    def time(
        self, kernel: str, case: str, ours: dict[str, float], reference: dict[str, float], **extra
    ) -> None:
        key = next(k for k in ("graph_us", "gpu_us", "wall_us") if k in ours)
        row = {"kernel": kernel, "case": case, "ours": ours, "reference": reference, **extra}
        row["speedup"] = reference[key] / ours[key]
        self.rows.append(row)
        for side, times in (("ours", ours), ("ref", reference)):
            for what, value in times.items():
                self.metrics[f"{kernel}_{case}_{side}_{what}"] = round(value, 3)
        print(f"{kernel:12} {case:18} ours {ours[key]:9.2f} us   reference {reference[key]:9.2f} us   x{row['speedup']:.2f}", flush=True)  # fmt: skip


def pool(s: Setup, tokens: int, page_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    """One layer's pool as slots, NaN everywhere (a slot nothing should touch stays NaN); the last
    page is the padding page."""
    pages = -(-tokens // page_size) + 4
    cache = torch.full(((pages + 1) * page_size, s.kv_heads, s.dim), float("nan"), device=s.device)
    return cache.to(dtype), pages


def step_slots(s: Setup, tokens: int, pages: int, page_size: int) -> torch.Tensor:
    padding = min(3, tokens - 1)  # a graph step's padding rows share the padding page's slot
    live = torch.randperm(pages * page_size, device=s.device)[: tokens - padding]
    return torch.cat([live, torch.full((padding,), pages * page_size, device=s.device)]).to(torch.int32)


def same(got: torch.Tensor, want: torch.Tensor, page_size: int, rel: float = 0.0) -> bool:
    got, want = got[:-page_size].float(), want[:-page_size].float()  # the padding page is garbage
    if not torch.equal(got.isnan(), want.isnan()):
        return False
    written = ~want.isnan()
    slack = rel * want[written].abs() + (1e-2 if rel else 0)
    return bool(((got[written] - want[written]).abs() <= slack).all())


def mismatch(got: torch.Tensor, want: torch.Tensor, page_size: int) -> str:
    """Where two pools differ, in a few words: how many elements, and the first few pairs."""
    got, want = got[:-page_size].float().flatten(), want[:-page_size].float().flatten()
    differ = ~((got == want) | (got.isnan() & want.isnan()))
    where = differ.nonzero().flatten()[:4].tolist()
    pairs = ", ".join(f"{got[i].item():.6g} vs {want[i].item():.6g}" for i in where)
    return f"{int(differ.sum())} of {got.numel()} differ (ours vs reference: {pairs})"


def qkv_input(s: Setup, tokens: int) -> torch.Tensor:
    return torch.randn(tokens, (s.heads + 2 * s.kv_heads) * s.dim, device=s.device).to(s.act) * 4


def bench_kv_write(report: Report, s: Setup) -> None:
    for tokens in s.tokens:
        qkv = qkv_input(s, tokens)
        k, v = qkv[:, s.heads * s.dim :].view(tokens, 2 * s.kv_heads, s.dim).chunk(2, dim=1)  # strided views
        for dtype in s.cache_dtypes:
            for page_size in (1, 16, 64):
                cache, pages = pool(s, tokens, page_size, dtype)
                slots = step_slots(s, tokens, pages, page_size)
                got, want = [cache.clone(), cache.clone()], [cache.clone(), cache.clone()]
                kv_write.triton_store_kv(*got, slots, k, v, 0.4, 1.7)
                kv_write.torch_store_kv(*want, slots, k, v, 0.4, 1.7)
                # fp8: torch's CUDA division by a scalar multiplies by its reciprocal, the kernel
                # divides (div_rn), so a value may land one e4m3 step (1/8 relative) apart
                rel = 0.13 if dtype == FP8 else 0.0
                ok = all(same(g, w, page_size, rel) for g, w in zip(got, want, strict=True))
                report.check(
                    f"kv_write T={tokens} {dtype} page={page_size}",
                    ok,
                    ""
                    if ok
                    else "; ".join(
                        f"{n}: {mismatch(g, w, page_size)}" for n, g, w in zip("KV", got, want, strict=True)
                    ),
                )
        cache, pages = pool(s, tokens, 16, s.act)
        slots, caches = step_slots(s, tokens, pages, 16), (cache, cache.clone())
        ours = timed(lambda: kv_write.triton_store_kv(*caches, slots, k, v))  # noqa: B023
        report.time("kv_write", f"t{tokens}", ours, timed(lambda: kv_write.torch_store_kv(*caches, slots, k, v)))  # noqa: B023  # fmt: skip


def bench_fused(report: Report, s: Setup) -> None:
    cos_sin = torch.randn(4096, s.dim, device=s.device)
    weights = [torch.randn(s.dim, device=s.device).to(s.act) for _ in range(2)]
    heads = (s.heads, s.kv_heads)
    for tokens in s.tokens:
        qkv = qkv_input(s, tokens)
        positions = torch.randint(0, 4096, (tokens,), device=s.device, dtype=torch.int32)
        for dtype in s.cache_dtypes:
            for page_size in (1, 16, 64):
                cache, pages = pool(s, tokens, page_size, dtype)
                slots = step_slots(s, tokens, pages, page_size)
                got, want = [cache.clone(), cache.clone()], [cache.clone(), cache.clone()]
                args = (qkv, *heads, positions, cos_sin)
                q = qk_norm_rope_kv.triton_qk_norm_rope_kv(*args, *got, slots, *weights, 1e-6, 0.5, 2.0)
                q_ref = qk_norm_rope_kv.torch_qk_norm_rope_kv(*args, *want, slots, *weights, 1e-6, 0.5, 2.0)
                q_err = ((q.float() - q_ref.float()).norm() / q_ref.float().norm()).item()
                k_ok = same(got[0], want[0], page_size, rel=0.13 if dtype == FP8 else 0.01)
                ok = q_err < 1e-2 and k_ok and same(got[1], want[1], page_size)
                report.check(f"fused T={tokens} {dtype} page={page_size}", ok, f"q rel error {q_err:.2e}")
        cache, pages = pool(s, tokens, 16, s.act)
        slots, caches = step_slots(s, tokens, pages, 16), (cache, cache.clone())

        def op_by_op(store):  # the model's path before: two norms, RoPE, the store
            q, k, v = qkv.split([s.heads * s.dim, s.kv_heads * s.dim, s.kv_heads * s.dim], dim=-1)  # noqa: B023
            q = fused.rms_norm(q.view(tokens, s.heads, s.dim), weights[0], 1e-6)  # noqa: B023
            k = fused.rms_norm(k.view(tokens, s.kv_heads, s.dim), weights[1], 1e-6)  # noqa: B023
            q, k = fused.apply_rope(q, k, positions, cos_sin)  # noqa: B023
            store(*caches, slots, k, v.view(tokens, s.kv_heads, s.dim))  # noqa: B023

        ours = timed(lambda: qk_norm_rope_kv.triton_qk_norm_rope_kv(qkv, *heads, positions, cos_sin, *caches, slots, *weights, 1e-6))  # noqa: B023  # fmt: skip
        report.time("fused_norm_rope_kv", f"t{tokens}", ours, timed(lambda: op_by_op(kv_write.torch_store_kv)))  # fmt: skip
        report.time("fused_norm_rope_kv", f"t{tokens}_vs_triton_store", ours, timed(lambda: op_by_op(kv_write.triton_store_kv)))  # fmt: skip


def bench_sampling(report: Report, s: Setup) -> None:
    """The sampler as the engine calls it, bf16 logits (the Gumbel-max kernel for the temperature
    alone, FlashInfer with a filter) against the previous path: the model's float32 copy of the
    logits and the torch draw; and FlashInfer's softmax-then-draw chain against the Gumbel-max
    kernel. Greedy must be the argmax exactly; the frequencies are tested in
    tests/final/kernels/test_final_gpu_kernels.py."""
    for batch in s.batches:
        for temperature in (0.0, 0.6):
            logits = torch.randn(batch, s.vocab, device=s.device).to(s.act) * 3
            params = [SamplingParams(temperature=temperature)] * batch  # the offline workload's
            sampler = Sampler(batch, torch.device(s.device), s.vocab)
            for row, p in enumerate(params):
                sampler.admit(row, p)
            rows, gens = torch.arange(batch, device=s.device, dtype=torch.int32), [None] * batch
            tokens = sampler.sample(logits, rows, params, gens).tokens
            if temperature == 0:
                report.check(f"sampling greedy B={batch}", torch.equal(tokens, logits.argmax(-1)))
                # The greedy batch's argmax: the two-pass kernel against torch's one block per row.
                report.time("sampling", f"b{batch}_argmax_kernel_vs_torch",
                            timed(lambda: sampling_kernels.triton_argmax(logits)),  # noqa: B023
                            timed(lambda: logits.argmax(-1)))  # noqa: B023  # fmt: skip
            else:  # a draw under top_k=1 is the argmax (the distribution: tests/final/kernels/test_final_gpu_kernels.py)
                one = [SamplingParams(temperature=temperature, top_k=1)] * batch
                for row, p in enumerate(one):
                    sampler.admit(row, p)
                drawn = sampler.sample(logits, rows, one, gens).tokens
                report.check(
                    f"sampling t=0.6 top_k=1 B={batch} is the argmax", torch.equal(drawn, logits.argmax(-1))
                )
                for row, p in enumerate(params):
                    sampler.admit(row, p)
            ours = timed(lambda: sampler.sample(logits, rows, params, gens), graph=False)  # noqa: B023
            if temperature:  # the same draw through FlashInfer's chain, which the Gumbel-max kernel replaced
                gumbel = sampling_kernels.gumbel_available
                sampling_kernels.gumbel_available = lambda logits: False
                try:
                    chain = timed(lambda: sampler.sample(logits, rows, params, gens), graph=False)  # noqa: B023
                finally:
                    sampling_kernels.gumbel_available = gumbel
                report.time("sampling", f"b{batch}_t{temperature}_gumbel_vs_flashinfer", ours, chain)
            available = sampling_kernels.available
            sampling_kernels.available = lambda logits: False  # the sampler's reference path
            try:
                reference = timed(lambda: sampler.sample(logits.float(), rows, params, gens), graph=False)  # noqa: B023  # fmt: skip
            finally:
                sampling_kernels.available = available
            report.time("sampling", f"b{batch}_t{temperature}", ours, reference)


def bench_step_metadata(report: Report, s: Setup) -> None:
    """A decode step's inputs and the attention plan's page list: one kernel each against the torch
    ops they replace, on random page tables with padding rows."""
    for batch in s.batches:
        for page_size in (1, 16):
            width, padding = 4096 // page_size, min(3, batch - 1)
            rows_total = max(batch, 4) + 1
            table = (
                torch.randperm(rows_total * width, device=s.device).view(rows_total, width).to(torch.int32)
            )
            table[-1] = -5  # the padding row
            tokens = torch.randint(0, s.vocab, (rows_total,), device=s.device, dtype=torch.int32)
            live = torch.randperm(rows_total - 1, device=s.device)[: batch - padding].to(torch.int32)
            rows = torch.cat(
                [live, torch.full((padding,), rows_total - 1, device=s.device, dtype=torch.int32)]
            )
            lens = torch.randint(1, 1025, (batch - padding,), device=s.device, dtype=torch.int32)
            seq_lens = torch.cat([lens, torch.ones(padding, device=s.device, dtype=torch.int32)])
            got = [torch.full((batch,), -7, device=s.device, dtype=torch.int32) for _ in range(3)]
            want = [torch.empty(batch, device=s.device, dtype=torch.int32) for _ in range(3)]
            args = (tokens, table, rows, seq_lens, page_size)
            step_metadata.decode_inputs(*args, *got)
            step_metadata.torch_decode_inputs(*args, *want)
            ok = all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
            report.check(f"decode_inputs B={batch} page={page_size}", ok)
            report.time(
                "decode_inputs",
                f"b{batch}_p{page_size}",
                timed(lambda: step_metadata.decode_inputs(*args, *got)),  # noqa: B023
                timed(lambda: step_metadata.torch_decode_inputs(*args, *want)),  # noqa: B023
            )
            counts = (seq_lens + page_size - 1) // page_size
            total, most = int(counts.sum()), int(counts.max())
            reference = step_metadata.torch_kv_indices(table, rows, seq_lens, page_size, total)
            ours = step_metadata.kv_indices(table, rows, seq_lens, page_size, total, most)
            report.check(f"kv_indices B={batch} page={page_size}", torch.equal(ours, reference))
            report.time(
                "kv_indices",
                f"b{batch}_p{page_size}",
                timed(lambda: step_metadata.kv_indices(table, rows, seq_lens, page_size, total, most)),  # noqa: B023
                timed(lambda: step_metadata.torch_kv_indices(table, rows, seq_lens, page_size, total)),  # noqa: B023
            )

    bench_step_inputs(report, s)


def bench_step_inputs(report: Report, s: Setup) -> None:
    """An eager step's positions, slots and table tokens (runner.prepare): one kernel against the
    torch ops it replaced, host time included (prepare runs eagerly): a batch-1 prefill of 512 and
    8,192 tokens, and a mixed step of a 2,048-token chunk beside 255 decoding requests."""
    page_size, width = 16, 1024
    for name, query in (
        ("prefill512", [512]),
        ("prefill8192", [8192]),
        ("mixed2048_b256", [2048] + [1] * 255),
    ):
        query = query if s.device == "cuda" else [max(1, q // 64) for q in query[:8]]  # --smoke
        batch = len(query)
        table = torch.randperm((batch + 1) * width, device=s.device).view(batch + 1, width).to(torch.int32)
        tokens = torch.randint(0, s.vocab, (batch + 1,), device=s.device, dtype=torch.int32)
        rows = torch.randperm(batch, device=s.device).to(torch.int32)
        query_lens = torch.tensor(query, device=s.device, dtype=torch.int32)
        seq_lens = query_lens + torch.randint(0, 4096, (batch,), device=s.device, dtype=torch.int32)
        from_table = (query_lens == 1).to(torch.int32)
        total = sum(query)
        host_ids = torch.randint(0, s.vocab, (total,), device=s.device, dtype=torch.int32)
        got = [
            host_ids.clone(),
            *(torch.full((total,), -7, device=s.device, dtype=torch.int32) for _ in range(2)),
        ]
        want = [host_ids.clone(), *(torch.empty(total, device=s.device, dtype=torch.int32) for _ in range(2))]
        args = (tokens, table, rows, query_lens, seq_lens, from_table, page_size)
        step_metadata.step_inputs(*args, *got, max(query))
        step_metadata.torch_step_inputs(*args, *want)
        report.check(f"step_inputs {name}", all(torch.equal(g, w) for g, w in zip(got, want, strict=True)))
        report.time(
            "step_inputs",
            name,
            timed(lambda: step_metadata.step_inputs(*args, *got, max(query)), graph=False),  # noqa: B023
            timed(lambda: step_metadata.torch_step_inputs(*args, *want), graph=False),  # noqa: B023
        )


# Decode contexts: (shortest, longest) KV tokens a row, lengths drawn evenly between. The even ones
# are the kernel table's kind of step (every row one length); the uneven ones are spread like the
# offline workload's (prompts of 100-1,024 tokens, then what each has generated), with means of 512
# and 768: tensor cores measured 14% slower than the CUDA-core kernel in the kernel table's even
# 512-token batch-256 step, yet faster offline at any context (session 17).
DECODE_CONTEXTS = {"512": (512, 512), "1024": (1024, 1024), "4096": (4096, 4096), "u512": (64, 960), "u768": (256, 1280)}  # fmt: skip


def decode_layout(lengths: list[int], page_size: int, device) -> tuple[torch.Tensor, ...]:
    """FlashInfer's paged layout of one decode step: (indptr, indices, last_page_len), each row's
    pages scattered over the pool, page 0 left free (the padding page)."""
    pages = [-(-n // page_size) for n in lengths]
    indptr = torch.tensor([0, *pages], device=device).cumsum(0).to(torch.int32)
    indices = (torch.randperm(sum(pages), device=device) + 1).to(torch.int32)
    last = torch.tensor([n - (p - 1) * page_size for n, p in zip(lengths, pages, strict=True)], device=device)
    return indptr, indices, last.to(torch.int32)


def bench_decode_attention(report: Report, s: Setup) -> None:
    """FlashInfer's paged decode with tensor cores (ours) against without (the reference), per
    layer-call, page size 16: the measurement the backend's `use_tensor_cores` rule follows. Two
    ways per case: `decode_attn_tc` eager wrappers, `decode_attn_tc_graph` as the engine runs them
    (graph-mode wrappers captured on rows of one token, as GraphRunner captures, replayed after a
    plan with the case's lengths), each checked against the eager CUDA-core output."""
    import flashinfer

    page_size, workspace = 16, torch.empty(128 << 20, dtype=torch.uint8, device=s.device)
    generator = torch.Generator().manual_seed(0)
    for batch in s.batches:
        for name, (shortest, longest) in DECODE_CONTEXTS.items():
            lengths = torch.randint(shortest, longest + 1, (batch,), generator=generator).tolist()
            indptr, indices, last = decode_layout(lengths, page_size, s.device)
            k_cache = torch.randn(len(indices) + 1, page_size, s.kv_heads, s.dim, device=s.device).to(s.act)
            v_cache = torch.randn_like(k_cache)
            q = torch.randn(batch, s.heads, s.dim, device=s.device).to(s.act)
            plan = dict(num_qo_heads=s.heads, num_kv_heads=s.kv_heads, head_dim=s.dim, page_size=page_size,
                        q_data_type=s.act, kv_data_type=s.act)  # fmt: skip
            outs, times, graphed = [], [], []
            for tensor_cores in (True, False):
                wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                    workspace, "NHD", use_tensor_cores=tensor_cores
                )
                wrapper.plan(indptr, indices, last, **plan)
                outs.append(wrapper.run(q, (k_cache, v_cache)).float())
                times.append(timed(lambda w=wrapper: w.run(q, (k_cache, v_cache)), graph=False))  # noqa: B023
                graphed.append(graph_decode(flashinfer, workspace, tensor_cores, q, k_cache, v_cache,
                                            (indptr, indices, last), plan))  # fmt: skip
            reference = outs[1]
            checked = {
                "tensor cores": outs[0],
                "graph, tensor cores": graphed[0][0],
                "graph, CUDA cores": graphed[1][0],
            }
            for label, out in checked.items():
                err = ((out - reference).norm() / reference.norm()).item()
                report.check(
                    f"decode attention {label} B={batch} ctx={name}", err < 1e-2, f"rel error {err:.2e}"
                )
            case = f"b{batch}_ctx{name}"
            report.time("decode_attn_tc", case, times[0], times[1])
            # Which kernels each graph ran (a split-KV merge, say): the why behind the two times.
            report.time("decode_attn_tc_graph", case, graphed[0][1], graphed[1][1],
                        kernels={"tensor_cores": graphed[0][2], "cuda_cores": graphed[1][2]})  # fmt: skip


def graph_decode(flashinfer, workspace, tensor_cores, q, k_cache, v_cache, layout, plan):
    """One layer's decode the way the engine's graphs run it: (output, times, GPU us per kernel)."""
    indptr, indices, last = layout
    batch = q.shape[0]
    buffers = (torch.zeros_like(indptr), torch.zeros_like(indices), torch.zeros_like(last))
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace, "NHD", use_cuda_graph=True, use_tensor_cores=tensor_cores,
        paged_kv_indptr_buffer=buffers[0], paged_kv_indices_buffer=buffers[1], paged_kv_last_page_len_buffer=buffers[2],
    )  # fmt: skip
    one_token = torch.arange(batch + 1, dtype=torch.int32, device=q.device)  # a page each, one token
    wrapper.plan(one_token, torch.zeros(batch, dtype=torch.int32, device=q.device),
                 torch.ones(batch, dtype=torch.int32, device=q.device), **plan)  # fmt: skip
    out = torch.empty_like(q)
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()  # warm-up off the capture stream, as final/engine/graph.py does
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        wrapper.run(q, (k_cache, v_cache), out=out)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        wrapper.run(q, (k_cache, v_cache), out=out)
    wrapper.plan(indptr, indices, last, **plan)  # this step's lengths, into the fixed buffers
    out.zero_()
    graph.replay()
    return out.float(), timed(graph.replay, graph=False), gpu_kernels(graph.replay)


def bench_gemv(report: Report, s: Setup) -> dict:
    wins: dict[str, list[int]] = {name: [] for name in s.gemv_shapes}
    for name, (n, k) in s.gemv_shapes.items():
        w = torch.randn(n, k, device=s.device).to(s.act) / k**0.5
        for m in s.ms:
            x = torch.randn(m, k, device=s.device).to(s.act)
            want = F.linear(x.float(), w.float())
            err = ((gemv.triton_linear(x, w).float() - want).norm() / want.norm()).item()
            report.check(f"gemv {name} M={m}", err < 1e-2, f"rel error {err:.2e}")
            ours = timed(lambda: gemv.triton_linear(x, w))  # noqa: B023
            cublas = timed(lambda: F.linear(x, w))  # noqa: B023
            key = next(iter(ours))
            extra = {"tb_per_s": round(n * k * 2 / ours[key] / 1e6, 2)}
            if m in (1, 4) and s.device == "cuda":  # other tilings: does the default leave time?
                block_k = min(4096, 1 << (k - 1).bit_length())
                configs = [gemv.GemvConfig(bn, min(block_k, 4096 // bn), wp) for bn, wp in ((1, 4), (2, 4), (4, 4), (8, 4), (2, 8), (4, 8))]  # fmt: skip
                times = {}
                for c in configs:
                    try:
                        times[c] = graph_us(lambda c=c: gemv.triton_linear(x, w, None, c))  # noqa: B023
                    except Exception as err:  # a tiling that does not compile here is no candidate
                        print(f"gemv {name} M={m} {c}: {type(err).__name__}: {err}"[:300])
                best = min(times, key=times.__getitem__)
                extra |= {"best_config": list(best), "best_us": round(times[best], 3)}
            report.time("gemv", f"{name}_m{m}", ours, cublas, **extra)
            if ours[key] < cublas[key]:
                wins[name].append(m)
    by_shape = {}  # per shape, the largest M up to which the kernel wins at every M measured
    for name in s.gemv_shapes:
        by_shape[name] = 0
        for m in sorted(s.ms):
            if m not in wins[name]:
                break
            by_shape[name] = m
    # What final/kernels/gemv.py's GEMV_MAX_M_BY_WIDTH takes: per output width, the most rows.
    widths = sorted({(s.gemv_shapes[name][0], m) for name, m in by_shape.items()})
    return {"max_m_by_shape": by_shape, "max_m_by_width": widths, "wins": wins}


def bench_gemv_pdl(report: Report, s: Setup) -> None:
    """A decode step's GEMVs at batch 1 as they follow each other (qkv, o, gate_up, down, 28 times,
    each reading the last one's output), replayed in a CUDA graph with programmatic dependent
    launch and without: what PDL takes off the gaps between them (final/kernels/gemv.py)."""
    x = torch.randn(1, s.gemv_shapes["qkv"][1], device=s.device).to(s.act)
    weights = [torch.randn(n, k, device=s.device).to(s.act) / k**0.5 for n, k in (s.gemv_shapes[name] for name in LAYER_SHAPES)]  # fmt: skip
    layers = 28 if s.device == "cuda" else 2

    def chain(pdl: bool) -> torch.Tensor:
        y = x
        for _ in range(layers):
            for w in weights:
                y = gemv.triton_linear(y[:, : w.shape[1]], w, pdl=pdl)
        return y

    pdl = gemv.use_pdl(x)
    report.check("gemv chain with PDL = without", torch.equal(chain(pdl), chain(False)))
    if not pdl:  # no PDL here (the CPU's --smoke, a GPU before Hopper): nothing to compare
        return
    report.time(
        "gemv_chain", f"m1_{layers}layers_pdl", timed(lambda: chain(True)), timed(lambda: chain(False))
    )


PARTS = {
    "kv-write": bench_kv_write,
    "fused": bench_fused,
    "sampling": bench_sampling,
    "step-metadata": bench_step_metadata,
    "decode-attention": bench_decode_attention,
    "gemv": bench_gemv,
    "gemv-pdl": bench_gemv_pdl,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the result JSON (default: print only)")
    parser.add_argument("--smoke", action="store_true", help="toy shapes on the CPU, Triton's interpreter")
    parser.add_argument("--only", nargs="+", choices=PARTS, help="these parts only (default: all of them)")
    args = parser.parse_args(argv)
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"  # before Triton's first import (the kernels' first build)
        setup = SMOKE
    else:
        assert torch.cuda.is_available(), "needs a CUDA GPU (or --smoke)"
        assert sampling_kernels.available(torch.zeros(1, device="cuda")), "needs FlashInfer"
        setup = QWEN3_06B
    torch.manual_seed(0)
    report = Report()
    parts = args.only or list(PARTS)
    if args.smoke and "decode-attention" in parts:  # FlashInfer: GPU only
        parts.remove("decode-attention")
    advice = {}
    for part in parts:
        advice = PARTS[part](report, setup) or advice  # the GEMV's advice; the others return None
    failed = [c["name"] for c in report.checks if not c["ok"]]
    print(f"\n{len(report.checks) - len(failed)}/{len(report.checks)} checks passed; GEMV: {advice}")
    result = {
        "name": f"kernels_{args.out.stem.split('_', 1)[-1] if args.out else 'gpu'}",
        "stage": "final",
        "workload": "kernels",
        "metrics": report.metrics,
        "config": {"shapes": "toy" if args.smoke else "qwen3-0.6b", "dtype": str(setup.act).split(".")[-1]},
        "hardware": describe(),
        "versions": versions(),
        "command": shlex.join(
            ["python", "-m", "scripts.bench_kernels", *(sys.argv[1:] if argv is None else argv)]
        ),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "checks": report.checks,
        "rows": report.rows,
        "gemv_advice": advice,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(stamp_run_id(result), indent=1) + "\n")
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
