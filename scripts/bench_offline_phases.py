"""Where an offline run's time goes, step by step: prefill, decode at full batch, the draining tail.

    python -m scripts.bench_offline_phases --model checkpoints/qwen3-0.6b-random --out-dir benchmarks/results/h100

final/ serves Nano-vLLM's workload (the one `versus` measures: every request at once, prompts and
outputs of 100 to 1,024 tokens) through its offline `LLM`, after a warm-up on the same workload
(`--warmup` requests of another seed's prompts), and times each engine step without a profiler. A step's time is
the interval between the moment its tokens reached the host (`EngineCore.collect` returning) and
the moment the previous step's did. Under overlap scheduling the GPU runs the steps back to back,
so that interval is the step's GPU time plus whatever the GPU waited for the host; without overlap
it is the whole loop. Each step falls in one phase by what it carried:

    prefill   prompt tokens (whole prompts or chunks), with or without decodes beside them
    decode    decodes only, at least --full-share of the largest decode batch of the run
    tail      decodes only, fewer: the requests still running once most have finished

Per phase the result has its steps, seconds, share of the run, output tokens and output tokens a
second (`<phase>_s`, `<phase>_share`, ...; `prefill_prompt_tokens` for the prompt tokens
computed), and the host's mean time inside `launch` (`<phase>_launch_ms_mean`: prefill steps run
eagerly, kernel by kernel, so their launch may take as long as the step before it runs, and then
the GPU waits), and `lead_in_ms`, from the timed call's start to its first launch (the offline
API preparing the batch, inside the first step's interval), so the offline gap to Mini-SGLang (docs/serving/performance.md, "What is left") can be
placed: a slow prefill, a slow full-batch decode, or a long tail.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PHASES = ("prefill", "decode", "tail")


@dataclass(frozen=True)
class StepRecord:
    seconds: float  # from the previous step's tokens on the host to this step's
    prompt_tokens: int  # prompt tokens the step computed (whole prompts and chunks)
    decode_rows: int  # requests the step decoded one token for
    output_tokens: int  # tokens the step sampled (decodes, and prompts it finished)
    launch_seconds: float = 0.0  # the host's time inside `launch` (an eager step's kernel launches)
    lead_in_seconds: float = 0.0  # the run's first step only: from the run's start to its launch


def phase_of(step: StepRecord, full_batch: int, full_share: float) -> str:
    if step.prompt_tokens:
        return "prefill"
    return "decode" if step.decode_rows >= full_share * full_batch else "tail"


def phases(steps: list[StepRecord], full_share: float = 0.9) -> dict[str, float]:
    """The run's steps summed per phase (module docstring); `full_batch` is the largest decode
    batch of a decode-only step."""
    full_batch = max((s.decode_rows for s in steps if not s.prompt_tokens), default=0)
    total_s = sum(s.seconds for s in steps)
    out: dict[str, float] = {
        "total_s": total_s,
        "steps": len(steps),
        "output_tok_per_s": sum(s.output_tokens for s in steps) / total_s if total_s else 0.0,
        "full_batch": full_batch,
        "prefill_prompt_tokens": sum(s.prompt_tokens for s in steps),
        # From the run's start to its first launch: the offline API preparing the whole batch
        # (checks, queueing, the first schedule), inside the first step's interval.
        "lead_in_ms": 1e3 * steps[0].lead_in_seconds if steps else 0.0,
    }
    for phase in PHASES:
        mine = [s for s in steps if phase_of(s, full_batch, full_share) == phase]
        seconds = sum(s.seconds for s in mine)
        tokens = sum(s.output_tokens for s in mine)
        out |= {
            f"{phase}_steps": len(mine),
            f"{phase}_s": seconds,
            f"{phase}_share": seconds / total_s if total_s else 0.0,
            f"{phase}_output_tokens": tokens,
            f"{phase}_tok_per_s": tokens / seconds if seconds else 0.0,
            f"{phase}_step_ms_mean": 1e3 * seconds / len(mine) if mine else 0.0,
            # A launch that takes as long as a step means the GPU waited for the host there.
            f"{phase}_launch_ms_mean": 1e3 * sum(s.launch_seconds for s in mine) / len(mine) if mine else 0.0,
        }
    # The run's first step has no step before it to hide its launch behind (and its interval holds
    # the run's start): the prefill mean without it says what a steady prefill step costs.
    prefill = [s for s in steps if s.prompt_tokens]
    if len(prefill) > 1 and steps[0] is prefill[0]:
        rest = prefill[1:]
        out["prefill_first_step_ms"] = 1e3 * prefill[0].seconds
        out["prefill_first_launch_ms"] = 1e3 * prefill[0].launch_seconds
        out["prefill_rest_step_ms_mean"] = 1e3 * sum(s.seconds for s in rest) / len(rest)
        out["prefill_rest_launch_ms_mean"] = 1e3 * sum(s.launch_seconds for s in rest) / len(rest)
    return out


def prefill_detail(steps: list[StepRecord]) -> list[dict[str, float]]:
    """Each step that computed prompt tokens, in order: its time, its launch, what it carried."""
    return [
        {"ms": 1e3 * s.seconds, "launch_ms": 1e3 * s.launch_seconds, "prompt_tokens": s.prompt_tokens,
         "decode_rows": s.decode_rows}
        for s in steps
        if s.prompt_tokens
    ]  # fmt: skip


@contextmanager
def recording(core: Any) -> Iterator[list[StepRecord]]:
    """Records every step `core` (an EngineCore) launches and collects while the block runs: what
    the step carried is read at launch, before launching changes the requests; its time at collect."""
    steps: list[StepRecord] = []
    # id(handle) -> (prompt tokens, decode rows, launch s, lead-in s)
    carried: dict[int, tuple[int, int, float, float]] = {}
    launch, collect = core.launch, core.collect
    last = [time.perf_counter()]
    begun = last[0]

    def timed_launch(batch: Any, *between_layers: Any) -> Any:
        prompt_tokens, decode_rows = batch.load()
        start = time.perf_counter()
        first = not steps and not carried  # nothing launched before it
        lead_in = start - begun if first else 0.0
        handle = launch(batch, *between_layers)
        carried[id(handle)] = (prompt_tokens, decode_rows, time.perf_counter() - start, lead_in)
        return handle

    def timed_collect(handle: Any) -> Any:
        out = collect(handle)
        now = time.perf_counter()
        prompt_tokens, decode_rows, launched, lead_in = carried.pop(id(handle), (0, 0, 0.0, 0.0))
        steps.append(
            StepRecord(now - last[0], prompt_tokens, decode_rows, len(handle.sampled), launched, lead_in)
        )
        last[0] = now
        return out

    core.launch, core.collect = timed_launch, timed_collect
    try:
        yield steps
    finally:
        del core.launch, core.collect  # the instance attributes shadowed the methods


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("checkpoints/qwen3-0.6b-random"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--attn", default="fi")
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--scale", type=float, default=1.0, help="the workload's scale (1: Nano-vLLM's)")
    parser.add_argument("--warmup", type=int, default=32, help="requests of the workload run first, untimed")
    parser.add_argument("--full-share", type=float, default=0.9)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--name", default=None)
    args = parser.parse_args(argv)

    import torch

    import final
    from stages.common import hardware
    from stages.common.bench import script_result, write_result
    from stages.common.workloads import offline

    cpu = args.device == "cpu"
    kwargs: dict[str, Any] = {"attn": "torch"} if cpu else {"attn": args.attn, "page_size": args.page_size}
    llm = final.LLM(str(args.model), device=args.device, dtype="float32" if cpu else "bfloat16", **kwargs)

    def requests(items: list[Any]) -> tuple[list[dict[str, list[int]]], list[Any]]:
        return [{"prompt_token_ids": item.prompt_ids} for item in items], [
            final.SamplingParams(
                temperature=item.params.temperature, ignore_eos=True, max_tokens=item.params.max_tokens
            )
            for item in items
        ]

    workload = offline(llm.config.vocab_size, 0, args.scale)
    prompts, params = requests(workload.items)
    # The warm-up's prompts are another seed's: the same ones would be prefix-cache hits when timed.
    warm = offline(llm.config.vocab_size, 1, args.scale).items[: args.warmup]
    if warm:
        llm.generate(*requests(warm), progress=False)
    if not cpu:
        torch.cuda.synchronize()
    with recording(llm.core) as steps:
        llm.generate(prompts, params, progress=False)
    metrics = phases(steps, args.full_share)
    llm.close()
    for phase in PHASES:
        print(
            f"{phase:8s} {metrics[f'{phase}_steps']:6.0f} steps {metrics[f'{phase}_s']:8.3f} s "
            f"({metrics[f'{phase}_share']:5.1%}) {metrics[f'{phase}_output_tokens']:8.0f} output tokens "
            f"{metrics[f'{phase}_tok_per_s']:9.0f} tok/s, {metrics[f'{phase}_step_ms_mean']:.2f} ms a step, "
            f"{metrics[f'{phase}_launch_ms_mean']:.2f} ms of it launching"
        )
    print(f"total {metrics['total_s']:.3f} s, {metrics['output_tok_per_s']:.0f} output tok/s, "
          f"full batch {metrics['full_batch']:.0f}")  # fmt: skip
    if args.out_dir:
        device = hardware.device_tag(args.device)
        result = script_result(
            "scripts.bench_offline_phases", argv,
            name=args.name or f"final_offline_phases_{device}",
            stage="final",
            workload="offline-phases",
            config={"model": args.model.name, "attn": kwargs["attn"], "page_size": args.page_size,
                    "scale": args.scale, "warmup": args.warmup, "full_share": args.full_share,
                    **workload.settings},
            metrics=metrics,
            prefill_steps=prefill_detail(steps),
        )  # fmt: skip
        print(f"-> {write_result(result, args.out_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
