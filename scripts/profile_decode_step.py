"""Profile decode steps under the torch profiler into a small JSON: stage 05's one decode step,
eager and replayed from a CUDA graph; stage 06's run of consecutive steps, overlap off and on; or
final/'s run of consecutive steps as it serves (CUDA graphs and overlap on) and with both off.

    python -m scripts.profile_decode_step --model checkpoints/qwen3-0.6b-random --device cuda \\
        --dtype bfloat16 --attn fi --page-size 16 --batch 1 --out benchmarks/profiles/h200
    python -m scripts.profile_decode_step --stage 06_overlap --steps 8 --model checkpoints/qwen3-0.6b-random \\
        --device cuda --dtype bfloat16 --attn fi --page-size 16 --batch 64 --out benchmarks/profiles/h200
    python -m scripts.profile_decode_step --stage final --steps 8 --model checkpoints/qwen3-0.6b-random \\
        --device cuda --dtype bfloat16 --attn fi --page-size 16 --batch 64 --out benchmarks/profiles/h200
    python -m scripts.render_profile    # the JSON files -> docs/assets/profiles/*.png: chapters 05, 06, Performance

`batch` requests with random `prompt_len`-token prompts are prefilled, a few decode steps warm
both paths up, then the torch profiler records one whole engine step (`LLM.step()`: schedule,
forward, sample) with the graphs switched off and one with them on. From each trace the script
keeps, relative to the step's start: the host's CUDA calls (kernel launches, graph launches,
copies, synchronisations) and the GPU's kernels and copies. That is what the chapter's figure
draws: on the host, a thousand launches one after another; on the GPU, short kernels with gaps
between them, waiting for the next launch. Each mode also keeps `kernels`, where the GPU's time
went, per step: the kernels grouped by a short name and sorted into categories (gemm, attention,
norm, ...; scripts/kernel_breakdown.py), the top 25 by time and the rest as one row. No list of
every kernel's name: the JSON stays small.

For stage 06 the window holds `--steps` consecutive `LLM.step()` calls (graphs on, as the stage
runs by default), once with overlap off and once with it on, on the same engine: the figure shows
the GPU idle between steps while the host processes and schedules, and the gaps closing with
overlap. `gpu_idle_ms` is the time in the window, up to the GPU's last kernel, with no GPU work.

`--stage final` profiles final/ itself the same way, `--steps` consecutive `LLM.step()` calls
(default 8): first with its CUDA graphs and overlap both switched off (eager decode, the serial
loop), then as it serves, both on. Its fused kernels have no switch: they are on in both runs.

On a machine without CUDA the script still runs (with `--device cpu`, the graphs replaced by the
stage's CPU stand-in, `EagerGraph`; final/'s overlapped loop runs as it does on a CPU, each step's
work done at its launch): the trace has no GPU then, and the host lane shows the operators. That
is only a check that the pipeline works, never a figure for the book.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import shlex
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from scripts import kernel_breakdown

STEP_LABEL = "decode step"
STAGES = ("05_cuda_graph", "06_overlap", "final")
# The two runs each stage compares: (key in the JSON's "modes", what changes).
STAGE_MODES = {
    "05_cuda_graph": ("eager", "graph"),
    "06_overlap": ("serial", "overlap"),
    "final": ("eager_serial", "served"),
}
HOST_CATEGORIES = ("cuda_runtime", "cuda_driver")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


# ---------------------------------------------------------------------------------------------
# From a chrome trace to the numbers we keep


def host_kind(name: str) -> str:
    """What a host-side CUDA call does, for the figure's colours."""
    if "GraphLaunch" in name:
        return "graph"
    if "Launch" in name:
        return "launch"
    if "Synchronize" in name or "Memcpy" in name:
        return "copy/sync"
    return "other"


def top_level(events: list[dict]) -> list[dict]:
    """The events not nested inside another one of the list (per thread)."""
    kept: list[dict] = []
    ends: dict[Any, float] = {}
    for e in sorted(events, key=lambda e: (e["ts"], -e.get("dur", 0))):
        if e["ts"] >= ends.get(e.get("tid"), float("-inf")):
            kept.append(e)
            ends[e.get("tid")] = e["ts"] + e.get("dur", 0)
    return kept


def summarise_trace(trace: dict, steps: int = 1) -> dict[str, Any]:
    """The step's window (the `decode step` annotation on the host), the host's CUDA calls in it,
    and the GPU's work from its start on; times in microseconds from the step's start. With GPU
    work, `kernels` says per step (of the window's `steps`) which kernels took the time."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    marks = [e for e in events if e.get("cat") == "user_annotation" and e.get("name") == STEP_LABEL]
    if len(marks) != 1:
        raise ValueError(f"expected one '{STEP_LABEL}' annotation in the trace, found {len(marks)}")
    start, end = float(marks[0]["ts"]), float(marks[0]["ts"]) + float(marks[0]["dur"])

    def inside(e: dict) -> bool:
        return start <= float(e["ts"]) <= end

    host = [e for e in events if e.get("cat") in HOST_CATEGORIES and inside(e)]
    # GPU work from the window's start on (a kernel already running then counts from the start).
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES and float(e["ts"]) + float(e["dur"]) > start]
    if host:
        host_lane = [[float(e["ts"]) - start, float(e["dur"]), host_kind(e["name"])] for e in host]
    else:  # a CPU trace: no CUDA calls, the host lane shows the operators themselves
        ops = top_level([e for e in events if e.get("cat") == "cpu_op" and inside(e)])
        host_lane = [[float(e["ts"]) - start, float(e["dur"]), "operator"] for e in ops]
    gpu = sorted(gpu, key=lambda e: e["ts"])
    gpu_lane = []
    for e in gpu:
        t = float(e["ts"]) - start
        gpu_lane.append([max(t, 0.0), float(e["dur"]) + min(t, 0.0)])
    busy = union_length([(t, t + d) for t, d in gpu_lane])
    gpu_end = max((t + d for t, d in gpu_lane), default=0.0)
    summary = {
        "step_ms": (end - start) / 1000,
        "gpu_busy_ms": busy / 1000,
        "gpu_idle_ms": (gpu_end - busy) / 1000 if gpu_lane else 0.0,
        "gpu_kernels": sum(1 for e in gpu if e.get("cat") == "kernel"),
        "launches": sum(1 for _, _, kind in host_lane if kind in ("launch", "graph")),
        "host": [[round(t, 1), round(d, 1), kind] for t, d, kind in host_lane],
        "gpu": [[round(t, 1), round(d, 1)] for t, d in gpu_lane],
    }
    if gpu_lane:  # the same work as the GPU lane, by kernel: names and (clipped) durations
        work = [(e["name"], d) for e, (_, d) in zip(gpu, gpu_lane, strict=True)]
        summary["kernels"] = kernel_breakdown.breakdown(work, steps, busy)
    return summary


def union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    total, reach = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


# ---------------------------------------------------------------------------------------------
# Running the engine under the profiler


def profile_step(llm, device, steps: int = 1) -> dict[str, Any]:
    """`steps` consecutive engine steps in one profiled window (the GPU is idle when it opens,
    unless a step of an overlapped loop is still in flight)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if not step_in_flight(llm):  # an overlapped loop keeps its step in flight
        sync()
    with profile(activities=activities) as prof:
        with record_function(STEP_LABEL):
            for _ in range(steps):
                llm.step()
        sync()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return summarise_trace(json.loads(path.read_text()), steps)


def step_in_flight(llm) -> bool:
    """Whether an overlapped loop has launched a step it has not collected yet (final/ keeps them
    in a queue, stage 06 in one attribute; stage 05 has none)."""
    core = getattr(llm, "core", None)
    if core is not None:
        return bool(core.in_flight)
    return getattr(llm, "in_flight", None) is not None


def set_overlap(llm, on: bool) -> None:
    """Switch a stage 06 engine's overlap on or off between steps (a step in flight is processed
    first: the serial loop has none)."""
    if not on and llm.in_flight is not None:
        previous, llm.in_flight = llm.in_flight, None
        llm.process(previous)
    llm.overlap = on


def set_final_mode(llm, served: bool, graphs) -> None:
    """Switch final/ between steps to how it serves (its decode graphs and overlap on) or to both
    off. The serial loop keeps no step in flight: the one the overlapped loop left is collected
    first, and its tokens go to the requests as `LLM.step` would hand them over."""
    core = llm.core
    if not served:
        while core.in_flight:
            for delta in core.collect(core.in_flight.popleft()):
                llm.requests[delta.rid].apply(delta)
    core.overlap = served
    core.executor.graphs = graphs if served else None


def load_engine(args: argparse.Namespace):
    """The engine to profile and its graph runner (`LLM`, `GraphRunner`, whether it is the CPU
    stand-in), sized for `args.batch` decoding requests."""
    sizes = dict(max_running_requests=max(args.batch, 1), cuda_graph_max_bs=args.batch)
    common = dict(device=args.device, dtype=args.dtype, attn=args.attn, page_size=args.page_size)
    if args.stage == "final":
        import final
        from final.engine import graph

        llm = final.LLM(args.model, overlap="on", **common, **sizes)  # overlap "on": on the CPU too
        owner = llm.core.executor  # final/'s executor owns the graphs; a stage's runner does
        runner = owner.runner
    else:
        stage = importlib.import_module(f"stages.{args.stage}")
        graph = importlib.import_module(f"stages.{args.stage}.graph")
        llm = stage.LLM(args.model, **common, **sizes)
        owner = runner = llm.runner
    stand_in = owner.graphs is None
    if stand_in and args.stage == "final" and llm.device.type == "cuda":
        raise SystemExit("final/ captured no CUDA graphs (its log says why): there is nothing to compare")
    if stand_in:  # no CUDA: replay through the CPU stand-in, so both paths still run
        owner.graphs = graph.GraphRunner(runner, args.batch, graph.EagerGraph)
    return llm, owner.graphs, stand_in


def set_mode(llm, stage: str, mode: str, graphs) -> None:
    """Put the engine into one of its stage's two modes (STAGE_MODES), between steps."""
    if stage == "05_cuda_graph":
        llm.runner.graphs = graphs if mode == "graph" else None
    elif stage == "06_overlap":
        set_overlap(llm, mode == "overlap")
    else:
        set_final_mode(llm, mode == "served", graphs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="HF folder (default: the default model)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--attn", default="auto")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1, help="requests decoding together")
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/profiles"), help="folder for the JSON")
    parser.add_argument(
        "--name", default=None, help="file name (default: stage<NN>_decode_step_b<batch>_<device>)"
    )
    parser.add_argument("--stage", choices=STAGES, default="05_cuda_graph", help="which stage's comparison")
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per window (default: 1; stage 06 and final: 8)"
    )
    args = parser.parse_args(argv)
    steps = args.steps or (1 if args.stage == "05_cuda_graph" else 8)

    from stages.common.hardware import describe, versions

    if args.stage == "final":
        from final import SamplingParams
    else:
        from stages.common.sampling import SamplingParams

    llm, graphs, stand_in = load_engine(args)
    scheduler = llm.core.scheduler if args.stage == "final" else llm.scheduler
    rng = random.Random(0)
    vocab = min(llm.config.vocab_size, 10_000)
    total_steps = 2 * (args.warmup_steps + steps) + 8
    params = SamplingParams(temperature=0, ignore_eos=True, max_tokens=total_steps + 4)
    for _ in range(args.batch):
        llm.add_request([rng.randrange(vocab) for _ in range(args.prompt_len)], params)
    while any(not r.output_ids for r in [*scheduler.running, *scheduler.waiting]):
        llm.step()  # prefill (chunked if the prompts exceed the budget)
    modes = {}
    for mode in STAGE_MODES[args.stage]:
        set_mode(llm, args.stage, mode, graphs)
        for _ in range(args.warmup_steps):
            llm.step()
        modes[mode] = profile_step(llm, llm.device, steps)

    hardware = describe()
    device_name = hardware.get("gpu") or hardware.get("cpu")
    result = {
        "kind": "decode-step-profile",
        "stage": args.stage,
        "steps": steps,
        "model": Path(args.model).name if args.model else "SmolLM2-135M-Instruct",
        "device": str(device_name),
        "device_type": llm.device.type,
        "stand_in": stand_in,
        "batch": args.batch,
        "prompt_len": args.prompt_len,
        "attn": args.attn,
        "dtype": str(llm.dtype).removeprefix("torch."),
        "modes": modes,
        "hardware": hardware,
        "versions": versions(),
        "command": shlex.join(["python", "-m", "scripts.profile_decode_step", *(argv or sys.argv[1:])]),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    prefix = "final" if args.stage == "final" else f"stage{args.stage[:2]}"
    name = args.name or f"{prefix}_decode_step_b{args.batch}_{llm.device.type}"
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{name}.json"
    path.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    for mode, m in modes.items():
        print(f"{mode:12} {steps} step(s) {m['step_ms']:.2f} ms, GPU busy {m['gpu_busy_ms']:.2f} ms, "
              f"idle {m['gpu_idle_ms']:.2f} ms, {m['gpu_kernels']} kernels, {m['launches']} launches")  # fmt: skip
        if "kernels" in m:  # GPU microseconds per step by category, the largest first
            print("    " + ", ".join(f"{c['category']} {c['us']:.0f} us" for c in m["kernels"]["categories"]))
    print(f"-> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
