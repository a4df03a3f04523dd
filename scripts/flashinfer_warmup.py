"""FlashInfer's kernels compiled side by side before the first run on a fresh GPU host.

    python -m scripts.flashinfer_warmup                 # every job, in parallel
    python -m scripts.flashinfer_warmup --fp8           # and the FP8-cache attention kernels
    python -m scripts.flashinfer_warmup --list          # the jobs, one a line

FlashInfer compiles a kernel module the first time a process needs it, about a minute each on
Hopper, and a process meets them one after another: on a lent machine, which starts with none,
the first call of a session spent 5 to 8 minutes of its device time compiling (GPU_PLAN.md).
Here one process per kernel family runs that family once on tiny inputs, so the modules compile
at the same time on the host's cores (FlashInfer's per-module file locks keep two processes from
building one module twice); a later run finds them in FLASHINFER_WORKSPACE_BASE.

Each job goes through final/'s own call path (its FlashInfer attention backend, fused layers and
sampler), not through FlashInfer's module generators, so what it builds is what a run asks for,
whatever the module names of the FlashInfer version. A failed job is reported and the others go
on: it is a warm-up, the run after it compiles what is missing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# (head size, query heads per KV head): the decode module is chosen by head size and by whether
# the backend takes tensor cores (groups of 4 or more, and non-powers of two: flashinfer_backend
# `use_tensor_cores`), so these cover both kinds at Qwen3's 128 and the tiny and SmolLM2 models' 64.
ATTENTION_SHAPES = ((128, 2), (128, 4), (64, 1), (64, 4))
FP8_SHAPES = ((128, 2), (64, 4))
PAGE_SIZE = 16


@dataclass(frozen=True)
class Job:
    name: str  # attn:<head size>:<group>:<bf16|fp8>, fused or sampling

    def command(self) -> list[str]:
        return [sys.executable, "-m", "scripts.flashinfer_warmup", "--one", self.name]


def jobs(fp8: bool) -> list[Job]:
    names = [f"attn:{d}:{g}:bf16" for d, g in ATTENTION_SHAPES]
    if fp8:
        names += [f"attn:{d}:{g}:fp8" for d, g in FP8_SHAPES]
    return [Job(name) for name in [*names, "fused", "sampling", "stages"]]


def run_attention(head_dim: int, group: int, kv: str) -> None:
    """A prefill and a decode step through final/'s FlashInfer backend (its plan and its kernels)."""
    import torch

    from final.attention.choose import resolve_attention
    from final.attention.factory import create_backend
    from final.kvcache.page_table import PageTable
    from final.kvcache.pool import KVPool
    from tests.fixtures.paged_batches import (
        attention_config,
        make_batch,
        make_qkv,
        scattered_pages,
        write_pages,
    )

    device, compute = torch.device("cuda"), torch.bfloat16
    kv_dtype = torch.float8_e4m3fn if kv == "fp8" else compute
    config = attention_config(head_dim, heads=2 * group, kv_heads=2, max_context=1024)
    seq_lens = [37, 300]
    num_pages = sum(-(-n // PAGE_SIZE) for n in seq_lens) + 4
    pool = KVPool(config, num_pages, PAGE_SIZE, device, kv_dtype, compute_dtype=compute)
    table = PageTable(4, -(-config.max_context // PAGE_SIZE), device, pool.padding_page)
    write_pages(table, scattered_pages(PAGE_SIZE, seq_lens, num_pages))
    choice = resolve_attention("fi", device, compute, PAGE_SIZE, head_dim=head_dim, kv_dtype=kv_dtype)
    backend = create_backend(choice, config, pool, table)
    for batch in (
        make_batch(table, PAGE_SIZE, [0, 1], [37, 60], seq_lens),  # prefill: a prompt and a chunk
        make_batch(table, PAGE_SIZE, [0, 1], [1, 1], seq_lens),  # decode
    ):
        q, k, v = make_qkv(batch, config, compute, seed=0)
        backend.prepare(batch)
        backend.forward(0, q, k, v, batch)
    torch.cuda.synchronize()


def run_fused() -> None:
    """RMSNorm, residual add + RMSNorm, SiLU-and-multiply and RoPE as final/'s layers call them."""
    import torch

    from final.models import fused

    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    weight = torch.ones(1024, device="cuda", dtype=torch.bfloat16)
    fused.rms_norm(x, weight, 1e-6)
    fused.add_rms_norm(x, torch.randn_like(x), weight, 1e-6)
    fused.silu_and_mul(torch.randn(8, 2 * 1024, device="cuda", dtype=torch.bfloat16))
    q = torch.randn(8, 4, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(8, 2, 128, device="cuda", dtype=torch.bfloat16)
    cos_sin = torch.randn(64, 128, device="cuda", dtype=torch.float32)
    fused.apply_rope(q, k, torch.arange(8, device="cuda"), cos_sin)
    torch.cuda.synchronize()


def run_sampling() -> None:
    """FlashInfer's softmax and every filter of final/'s sampler, one draw each."""
    import torch

    from final.kernels.sampling import flashinfer_sample

    rows = 4
    logits = torch.randn(rows, 32000, device="cuda", dtype=torch.float32)
    temperature = torch.full((rows,), 0.7, device="cuda")
    index = torch.arange(rows, device="cuda")
    top_k = torch.full((rows,), 20, device="cuda", dtype=torch.int32)
    top_p = torch.full((rows,), 0.9, device="cuda")
    min_p = torch.full((rows,), 0.05, device="cuda")
    for filters in ((None, None, None), (top_k, None, None), (None, top_p, None), (top_k, top_p, min_p)):
        flashinfer_sample(logits, temperature, *filters, index)
    torch.cuda.synchronize()


def run_stages(device: str = "cuda", attn: str = "fi") -> list[list[int]]:
    """Stage 07 at TP 1, graphs and overlap on, on a tiny Qwen3-shaped model (head size 128, 2
    query heads per KV head): the stages' own FlashInfer calls (one backend file, copied from stage
    02 on), which final/'s jobs do not build. Stage 07's first GPU test ran past a whole call on a
    machine that had only final/'s kernels (2026-11-27). (`device="cpu", attn="torch"`: the same calls
    without kernels, for the CPU tests.)"""
    import importlib
    import tempfile
    from pathlib import Path

    import torch

    from stages.common.sampling import SamplingParams
    from tests.fixtures.tiny_models import make_tiny_checkpoint

    stage = importlib.import_module("stages.07_tensor_parallel")
    with tempfile.TemporaryDirectory(prefix="warmup-stages-") as tmp:
        model = make_tiny_checkpoint(
            Path(tmp), "qwen3", head_dim=128, num_attention_heads=8, num_key_value_heads=4
        )
        dtype = "bfloat16" if device == "cuda" else "float32"
        llm = stage.LLM(str(model), device=device, dtype=dtype, attn=attn, tp=1, page_size=PAGE_SIZE,
                        num_pages=256, max_running_requests=4, cuda_graph_max_bs=4, max_prefill_length=32)  # fmt: skip
        try:
            rids = [
                llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
                for prompt in ([5, 6, 7, 8] * 10, [9, 10, 11])  # a prompt cut into chunks, and a short one
            ]
            outputs = {}
            while llm.has_unfinished():
                outputs.update(llm.step())
        finally:
            llm.close()
    if device == "cuda":
        torch.cuda.synchronize()
    return [outputs[rid].token_ids for rid in rids]  # each request's tokens: what the job made


def run_one(name: str) -> None:
    if name.startswith("attn:"):
        _, head_dim, group, kv = name.split(":")
        run_attention(int(head_dim), int(group), kv)
    elif name == "fused":
        run_fused()
    elif name == "sampling":
        run_sampling()
    elif name == "stages":
        run_stages()
    else:
        raise SystemExit(f"unknown job {name!r}")


def built_since(workspace: Path, since: float) -> list[str]:
    """The kernel modules (shared libraries) under `workspace` written at or after `since` (a
    time.time()): what this warm-up compiled rather than found. A carried cache that ninja
    accepted leaves this empty; session 8's (2026-11-27) did not say, and the warm-up took 146 s."""
    if not workspace.is_dir():
        return []
    return sorted(so.stem for so in workspace.rglob("*.so") if so.stat().st_mtime >= since)


def run_all(selected: list[Job], workspace: Path | None = None) -> int:
    """Every job in its own process, all at once; a line per job as it ends, then which kernel
    modules under `workspace` were built; 0 if all succeeded."""
    start, started_at = time.perf_counter(), time.time()
    running = {job: subprocess.Popen(job.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for job in selected}  # fmt: skip
    failed = 0
    for job, proc in running.items():
        output, _ = proc.communicate()
        took = time.perf_counter() - start
        if proc.returncode == 0:
            print(f"[warmup] {job.name}: ready after {took:.0f} s", flush=True)
        else:
            failed += 1
            print(
                f"[warmup] {job.name}: FAILED (exit {proc.returncode}) after {took:.0f} s\n{output[-2000:]}",
                flush=True,
            )
    print(f"[warmup] {len(selected) - failed} of {len(selected)} jobs in {time.perf_counter() - start:.0f} s")
    if workspace is not None:
        built = built_since(workspace, started_at)
        print(f"[warmup] {len(built)} kernel modules compiled here, the rest found in {workspace}"
              + (f": {', '.join(built)}" if built else ""), flush=True)  # fmt: skip
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fp8", action="store_true", help="also the FP8-cache attention kernels")
    parser.add_argument("--list", action="store_true", help="print the jobs and exit")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a job's own process
    args = parser.parse_args(argv)
    if args.one:
        run_one(args.one)
        return 0
    selected = jobs(args.fp8)
    if args.list:
        print("\n".join(job.name for job in selected))
        return 0
    import torch

    if not torch.cuda.is_available():
        print(
            "flashinfer_warmup: needs a CUDA GPU (FlashInfer compiles for the GPU it finds)", file=sys.stderr
        )
        return 2
    workspace = os.environ.get("FLASHINFER_WORKSPACE_BASE")
    return run_all(selected, Path(workspace) if workspace else None)


if __name__ == "__main__":
    sys.exit(main())
