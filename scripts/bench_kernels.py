"""Check and time final/kernels on a CUDA GPU against the torch code they replace, at Qwen3-0.6B's
shapes: the K/V write, the fused q/k norm + RoPE + K/V write, sampling, and the small-M GEMV.

Every kernel is first checked against its reference on fresh random inputs (pools poisoned with
NaN, page sizes 1, 16 and 64, CUDA-graph padding rows), then both are timed: `graph_us` is the
median of CUDA-graph replays (triton.testing.do_bench_cudagraph: launch cost out, as in a
captured decode step), `gpu_us` the GPU's kernel time per call under the torch profiler (for the
sampler, which runs outside the graphs, its host time shows in `wall_us`). One JSON result,
a short table, and exit status 1 if a check failed:

    python scripts/bench_kernels.py --out benchmarks/results/h200/kernels_h200.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from final.core.sampling_params import SamplingParams  # noqa: E402
from final.engine.sampler import Sampler  # noqa: E402
from final.kernels import gemv, kv_write, qk_norm_rope_kv  # noqa: E402
from final.kernels import sampling as sampling_kernels  # noqa: E402
from final.models import fused  # noqa: E402
from stages.common.bench import stamp_run_id  # noqa: E402
from stages.common.hardware import describe, versions  # noqa: E402

HEADS, KV_HEADS, DIM, HIDDEN, INTER, VOCAB = 16, 8, 128, 1024, 3072, 151936  # Qwen3-0.6B
GEMV_SHAPES = {"qkv": (4096, HIDDEN), "o": (HIDDEN, 2048), "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER), "lm_head": (VOCAB, HIDDEN)}  # fmt: skip
LAYER_SHAPES = ("qkv", "o", "gate_up", "down")
BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


def gpu_us(fn, iters: int = 30) -> float:
    """GPU time per call: the kernels' durations in a profiled window, summed."""
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
    return sum(e.get("dur", 0) for e in events if e.get("cat") in kinds) / iters


def graph_us(fn) -> float:
    """Median time of one call, replayed in a CUDA graph (launch cost out)."""
    import triton.testing

    return 1e3 * triton.testing.do_bench_cudagraph(fn, rep=30, return_mode="median")


def timed(fn, graph: bool = True) -> dict[str, float]:
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
        key = "graph_us" if "graph_us" in ours else "gpu_us"
        row = {"kernel": kernel, "case": case, "ours": ours, "reference": reference, **extra}
        row["speedup"] = reference[key] / ours[key]
        self.rows.append(row)
        for side, times in (("ours", ours), ("ref", reference)):
            for what, value in times.items():
                self.metrics[f"{kernel}_{case}_{side}_{what}"] = round(value, 3)
        print(f"{kernel:12} {case:18} ours {ours[key]:9.2f} us   reference {reference[key]:9.2f} us   x{row['speedup']:.2f}", flush=True)  # fmt: skip


def pool(tokens: int, page_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, int]:
    pages = -(-tokens // page_size) + 4
    cache = torch.full(((pages + 1) * page_size, KV_HEADS, DIM), float("nan"), device="cuda").to(dtype)
    return cache, pages


def step_slots(tokens: int, pages: int, page_size: int) -> torch.Tensor:
    padding = min(3, tokens - 1)  # a graph step's padding rows share the padding page's slot
    live = torch.randperm(pages * page_size, device="cuda")[: tokens - padding]
    return torch.cat([live, torch.full((padding,), pages * page_size, device="cuda")]).to(torch.int32)


def same(got: torch.Tensor, want: torch.Tensor, page_size: int, rel: float = 0.0) -> bool:
    got, want = got[:-page_size].float(), want[:-page_size].float()  # the padding page is garbage
    if not torch.equal(got.isnan(), want.isnan()):
        return False
    written = ~want.isnan()
    return bool(
        ((got[written] - want[written]).abs() <= rel * want[written].abs() + (1e-2 if rel else 0)).all()
    )


def qkv_input(tokens: int) -> torch.Tensor:
    return torch.randn(tokens, (HEADS + 2 * KV_HEADS) * DIM, device="cuda", dtype=BF16) * 4


def bench_kv_write(report: Report, token_counts: list[int]) -> None:
    for tokens in token_counts:
        qkv = qkv_input(tokens)
        k = qkv[:, HEADS * DIM : (HEADS + KV_HEADS) * DIM].view(tokens, KV_HEADS, DIM)
        v = qkv[:, (HEADS + KV_HEADS) * DIM :].view(tokens, KV_HEADS, DIM)
        for dtype in (BF16, FP8):
            for page_size in (1, 16, 64):
                cache, pages = pool(tokens, page_size, dtype)
                slots = step_slots(tokens, pages, page_size)
                got = [cache.clone(), cache.clone()]
                want = [cache.clone(), cache.clone()]
                kv_write.triton_store_kv(*got, slots, k, v, 0.4, 1.7)
                kv_write.torch_store_kv(*want, slots, k, v, 0.4, 1.7)
                ok = all(same(g, w, page_size) for g, w in zip(got, want, strict=True))
                report.check(f"kv_write T={tokens} {dtype} page={page_size}", ok)
        cache, pages = pool(tokens, 16, BF16)
        slots = step_slots(tokens, pages, 16)
        caches = (cache, cache.clone())
        report.time(
            "kv_write",
            f"t{tokens}",
            timed(lambda: kv_write.triton_store_kv(*caches, slots, k, v)),  # noqa: B023
            timed(lambda: kv_write.torch_store_kv(*caches, slots, k, v)),  # noqa: B023
        )


def bench_fused(report: Report, token_counts: list[int]) -> None:
    cos_sin = torch.randn(40960, DIM, device="cuda")
    weights = [torch.randn(DIM, device="cuda", dtype=BF16) for _ in range(2)]
    for tokens in token_counts:
        qkv = qkv_input(tokens)
        positions = torch.randint(0, 40960, (tokens,), device="cuda", dtype=torch.int32)
        for dtype in (BF16, FP8):
            for page_size in (1, 16, 64):
                cache, pages = pool(tokens, page_size, dtype)
                slots = step_slots(tokens, pages, page_size)
                got, want = [cache.clone(), cache.clone()], [cache.clone(), cache.clone()]
                args = (qkv, HEADS, KV_HEADS, positions, cos_sin)
                q = qk_norm_rope_kv.triton_qk_norm_rope_kv(*args, *got, slots, *weights, 1e-6, 0.5, 2.0)
                q_ref = qk_norm_rope_kv.torch_qk_norm_rope_kv(*args, *want, slots, *weights, 1e-6, 0.5, 2.0)
                q_err = ((q.float() - q_ref.float()).norm() / q_ref.float().norm()).item()
                rel = 0.13 if dtype == FP8 else 0.01
                ok = (
                    q_err < 1e-2
                    and same(got[0], want[0], page_size, rel)
                    and same(got[1], want[1], page_size)
                )
                report.check(f"fused T={tokens} {dtype} page={page_size}", ok, f"q rel error {q_err:.2e}")
        cache, pages = pool(tokens, 16, BF16)
        slots = step_slots(tokens, pages, 16)
        caches = (cache, cache.clone())

        def op_by_op(store):
            q, k, v = qkv.split([HEADS * DIM, KV_HEADS * DIM, KV_HEADS * DIM], dim=-1)  # noqa: B023
            q = fused.rms_norm(q.view(tokens, HEADS, DIM), weights[0], 1e-6)  # noqa: B023
            k = fused.rms_norm(k.view(tokens, KV_HEADS, DIM), weights[1], 1e-6)  # noqa: B023
            q, k = fused.apply_rope(q, k, positions, cos_sin)  # noqa: B023
            store(*caches, slots, k, v.view(tokens, KV_HEADS, DIM))  # noqa: B023

        ours = timed(lambda: qk_norm_rope_kv.triton_qk_norm_rope_kv(qkv, HEADS, KV_HEADS, positions, cos_sin, *caches, slots, *weights, 1e-6))  # noqa: B023  # fmt: skip
        report.time(
            "fused_norm_rope_kv", f"t{tokens}", ours, timed(lambda: op_by_op(kv_write.torch_store_kv))
        )
        report.time("fused_norm_rope_kv", f"t{tokens}_vs_triton_store", ours, timed(lambda: op_by_op(kv_write.triton_store_kv)))  # fmt: skip


def bench_sampling(report: Report, batches: list[int]) -> None:
    # Exactness: greedy and top_k=1 rows are the argmax; frequencies: tests/test_final_gpu_kernels.py
    for batch in batches:
        for temperature in (0.0, 0.6):
            logits = torch.randn(batch, VOCAB, device="cuda", dtype=BF16) * 3
            params = [SamplingParams(temperature=temperature)] * batch  # the offline workload's
            sampler = Sampler(batch, torch.device("cuda"))
            for row, p in enumerate(params):
                sampler.admit(row, p)
            rows = torch.arange(batch, device="cuda", dtype=torch.int32)
            gens = [None] * batch
            tokens = sampler.sample(logits, rows, params, gens).tokens
            if temperature == 0:
                report.check(f"sampling greedy B={batch}", torch.equal(tokens, logits.argmax(-1)))
            else:
                ranks = (logits.float().gather(1, tokens[:, None]) < logits.float()).sum(1)  # tokens above
                report.check(f"sampling t=0.6 B={batch} draws likely tokens", bool((ranks < 2000).all()))

            def ours():
                sampler.sample(logits, rows, params, gens)  # noqa: B023

            def reference():  # the previous path: the model's float32 copy of the logits, the torch draw
                sampler.sample(logits.float(), rows, params, gens)  # noqa: B023

            measured = timed(ours, graph=False)
            available = sampling_kernels.available
            sampling_kernels.available = lambda logits: False  # the sampler's reference path
            try:
                report.time("sampling", f"b{batch}_t{temperature}", measured, timed(reference, graph=False))
            finally:
                sampling_kernels.available = available


def bench_gemv(report: Report, ms: list[int]) -> dict:
    wins: dict[str, list[int]] = {name: [] for name in GEMV_SHAPES}
    for name, (n, k) in GEMV_SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=BF16) / k**0.5
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=BF16)
            err = (gemv.triton_linear(x, w).float() - F.linear(x.float(), w.float())).norm() / F.linear(x.float(), w.float()).norm()  # fmt: skip
            report.check(f"gemv {name} M={m}", err.item() < 1e-2, f"rel error {err.item():.2e}")
            ours = timed(lambda: gemv.triton_linear(x, w))  # noqa: B023
            cublas = timed(lambda: F.linear(x, w))  # noqa: B023
            extra = {"tb_per_s": round(n * k * 2 / ours["graph_us"] / 1e6, 2)}
            if m in (1, 4):  # a few other tilings: does the default leave time on the table?
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
            if ours["graph_us"] < cublas["graph_us"]:
                wins[name].append(m)
    max_m = 0
    for m in sorted(ms):
        if all(m in wins[name] for name in LAYER_SHAPES):
            max_m = m
        else:
            break
    return {"GEMV_MAX_M": max_m, "lm_head_wins_at_m": wins["lm_head"], "wins": wins}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="the result JSON (default: print only)")
    parser.add_argument("--quick", action="store_true", help="fewer sizes (a smoke run)")
    args = parser.parse_args(argv)
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    assert sampling_kernels.available(torch.zeros(1, device="cuda")), "needs FlashInfer"
    torch.manual_seed(0)
    report = Report()
    tokens = [1, 256] if args.quick else [1, 64, 256, 4096]
    bench_kv_write(report, tokens)
    bench_fused(report, tokens)
    bench_sampling(report, [1, 256] if args.quick else [1, 64, 256])
    advice = bench_gemv(report, [1, 4] if args.quick else [1, 2, 4, 8])
    failed = [c["name"] for c in report.checks if not c["ok"]]
    print(f"\n{len(report.checks) - len(failed)}/{len(report.checks)} checks passed; GEMV: {advice}")
    gpu = torch.cuda.get_device_name()
    result = {
        "name": f"kernels_{args.out.stem.split('_', 1)[1] if args.out else 'gpu'}",
        "stage": "final",
        "workload": "kernels",
        "metrics": report.metrics,
        "config": {"shapes": "qwen3-0.6b", "dtype": "bfloat16", "quick": args.quick},
        "hardware": describe(),
        "versions": versions(),
        "command": shlex.join(
            ["python", "scripts/bench_kernels.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "checks": report.checks,
        "rows": report.rows,
        "gemv_advice": advice,
        "gpu_name": gpu,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(stamp_run_id(result), indent=1) + "\n")
        print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
