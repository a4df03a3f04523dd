"""FlashInfer's paged decode kernel over a bf16 and an FP8 KV cache, with and without tensor cores:
one layer-call's time at the shapes of issue 32 (Qwen3-0.6B's heads: 16 query heads, 8 KV heads of
128, pages of 16 tokens). Needs a CUDA GPU and FlashInfer.

    python -m scripts.bench_kv_fp8_decode --out benchmarks/results/h200/kv_fp8_decode_kernel_h200.json

Each (batch, context) gets its own pool of random K and V, every request's pages scattered over it
as a serving pool's are; each kernel is planned once, run `--warmup` times, then `--iters` times
back to back between two CUDA events (the GPU never waits for the host at these sizes: a call
takes hundreds of microseconds). The FP8 cache is the bf16 one cast to float8_e4m3fn, run with
k_scale = v_scale = 1.0 as final/ runs it without checkpoint scales. The result file's metrics are
`us_b<batch>_c<context>_<bf16|fp8>[_tc]`; it also checks that the four kernels agree.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch

from stages.common.bench import stamp_run_id
from stages.common.hardware import describe, versions

# (batch, context): issue 32's table, then batch 1 (the latency workload's 512-token context, and a
# long one), where the FP8 step measured slower than bf16's and which kernel to use is still open.
SHAPES = ((256, 1024), (256, 4096), (64, 16384), (1, 512), (1, 4096))
HEADS, KV_HEADS, HEAD_DIM, PAGE = 16, 8, 128, 16
WORKSPACE_BYTES = 128 * 1024 * 1024


def time_shape(flashinfer, batch: int, context: int, warmup: int, iters: int) -> dict[str, float]:
    pages_each = -(-context // PAGE)
    num_pages = batch * pages_each
    shape = (num_pages, PAGE, KV_HEADS, HEAD_DIM)
    k = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    v = torch.randn(shape, dtype=torch.bfloat16, device="cuda")
    caches = {"bf16": (k, v), "fp8": (k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn))}
    q = torch.randn(batch, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages_each
    indices = torch.randperm(num_pages, device="cuda").to(torch.int32)
    last_page_len = torch.full((batch,), context - (pages_each - 1) * PAGE, dtype=torch.int32)
    workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
    times, outputs = {}, {}
    for kv, cache in caches.items():
        for tensor_cores in (False, True):
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                workspace, "NHD", use_tensor_cores=tensor_cores
            )
            wrapper.plan(indptr, indices, last_page_len, HEADS, KV_HEADS, HEAD_DIM, PAGE,
                         pos_encoding_mode="NONE", q_data_type=torch.bfloat16, kv_data_type=cache[0].dtype)  # fmt: skip
            scales = {"k_scale": 1.0, "v_scale": 1.0} if kv == "fp8" else {}
            for _ in range(warmup):
                out = wrapper.run(q, cache, **scales)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                wrapper.run(q, cache, **scales)
            end.record()
            end.synchronize()
            key = f"us_b{batch}_c{context}_{kv}{'_tc' if tensor_cores else ''}"
            times[key] = 1000 * start.elapsed_time(end) / iters
            outputs[key] = out.float()
            print(f"[kv-decode] batch {batch}, context {context}: {key} {times[key]:.1f} us", file=sys.stderr)
    # The kernels must agree: tensor cores or not, and fp8 within what e4m3's rounding moves.
    bf16 = outputs[f"us_b{batch}_c{context}_bf16"]
    for key, out in outputs.items():
        error = ((out - bf16).norm() / bf16.norm()).item()
        assert error < (0.1 if "fp8" in key else 0.02), f"{key} differs from bf16 CUDA-core by {error:.3f}"
    return times


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="the result file (a .json path)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (FlashInfer's kernels)")
    import flashinfer

    torch.manual_seed(0)
    metrics: dict[str, float] = {}
    for batch, context in SHAPES:
        metrics |= time_shape(flashinfer, batch, context, args.warmup, args.iters)
        torch.cuda.empty_cache()
    result = {
        "name": args.out.stem,
        "stage": "flashinfer",
        "workload": "kv-decode-kernel",
        "label": "this repository's run",
        "metrics": metrics,
        "config": {
            "heads": HEADS,
            "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "page_size": PAGE,
            "iters": args.iters,
            "scales": 1.0,
        },  # fmt: skip
        "hardware": describe(),
        "versions": versions(),
        "command": shlex.join(["python", "-m", "scripts.bench_kv_fp8_decode", *argv]),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(stamp_run_id(result), indent=2) + "\n")
    print(f"[kv-decode] -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
