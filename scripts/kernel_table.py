"""The GPU kernels of one decode step of final/ or a peer engine, per kernel and per category.

    python -m scripts.kernel_table --engine final --batch 1 256 --temperature 0 0.6 --json out.json
    PYTHONPATH=.peers/minisgl:$PYTHONPATH python -m scripts.kernel_table --engine mini-sglang ...

A decode step cannot be cut out of an engine's offline call from the outside, so it is measured
as a difference: the same prompts (`batch` of them, 512 random tokens each, already in the prefix
cache after a warm-up) asked for 1 token and for 1 + `steps` tokens under torch.profiler. The
prefill and the per-call work cancel; what is left, divided by `steps`, is one decode step:
kernel launches and GPU microseconds per kernel name, grouped by scripts/kernel_breakdown.py's
categories.

Kernels may overlap: with programmatic dependent launch (final/'s GEMV, FlashInfer's norm and
activation kernels) a kernel starts while its predecessor finishes and waits on the device, so
its duration includes time the predecessor's already covers, and durations summed count that
stretch twice (on an H100, final/'s batch-1 kernels summed to more than its whole step). So each
kernel also gets its *exclusive* time: the part of its run no earlier-starting kernel of the call
covered (kernels sorted by start; the first to occupy a stretch owns it). Categories are summed
from exclusive times (`by_category_us`), and `busy_us_per_step` is the union of the kernels'
intervals: the GPU's busy time in a step, whose complement in the step is its idle time.
`gpu_us_per_step` stays the plain sum of durations (what earlier results hold). The engines run through their public offline APIs (scripts/bench_peer.py builds
them), so both are measured by the same code. This is ../shared/peers/kernel_diff.py made a
project script: JSON out, the engines built in one place.

`--prefill-prompts N` adds a prefill table: one call of N fresh prompts of 512 tokens (none in the
prefix cache; a warm-up call of other fresh prompts first) asked for one token, profiled whole:
the kernels of prefilling N x 512 tokens (16,384 at N = 32, one step at both engines' prefill
budget) and sampling one token each. The decode table shows where a decode step's time goes; this
one shows the prefill's, where an offline run spends the rest (issue 31).
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
from pathlib import Path
from typing import Any

from scripts import kernel_breakdown as kb
from scripts.bench_peer import ENGINES, final_engine

ROOT = Path(__file__).resolve().parents[1]

PROMPT_TOKENS = 512
TOP_KERNELS = 30


BUSY = "__busy__"  # a profile's key for the union of its kernels' intervals (µs), not a kernel


def exclusive_times(intervals: list[tuple[str, float, float]]) -> dict[str, tuple[int, float, float]]:
    """{name: (launches, summed µs, exclusive µs)} of (name, start µs, end µs) device intervals,
    and under BUSY the union of the intervals (module docstring)."""
    out: dict[str, list[float]] = {}
    busy_until, busy = float("-inf"), 0.0
    for name, start, end in sorted(intervals, key=lambda i: (i[1], i[2])):
        mine = max(0.0, end - max(start, busy_until))
        busy += mine
        busy_until = max(busy_until, end)
        entry = out.setdefault(name, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += end - start
        entry[2] += mine
    table = {name: (int(n), us, excl) for name, (n, us, excl) in out.items()}
    table[BUSY] = (0, busy, busy)
    return table


def step_table(kernels_1: dict[str, tuple], kernels_n: dict[str, tuple], steps: int) -> dict[str, Any]:
    """One decode step from two profiles, {kernel name: (launches, GPU µs[, exclusive µs])} of a
    1-token call and of a (1 + steps)-token call: the difference per step, per kernel and per
    category (by exclusive time where the profiles have it)."""

    def parts(entry: tuple) -> tuple[float, float, float]:
        return (entry[0], entry[1], entry[2] if len(entry) > 2 else entry[1])

    rows = []
    for name, entry in kernels_n.items():
        if name == BUSY:
            continue
        count, us, excl = parts(entry)
        count_1, us_1, excl_1 = parts(kernels_1.get(name, (0, 0.0, 0.0)))
        rows.append((name, (count - count_1) / steps, (us - us_1) / steps, (excl - excl_1) / steps))
    rows.sort(key=lambda row: -row[2])
    by_category: collections.Counter[str] = collections.Counter()
    for name, _, _, excl in rows:
        by_category[kb.category(kb.short_name(name)[1])] += excl
    table = {
        "kernels_per_step": round(sum(row[1] for row in rows), 1),
        "gpu_us_per_step": round(sum(row[2] for row in rows), 1),
        "by_category_us": {cat: round(us, 1) for cat, us in by_category.most_common()},
        "top": [[kb.short_name(name)[0], round(n, 2), round(us, 1), round(excl, 1)] for name, n, us, excl in rows[:TOP_KERNELS]],
    }  # fmt: skip
    if BUSY in kernels_n:
        busy_1 = kernels_1.get(BUSY, (0, 0.0, 0.0))[1]
        table["busy_us_per_step"] = round((kernels_n[BUSY][1] - busy_1) / steps, 1)
    return table


def fresh_prompts(rng: random.Random, n: int, vocab: int) -> list[list[int]]:
    """n prompts of PROMPT_TOKENS random ids: a new call's are fresh (no prefix cache hit)."""
    return [[rng.randrange(3, vocab - 1) for _ in range(PROMPT_TOKENS)] for _ in range(n)]


def prefill_table(kernels: dict[str, tuple], prompts: int) -> dict[str, Any]:
    """A whole profiled call of `prompts` fresh prompts and one token each: its kernels, totals and
    categories as step_table gives them, with the prompt tokens it prefilled."""
    return {"phase": "prefill", "prompts": prompts, "prompt_tokens": prompts * PROMPT_TOKENS} | step_table(
        {}, kernels, 1
    )


def profile_call(
    generate, prompts: list[list[int]], tokens: int, temperature: float
) -> dict[str, tuple[int, float, float]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        generate(prompts, [tokens] * len(prompts), temperature)
        torch.cuda.synchronize()
    intervals = [
        (event.name, event.time_range.start, event.time_range.start + event.device_time)
        for event in prof.events()
        if event.device_type.name == "CUDA"
    ]
    return exclusive_times(intervals)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", required=True, choices=sorted(ENGINES))
    parser.add_argument("--model", type=Path, default=ROOT / "checkpoints/qwen3-0.6b-random")
    parser.add_argument("--attn", default="fi")
    parser.add_argument(
        "--batch", type=int, nargs="*", default=[1, 256], help="decode tables (none: --batch)"
    )
    parser.add_argument(
        "--prefill-prompts", type=int, default=0, help="add a prefill table of N fresh prompts"
    )
    parser.add_argument("--temperature", type=float, nargs="+", default=[0.0, 0.6])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--json", type=Path, required=True, help="where the tables go (a JSON list)")
    parser.add_argument(
        "--final-path", type=Path, default=None, help="with --engine final: another final/'s folder"
    )
    args = parser.parse_args(argv)
    if args.final_path is not None:
        generate = final_engine(args.model, args.attn, args.final_path)
    else:
        generate = ENGINES[args.engine](args.model, args.attn)
    vocab = json.loads((args.model / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    tables = []
    for batch in args.batch:
        prompts = fresh_prompts(rng, batch, vocab)
        for temperature in args.temperature:
            generate(prompts, [4] * batch, temperature)  # warm-up; the prompts enter the prefix cache
            one = profile_call(generate, prompts, 1, temperature)
            many = profile_call(generate, prompts, 1 + args.steps, temperature)
            table = {"engine": args.engine, "batch": batch, "temperature": temperature, "steps": args.steps}
            table |= step_table(one, many, args.steps)
            tables.append(table)
            print(
                f"[kernel_table] {args.engine} batch {batch} t={temperature}: {table['kernels_per_step']} kernels, "
                f"{table['gpu_us_per_step']} GPU us a step",
                file=sys.stderr,
                flush=True,
            )
    if args.prefill_prompts:
        generate(fresh_prompts(rng, args.prefill_prompts, vocab), [1] * args.prefill_prompts, 0.0)  # warm-up
        kernels = profile_call(generate, fresh_prompts(rng, args.prefill_prompts, vocab), 1, 0.0)
        table = {"engine": args.engine} | prefill_table(kernels, args.prefill_prompts)
        tables.append(table)
        print(
            f"[kernel_table] {args.engine} prefill of {table['prompt_tokens']} tokens: {table['kernels_per_step']} "
            f"kernels, {table['gpu_us_per_step']} GPU us",
            file=sys.stderr,
            flush=True,
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(tables, indent=1) + "\n")


if __name__ == "__main__":
    main()
