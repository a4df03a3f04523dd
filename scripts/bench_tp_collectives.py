"""Chapter 07's CPU experiment: how many collectives a tensor-parallel decode step makes, and what
they cost, at TP 1, 2 and 4 over gloo.

    python -m scripts.bench_tp_collectives                         # TP 1, 2, 4; 3 fresh processes each
    python -m scripts.bench_tp_collectives --tp 2 --repeats 1 --out /tmp/tp   # a quick look

The model has Qwen3-0.6B's layout, 28 layers and 16 query heads over 8 KV heads, on a small
hidden size (256) so that a CPU runs it in milliseconds: the count of collectives depends only on
the layers, and on a CPU their cost is mostly latency, not bytes. Stage 07 serves `--batch`
random prompts with overlap off, and after a warm-up every decode step is timed. Rank 0's calls
to `torch.distributed` are counted and timed by wrapping the functions stage 07 calls through the
`dist` module: the model's all-reduces and all-gather and the token broadcast (the device group,
gloo on a CPU), and the step message (`broadcast_object_list` on the host group, which sends the
message's size, then its bytes). A collective's time on rank 0 includes waiting for the slowest
rank, which is what it costs the step.

One result per degree, `benchmarks/results/stage07_collectives_tp<N>_cpu.json` (workload
`tp-collectives`), the medians over the repeats, each repeat a fresh process.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

# torch.distributed's functions that stage 07 calls (distributed.py), and what the table calls them.
COLLECTIVES = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_single": "all_gather",
    "broadcast": "broadcast",
    "broadcast_object_list": "step_message",
}
KINDS = ("all_reduce", "all_gather", "broadcast", "step_message")
SHAPE = dict(
    num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=32, hidden_size=256,
    intermediate_size=768, max_position_embeddings=2048,
)  # fmt: skip


def make_model(folder: Path) -> Path:
    from tests.fixtures.tiny_models import make_tiny_checkpoint

    if not (folder / "config.json").is_file():
        make_tiny_checkpoint(folder, "qwen3", seed=0, **SHAPE)
    return folder


class Counter:
    """Wraps torch.distributed's collectives in this process: calls and seconds per kind."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = defaultdict(int)
        self.seconds: dict[str, float] = defaultdict(float)

    def install(self) -> None:
        import torch.distributed as dist

        for name, kind in COLLECTIVES.items():
            real = getattr(dist, name, None)
            if real is not None:
                setattr(dist, name, self._wrap(real, kind))

    def _wrap(self, real, kind: str):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return real(*args, **kwargs)
            finally:
                self.calls[kind] += 1
                self.seconds[kind] += time.perf_counter() - start

        return timed

    def reset(self) -> None:
        self.calls.clear()
        self.seconds.clear()


def measure(model: Path, tp: int, batch: int, prompt_len: int, warmup: int, steps: int) -> dict[str, float]:
    """One fresh engine at degree `tp`: per decode step, the collectives of each kind, their time
    on rank 0, and the step's time (medians over `steps` steps)."""
    import torch

    from stages.common.sampling import SamplingParams

    torch.manual_seed(0)
    counter = Counter()
    counter.install()  # before the engine: stage 07 looks the functions up at each call
    stage = importlib.import_module("stages.07_tensor_parallel")
    with stage.LLM(str(model), device="cpu", tp=tp, disable_overlap=True) as llm:
        vocab = llm.config.vocab_size
        params = SamplingParams(temperature=0, max_tokens=warmup + steps + 4, ignore_eos=True)
        for _ in range(batch):
            llm.add_request(torch.randint(0, vocab, (prompt_len,)).tolist(), params)
        llm.step()  # the prefill of every prompt (they fit one step's budget)
        for _ in range(warmup):
            llm.step()
        per_step: list[dict[str, float]] = []
        for _ in range(steps):
            counter.reset()
            start = time.perf_counter()
            llm.step()
            step_s = time.perf_counter() - start
            row = {"step_ms": 1000 * step_s}
            for kind in KINDS:
                row[f"{kind}_per_step"] = float(counter.calls.get(kind, 0))
                row[f"{kind}_ms_per_step"] = 1000 * counter.seconds.get(kind, 0.0)
            row["collective_ms_per_step"] = sum(row[f"{k}_ms_per_step"] for k in KINDS)
            per_step.append(row)
    metrics = {key: statistics.median(r[key] for r in per_step) for key in per_step[0]}
    metrics["collective_share"] = metrics["collective_ms_per_step"] / metrics["step_ms"]
    calls = metrics["all_reduce_per_step"]
    metrics["all_reduce_us_each"] = 1000 * metrics["all_reduce_ms_per_step"] / calls if calls else 0.0
    order = ["step_ms", "collective_ms_per_step", "collective_share", "all_reduce_per_step",
             "all_reduce_us_each", "all_gather_per_step", "broadcast_per_step", "step_message_per_step"]  # fmt: skip
    return {k: metrics[k] for k in order} | {k: v for k, v in metrics.items() if k not in order}


def child(args: argparse.Namespace) -> int:
    metrics = measure(args.model, args.tp[0], args.batch, args.prompt_len, args.warmup, args.steps)
    Path(args.child_out).write_text(json.dumps(metrics))
    return 0


def run_degree(args: argparse.Namespace, model: Path, tp: int) -> dict[str, Any]:
    from stages.common.bench import script_result

    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "metrics.json"
            cmd = [sys.executable, "-m", "scripts.bench_tp_collectives", "--child", "--child-out", str(out), "--model", str(model),
                   "--tp", str(tp), "--batch", str(args.batch), "--prompt-len", str(args.prompt_len),
                   "--warmup", str(args.warmup), "--steps", str(args.steps)]  # fmt: skip
            print(f"[tp-collectives] tp={tp} run {repeat + 1}/{args.repeats}", file=sys.stderr, flush=True)
            # One thread per rank, every rank: more threads than free cores make every op wait for a
            # descheduled thread (the Makefile's BENCH_THREADS says why), and the ranks share the cores.
            env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
            subprocess.run(cmd, check=True, cwd=ROOT, env=env)
            runs.append(json.loads(out.read_text()))
    metrics = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
    result: dict[str, Any] = script_result(
        "scripts.bench_tp_collectives",
        None,
        name=f"stage07_collectives_tp{tp}_cpu",
        stage="07_tensor_parallel",
        workload="tp-collectives",
        label=f"TP={tp}",
        metrics=metrics,
        config={
            "tp": tp,
            "batch": args.batch,
            "prompt_len": args.prompt_len,
            "steps": args.steps,
            "device": "cpu",
            "dtype": "float32",
            "backend": "gloo",
            "overlap": "off",
            "threads_per_rank": 1,
            "model": "qwen3-0.6b-layout (28 layers, 16/8 heads), hidden 256",
            "repeats": args.repeats,
        },  # fmt: skip
    )
    if len(runs) > 1:
        result["runs"] = runs
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tp", type=int, action="append", help="a degree (repeatable); default 1, 2, 4")
    parser.add_argument("--batch", type=int, default=4, help="requests decoding together")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3, help="decode steps before the timed ones")
    parser.add_argument("--steps", type=int, default=16, help="timed decode steps")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per degree (medians)")
    parser.add_argument("--model", type=Path, default=ROOT / "build" / "tp-collectives-model")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    model = make_model(args.model)
    args.out.mkdir(parents=True, exist_ok=True)
    for tp in args.tp or [1, 2, 4]:
        result = run_degree(args, model, tp)
        path = args.out / f"{result['name']}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        m = result["metrics"]
        print(f"{path}: step {m['step_ms']:.2f} ms, collectives {m['collective_ms_per_step']:.2f} ms "
              f"({m['all_reduce_per_step']:.0f} all-reduces, {m['all_gather_per_step']:.0f} all-gather, "
              f"{m['broadcast_per_step']:.0f} broadcast, {m['step_message_per_step']:.0f} step message)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
