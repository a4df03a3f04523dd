"""The host's cost of one decode step of final/, by phase, measured on the CPU.

    python -m scripts.bench_host_step                       # decode batches 64 and 256, a table
    python -m scripts.bench_host_step --batch 256 --profile # and cProfile's top functions

With CUDA graphs and overlap scheduling the host prepares step N+1 while the GPU runs step N, so
once the host's work per step exceeds the GPU's decode step (a few ms at batch 256 on an H200),
the host sets the pace. That work is Python and device-independent, so it is measured here on the
CPU, on final/'s own engine (the offline `LLM` loop, overlap on, decode graphs), with the parts that
are the GPU's replaced by near-free stand-ins:

- the model: a tiny random checkpoint whose forward is replaced by a view of fixed random logits
  (prefill steps run no model either: only the host's bookkeeping around them is real);
- the decode graphs: `GraphRunner` with a graph whose replay does nothing, so a decode step runs
  exactly the host code a GPU step runs (staging the inputs, the attention plan, the logits view);
- the attention backend: the FlashInfer backend (what `--attn auto` serves on Hopper) with a
  stand-in FlashInfer whose `plan` does nothing; all of our side of the plan runs. `--attn torch`
  takes the torch backend instead, whose replay plans nothing.

The device operations a step queues (copies, index_select, the sampler's kernels) run on the CPU
here: on small tensors each costs about what a kernel launch costs the host on a GPU, but the
sampler's softmax and draw over [batch, vocab] are real work, so the vocabulary is kept small.

`batch` requests with prompts of uniform length in [100, 1024] (the offline workload's) and room
for every measured step are prefilled, `--warmup` decode steps run, then `--steps` decode steps are
timed, each one `LLM.step()` (schedule and launch step N+1, collect step N, detokenize). Phases are
exclusive: a phase's time excludes the phases timed inside it; `other` is the rest of the step
(the engine's own loops in launch and collect, the frontend's per-request loop). Not a figure for
the book on a shared machine: compare runs of two trees in alternation and take medians.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import importlib
import io
import json
import pstats
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

import final
from final.attention.base import AttentionBackend
from final.attention.flashinfer_backend import FlashInferBackend
from final.core.sampling_params import SamplingParams
from final.engine.graph import EagerGraph, GraphRunner
from tests.fixtures.tiny_models import make_tiny_checkpoint

PAGE_SIZE = 16  # the H200 benchmark's (--attn fi --page-size 16)
VOCAB = 32  # small: the sampler's arithmetic over [batch, vocab] is the GPU's work, not the host's
MIN_PROMPT, MAX_PROMPT = 100, 1024  # the offline workload's lengths
PREFILL_BUDGET = 16384  # final/'s default max_prefill_length on a GPU (set: the CPU's is smaller)

# (class or module, attribute, phase): the calls timed. Names missing from a tree are skipped, so
# one script measures two versions of the engine.
PHASES: list[tuple[str, str, str]] = [
    ("final.scheduler.scheduler:Scheduler", "schedule", "schedule"),
    ("final.engine.core:EngineCore", "_admit_rows", "admit rows"),
    ("final.scheduler.request:ScheduledBatch", "step_input", "step input"),
    ("final.engine.runner:ModelRunner", "stage_decode", "stage inputs"),
    ("final.engine.runner:ModelRunner", "prepare", "stage inputs"),
    ("final.kvcache.page_table:PageTable", "flush", "stage inputs"),
    ("final.attention.flashinfer_backend:FlashInferBackend", "_plan_now", "attention plan"),
    ("final.attention.torch_backend:TorchBackend", "prepare", "attention plan"),
    ("final.engine.graph:GraphRunner", "run", "graph replay"),
    ("final.engine.sampler:Sampler", "sample", "sample"),
    ("final.engine.runner:ModelRunner", "record_tokens", "record tokens"),
    ("final.engine.core", "to_host", "record tokens"),
    ("final.scheduler.scheduler:Scheduler", "cache_request", "prefix cache"),
    ("final.engine.core:EngineCore", "collect", "collect"),
    ("final.scheduler.scheduler:Scheduler", "finish", "collect"),
    ("final.engine.core:EngineCore", "step", "engine step"),  # the engine, apart from the above
]


# The thread's CPU time, not the wall clock: on a machine shared with other work the process is
# descheduled now and then, which the wall clock counts and the CPU time does not.
now = time.thread_time


class PhaseClock:
    """Exclusive CPU time per phase: a call's time minus the timed calls inside it."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self.children: list[float] = []  # per open timed call: time spent in timed calls inside it
        self.on = False

    def wrap(self, fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not clock.on:
                return fn(*args, **kwargs)
            clock.children.append(0.0)
            start = now()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = now() - start
                inner = clock.children.pop()
                clock.totals[phase] += elapsed - inner
                if clock.children:
                    clock.children[-1] += elapsed

        return timed

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Every call in PHASES timed while inside; the engine's classes restored on leaving."""
        originals: list[tuple[Any, str, Any]] = []
        for target, name, phase in PHASES:
            module_name, _, cls = target.partition(":")
            try:
                owner: Any = importlib.import_module(module_name)
            except ImportError:
                continue
            if cls:
                owner = getattr(owner, cls, None)
            if owner is not None and name in vars(owner):
                originals.append((owner, name, vars(owner)[name]))
                setattr(owner, name, self.wrap(getattr(owner, name), phase))
        try:
            yield
        finally:
            for owner, name, original in reversed(originals):
                setattr(owner, name, original)


# ------------------------------------------------------------------ stand-ins for the GPU's parts


class StandInModel:
    """Logits without a forward pass: a view of fixed random rows, one per sampled token."""

    def __init__(self, rows: int, vocab: int):
        self.logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0))

    def __call__(self, batch: Any, backend: Any, out: torch.Tensor | None = None) -> torch.Tensor:
        last = batch.last_token_index  # None: every row (a decode graph's batch)
        logits = self.logits[: batch.size if last is None else last.shape[0]]
        return logits if out is None else out.copy_(logits)


class NoReplayGraph(EagerGraph):
    """Capture runs the step once (it fills the logits buffer); a replay is the GPU's: nothing here."""

    def replay(self) -> None:
        pass


class StandInPlanWrapper:
    """FlashInfer's wrapper with a `plan` that does nothing (its host work is the library's)."""

    def __init__(self, *args: Any, **kwargs: Any):
        pass

    def plan(self, *args: Any, **kwargs: Any) -> None:
        pass


class StandInFlashInfer(FlashInferBackend):
    """final/'s FlashInfer backend on the CPU: every line of ours runs, the library's calls do not."""

    def __init__(self, config, pool, page_table, num_heads=None):  # noqa: ANN001
        AttentionBackend.__init__(self, config, pool, page_table, num_heads)
        wrapper = StandInPlanWrapper
        self.flashinfer = SimpleNamespace(BatchDecodeWithPagedKVCacheWrapper=wrapper)
        self.workspace = torch.empty(0, dtype=torch.uint8)
        self.prefill_wrapper = wrapper()
        self.group = 4  # tensor cores, whatever the batch
        self.decode_wrapper = self.current = wrapper()
        self.decode_wrappers = {True: self.decode_wrapper}
        self.last_plan = None
        self.graph_wrappers = {}
        self.graph_buffers = None

    def _plan(self, wrapper, batch, graphed: bool = False) -> None:  # noqa: ANN001
        self._plan_now(wrapper, batch, graphed)  # no CUDA event to wait on or record


# ------------------------------------------------------------------ the run


def build_llm(model_dir: Path, batch: int, room: int, attn: str) -> final.LLM:
    """An offline LLM on the CPU with overlap on, decode graphs and the stand-ins above."""
    pages_per_request = -(-(MAX_PROMPT + room) // PAGE_SIZE)
    llm = final.LLM(
        str(model_dir),
        device="cpu",
        dtype="float32",
        page_size=PAGE_SIZE,
        num_pages=batch * pages_per_request + 64,
        max_running_requests=batch,
        max_prefill_length=PREFILL_BUDGET,
        overlap="on",
    )
    # The executor owns the runner and the graphs (before it, the runner owned the graphs).
    owner = getattr(llm.core, "executor", None) or llm.core.runner
    runner = getattr(owner, "runner", owner)
    runner.model = StandInModel(runner.buffers.max_tokens, llm.config.vocab_size)
    if attn == "fi":
        runner.backend = StandInFlashInfer(llm.config, runner.pool, runner.page_table)
    owner.graphs = GraphRunner(runner, batch, NoReplayGraph)
    return llm


def measure(
    clock: PhaseClock,
    model_dir: Path,
    batch: int,
    steps: int,
    warmup: int,
    attn: str,
    seed: int,
    profile: bool,
) -> dict:
    # Room for every step: requests admitted first decode while the later ones are prefilled.
    prefill_steps = -(-batch * MAX_PROMPT // PREFILL_BUDGET)
    room = prefill_steps + warmup + steps + 8
    llm = build_llm(model_dir, batch, room, attn)
    rng = random.Random(seed)
    params = SamplingParams(temperature=0.6, ignore_eos=True, max_tokens=room)
    for _ in range(batch):
        length = rng.randint(MIN_PROMPT, MAX_PROMPT)
        llm.add_request([rng.randrange(3, VOCAB) for _ in range(length)], params)
    scheduler = llm.core.scheduler
    while scheduler.waiting or not all(r.is_decoding for r in scheduler.running):
        llm.step()  # the prefill steps (a model-free forward)
    for _ in range(warmup):
        llm.step()
    cpu: list[float] = []  # per step: the thread's CPU time
    wall: list[float] = []
    clock.totals.clear()
    clock.on = True
    profiler = cProfile.Profile() if profile else None
    for _ in range(steps):
        assert len(scheduler.running) == batch, "a request finished or was preempted mid-measurement"
        if profiler is not None:
            profiler.enable()
        start, start_wall = now(), time.perf_counter()
        llm.step()
        cpu.append(now() - start)
        wall.append(time.perf_counter() - start_wall)
        if profiler is not None:
            profiler.disable()
    clock.on = False
    phases = {name: total / steps * 1e3 for name, total in clock.totals.items()}
    # The frontend: LLM.step's time outside the engine's step (apply each delta, detokenize).
    phases["frontend (detokenize)"] = statistics.fmean(cpu) * 1e3 - sum(phases.values())
    result = {
        "batch": batch,
        "step_ms_median": statistics.median(cpu) * 1e3,
        "step_ms_mean": statistics.fmean(cpu) * 1e3,
        # The fastest tenth of the steps: less sensitive to other work on a shared machine.
        "step_ms_p10": statistics.quantiles(cpu, n=10)[0] * 1e3,
        "wall_ms_median": statistics.median(wall) * 1e3,
        "phases_ms": phases,
    }
    if profiler is not None:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(30)
        result["profile"] = out.getvalue()
        # Deterministic, unlike any time on a shared machine: Python calls per step.
        result["calls_per_step"] = stats.total_calls / steps  # type: ignore[attr-defined]
    return result


ORDER = [
    "schedule",
    "admit rows",
    "step input",
    "stage inputs",
    "attention plan",
    "graph replay",
    "sample",
    "record tokens",
    "prefix cache",
    "engine step",
    "collect",
    "frontend (detokenize)",
]


def table(results: list[dict]) -> str:
    header = f"{'host CPU ms per step':<24}" + "".join(f"{'batch ' + str(r['batch']):>12}" for r in results)
    lines = [header, "-" * len(header)]
    names = ORDER + sorted({n for r in results for n in r["phases_ms"]} - set(ORDER))
    for name in names:
        if all(name not in r["phases_ms"] for r in results):
            continue
        lines.append(f"{name:<24}" + "".join(f"{r['phases_ms'].get(name, 0.0):>12.3f}" for r in results))
    lines.append("-" * len(header))
    lines.append(f"{'step (mean)':<24}" + "".join(f"{r['step_ms_mean']:>12.3f}" for r in results))
    lines.append(f"{'step (median)':<24}" + "".join(f"{r['step_ms_median']:>12.3f}" for r in results))
    lines.append(f"{'step (fastest 10%)':<24}" + "".join(f"{r['step_ms_p10']:>12.3f}" for r in results))
    lines.append(f"{'wall clock (median)':<24}" + "".join(f"{r['wall_ms_median']:>12.3f}" for r in results))
    if all("calls_per_step" in r for r in results):
        lines.append(
            f"{'Python calls per step':<24}" + "".join(f"{r['calls_per_step']:>12.0f}" for r in results)
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 256], help="decode batch sizes")
    parser.add_argument("--steps", type=int, default=100, help="decode steps timed per batch size")
    parser.add_argument("--warmup", type=int, default=10, help="decode steps run before timing")
    parser.add_argument(
        "--attn", choices=("fi", "torch"), default="fi", help="the backend whose host side runs"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="print cProfile's top functions too")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--model-dir", type=Path, help="a tiny checkpoint to reuse (made if missing)")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)  # host work is one thread; more would only add noise on a shared machine
    clock = PhaseClock()
    with clock.installed(), tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or Path(tmp) / "tiny"
        if not (model_dir / "config.json").exists():
            make_tiny_checkpoint(model_dir, "qwen3", vocab_size=VOCAB, max_position_embeddings=4096)
        results = []
        for batch in args.batch:
            print(
                f"[bench_host_step] batch {batch}: {args.steps} decode steps ...", file=sys.stderr, flush=True
            )
            results.append(
                measure(clock, model_dir, batch, args.steps, args.warmup, args.attn, args.seed, args.profile)
            )
    print(table(results))
    for r in results:
        if "profile" in r:
            print(f"\ncProfile, batch {r['batch']}, {args.steps} steps (tottime):\n{r['profile']}")
    if args.json:
        args.json.write_text(json.dumps({"attn": args.attn, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
