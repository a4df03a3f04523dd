"""Where a batch-1 decode step's time goes: stage 01 or HF transformers `generate`, under torch.profiler.

    python -m scripts.profile_decode --engine stages.01_naive_generate --device cpu --scale 0.25
    python -m scripts.profile_decode --engine hf --device cuda --dtype bfloat16 --model checkpoints/qwen3-0.6b-random

Chapter 01's H200 table shows HF's decode step well above stage 01's although both do the same
arithmetic. This separates the candidates: how many operators (`aten_ops_per_step`) and, on a GPU,
how many kernels (`cuda_kernels_per_step`) a step issues, how long the GPU is busy per step
(`gpu_busy_ms_per_step`), against the wall time of a step (`step_ms`, measured without the
profiler). A step whose wall time is far above its GPU busy time is waiting on the host (Python,
launches), not on the GPU. The latency workload's prompt is used; the per-step figures are the
difference between a run of 1 + `--steps` tokens and a run of 1 token, divided by `--steps`.
The result is a file of benchmarks/README.md's schema (workload `decode-profile`), so the chapter's
table shows it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def make_runner(args: argparse.Namespace):
    """A function generating n greedy tokens for the latency prompt, and the run's description."""
    import torch

    from stages.common.devices import pick_device, pick_dtype, synchronize
    from stages.common.model_config import load_model_config
    from stages.common.model_source import resolve_model
    from stages.common.sampling import SamplingParams
    from stages.common.workloads import latency

    folder = resolve_model(args.model)
    config = load_model_config(folder, None)
    (item,) = latency(config.vocab_size, scale=args.scale).items
    prompt = item.prompt_ids
    if args.engine == "hf":
        from transformers import AutoModelForCausalLM

        device = pick_device(args.device)
        dtype = pick_dtype(args.dtype, config.dtype, device)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
        ids = torch.tensor([prompt], device=device)

        def run(n: int) -> None:
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n,
                               min_new_tokens=n, pad_token_id=0)  # fmt: skip
            synchronize(device)

        return run, device, dtype
    llm = importlib.import_module(args.engine).LLM(args.model, device=args.device, dtype=args.dtype)

    def run(n: int) -> None:
        llm.generate([prompt], SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=n))
        synchronize(llm.device)

    return run, llm.device, llm.dtype


def profile_counts(run, n: int, cuda: bool) -> tuple[int, int, float]:
    """(aten operators, CUDA kernels, GPU busy microseconds) of one run of n tokens."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        run(n)
    events = prof.events()
    aten = sum(1 for e in events if e.name.startswith("aten::"))
    kernels = [e for e in events if getattr(e.device_type, "name", "") == "CUDA"]
    return aten, len(kernels), sum(e.device_time_total for e in kernels)


def measure(args: argparse.Namespace) -> tuple[dict[str, float], str, str]:
    run, device, dtype = make_runner(args)
    cuda = device.type == "cuda"
    for _ in range(2):  # warm-up: kernels loaded, allocator caches filled
        run(1 + args.steps)
    walls = []
    for n in (1, 1 + args.steps):
        best = float("inf")
        for _ in range(3):  # the fastest of three: the least disturbed by other work
            start = time.perf_counter()
            run(n)
            best = min(best, time.perf_counter() - start)
        walls.append(best)
    (a1, k1, g1), (a2, k2, g2) = (profile_counts(run, n, cuda) for n in (1, 1 + args.steps))
    metrics = {
        "step_ms": 1000 * (walls[1] - walls[0]) / args.steps,
        "aten_ops_per_step": (a2 - a1) / args.steps,
    }
    if cuda:
        metrics |= {
            "cuda_kernels_per_step": (k2 - k1) / args.steps,
            "gpu_busy_ms_per_step": (g2 - g1) / 1000 / args.steps,
        }
    return metrics, device.type, str(dtype).removeprefix("torch.")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", default="stages.01_naive_generate", help="a stage module, or hf")
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--scale", type=float, default=1.0, help="of the latency workload's prompt")
    parser.add_argument("--steps", type=int, default=16, help="decode steps measured")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--name", required=True, help="e.g. stage01_profile_h200 or stage01_profile_hf_h200")
    args = parser.parse_args(argv)
    from stages.common.bench import model_label, stage_of
    from stages.common.hardware import describe, versions

    metrics, device, dtype = measure(args)
    result: dict[str, Any] = {
        "name": args.name,
        "stage": stage_of(args.engine),
        "workload": "decode-profile",
        "metrics": metrics,
        "config": {
            "scale": args.scale,
            "steps": args.steps,
            "model": model_label(args.model),
            "device": device,
            "dtype": dtype,
        },  # fmt: skip
        "hardware": describe(),
        "versions": versions(),
        "command": shlex.join(["python", "-m", "scripts.profile_decode", *argv]),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"[profile] {args.name}: " + ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()), file=sys.stderr)


if __name__ == "__main__":
    main()
