"""Does the host keep ahead of the GPU as final/ serves? Measured without a profiler.

    python -m scripts.bench_graph_launch --model checkpoints/qwen3-0.6b-random --batch 1 64

Under the torch profiler, final/'s served batch-1 step shows the GPU idle for 300-670 µs a step
while the host is inside the CUDA graph's launch (benchmarks/profiles/*/final_decode_step_b1_cuda.json),
but the profiler slows launches down itself. This script times the launches as they are: every
`CudaGraph.replay` of a decode step is wrapped to record (1) how long the host spends in it, and
(2) whether the GPU had already run out of work when it began (the stream's `query()`: True when
everything queued has finished). With overlap scheduling the next step should be queued before
the previous one ends, so the share of launches that find the GPU drained is the share of steps
that lose GPU time to the host; the launch time says whether the launch itself is the cost.

`batch` requests with 512-token random prompts and enough output room are run through `LLM.generate`
after a warm-up; one line per batch size. `--out-dir` writes them as one result file,
`final_graph_launch_<gpu>.json` (benchmarks/README.md's schema, metrics named per batch:
`launch_us_p50_b1`, `drained_share_b1`, ...), which the docs quote by macro; `--json` the bare rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def as_result(rows: list[dict[str, float]], model: str, attn: str, tokens: int) -> dict[str, Any]:
    """The rows as a result of benchmarks/README.md's schema, one metric per (figure, batch)."""
    from stages.common import hardware
    from stages.common.bench import script_result

    metrics = {
        f"{key}_b{row['batch']:g}": value for row in rows for key, value in row.items() if key != "batch"
    }
    return script_result(
        "scripts.bench_graph_launch", None,
        name=f"final_graph_launch_{hardware.device_tag('cuda')}",
        stage="final",
        workload="graph-launch",
        config={"model": Path(model).name, "attn": attn, "tokens": tokens, "prompt_tokens": 512,
                "batches": [row["batch"] for row in rows]},
        metrics=metrics,
    )  # fmt: skip


class LaunchMeter:
    """Wraps a replay: per call, the host's µs inside it and whether the stream was idle at its start."""

    def __init__(self, stream_idle: Callable[[], bool]):
        self.stream_idle = stream_idle
        self.launch_us: list[float] = []
        self.drained: list[bool] = []

    def wrap(self, replay: Callable[[Any], None]) -> Callable[[Any], None]:
        def timed(graph: Any) -> None:
            self.drained.append(self.stream_idle())
            start = time.perf_counter()
            replay(graph)
            self.launch_us.append((time.perf_counter() - start) * 1e6)

        return timed

    def reset(self) -> None:
        self.launch_us.clear()
        self.drained.clear()

    def summary(self) -> dict[str, float]:
        if not self.launch_us:
            return {"launches": 0}
        ordered = sorted(self.launch_us)
        return {
            "launches": len(ordered),
            "launch_us_p50": statistics.median(ordered),
            "launch_us_p90": ordered[int(0.9 * (len(ordered) - 1))],
            "drained_share": sum(self.drained) / len(self.drained),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="checkpoints/qwen3-0.6b-random")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--attn", default="fi")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--out-dir", type=Path, help="write final_graph_launch_<gpu>.json there")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("bench_graph_launch.py measures CUDA graph launches: it needs a CUDA GPU")
    import final
    from final.engine import graph as graph_module

    meter = LaunchMeter(lambda: torch.cuda.current_stream().query())
    graph_module.CudaGraph.replay = meter.wrap(graph_module.CudaGraph.replay)  # type: ignore[method-assign]
    llm = final.LLM(args.model, device="cuda", dtype="bfloat16", attn=args.attn, page_size=16)
    vocab = llm.config.vocab_size
    params = final.SamplingParams(temperature=0.0, max_tokens=args.tokens, ignore_eos=True)
    rows = []
    for batch in args.batch:
        prompts = [
            {"prompt_token_ids": [(97 * b + 13 * i) % vocab for i in range(512)]} for b in range(batch)
        ]
        llm.generate(prompts, params, use_tqdm=False)  # warm-up: the same shapes
        meter.reset()
        llm.generate(prompts, params, use_tqdm=False)
        row = {"batch": batch, **meter.summary()}
        rows.append(row)
        print(
            f"batch {batch}: {row['launches']} graph launches, host in the launch p50 "
            f"{row.get('launch_us_p50', 0):.1f} µs (p90 {row.get('launch_us_p90', 0):.1f}), "
            f"GPU already drained at {row.get('drained_share', 0):.1%} of them"
        )
    if args.out_dir:
        from stages.common.bench import write_result

        print(f"-> {write_result(as_result(rows, args.model, args.attn, args.tokens), args.out_dir)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"model": args.model, "attn": args.attn, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
