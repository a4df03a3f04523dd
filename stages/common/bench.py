"""The benchmark harness: one seeded workload, one engine, a fresh process per measured run.

    python -m stages.common.bench --engine stages.02_paged_kv --workload offline --scale 0.05
    python -m stages.common.bench --engine stages.02_paged_kv --workload offline --engine-arg attn=fi
    python -m stages.common.bench --engine hf --workload latency --dtype bfloat16 --repeats 3
    python -m stages.common.bench --engine stages.05_cuda_graph --workload decode-step --workload-arg batch=8
    python -m stages.common.bench --engine final --workload prefill --workload-arg lengths=512,2048,8192
    python -m stages.common.bench --engine stages.06_overlap --workload online --workload-arg rate=16

Each run happens in a child process (this module again, with `--child`), so nothing one run
compiled, cached or allocated helps the next; the child serves a small warm-up first and only
then starts the clock. With `--repeats N` every metric is the median over N children. The result
is one JSON file, `<out>/<name>.json`, in the schema of benchmarks/README.md.

Engines: any module exporting `LLM` (a stage, or `final`), or `hf` (HF transformers `generate`,
batch-1 latency only: the reference every stage is measured against). Engines with
`add_request`/`step` are fed each request at its arrival time, between steps, as a server would;
an engine with only `generate` serves the queued requests one at a time, in order.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the parent process only starts children: it never imports torch, so it starts fast
    from .outputs import RequestOutput
    from .sampling import SamplingParams
    from .workloads import WorkItem, Workload

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = Path("benchmarks/results")
# The names of stages.common.workloads.WORKLOADS (a test keeps them equal), without importing it.
WORKLOAD_NAMES = (
    "offline",
    "latency",
    "prefill",
    "decode-step",
    "shared-prefix",
    "no-sharing",
    "long-prompt",
    "long-context",
    "online",
)
HF_ENGINE = "hf"
SHARING_WORKLOADS = ("shared-prefix", "no-sharing")
# Set by scripts/gpu_run.sh for one device call: results that share it were measured side by side.
RUN_ID_ENV = "BENCH_RUN_ID"


def stamp_run_id(result: dict[str, Any]) -> dict[str, Any]:
    """Give a result the device call's id ($BENCH_RUN_ID, which scripts/gpu_run.sh sets), so that
    results measured side by side pair up. Every script that writes results calls this."""
    if os.environ.get(RUN_ID_ENV):
        result["run_id"] = os.environ[RUN_ID_ENV]
    return result


def script_result(module: str, argv: Sequence[str] | None, **fields: Any) -> dict[str, Any]:
    """A result written by a `python -m <module>` script (benchmarks/README.md's schema): `fields`
    (name, stage, workload, config, metrics, ...) and where, when and how it ran, with the device
    call's run id. `argv`: the script's arguments (None: this process's own)."""
    from . import hardware

    args = sys.argv[1:] if argv is None else list(argv)
    return stamp_run_id({
        **fields,
        "hardware": hardware.describe(),
        "versions": hardware.versions(),
        "command": " ".join(["python", "-m", module, *args]),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    })  # fmt: skip


def write_result(result: dict[str, Any], out_dir: Path) -> Path:
    """The result as `<out_dir>/<name>.json` (benchmarks/README.md's schema); its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result['name']}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


class StepEngine(Protocol):
    def add_request(self, prompt: list[int], params: SamplingParams) -> int: ...
    def step(self) -> list[tuple[int, RequestOutput]]: ...
    def has_unfinished(self) -> bool: ...


# ---------------------------------------------------------------------------------------------
# Feeding a workload to an engine


class SerialEngine:
    """The step API over an engine that only has `generate` (stage 01): each step serves the
    oldest queued request to completion. Its times are shifted to count from `add_request`, so
    the time a request waited in the queue shows in its TTFT, as it would for a user."""

    def __init__(self, llm: Any):
        self.llm = llm
        self.queue: deque[tuple[int, list[int], SamplingParams, float]] = deque()
        self.next_rid = 0

    def add_request(self, prompt: list[int], params: SamplingParams) -> int:
        rid, self.next_rid = self.next_rid, self.next_rid + 1
        self.queue.append((rid, prompt, params, time.perf_counter()))
        return rid

    def has_unfinished(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[tuple[int, RequestOutput]]:
        rid, prompt, params, added = self.queue.popleft()
        waited = time.perf_counter() - added
        out = self.llm.generate([prompt], params)[0]
        out.ttft_s += waited
        out.latency_s += waited
        out.token_times = [t + waited for t in out.token_times]
        return [(rid, out)]


@dataclass
class Record:
    """One request of a run; times in seconds since the run's start."""

    item: WorkItem
    scheduled_s: float  # when it should arrive
    submitted_s: float  # when the driver handed it over (at the first step boundary after arrival)
    output: RequestOutput | None = None

    @property
    def ttft_s(self) -> float:
        """From arrival, not submission: waiting for the current step to end is part of the wait."""
        assert self.output is not None
        return self.submitted_s - self.scheduled_s + self.output.ttft_s

    @property
    def finished_s(self) -> float:
        assert self.output is not None
        return self.submitted_s + self.output.latency_s

    @property
    def itls_s(self) -> list[float]:
        assert self.output is not None
        times = self.output.token_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]


def drive(engine: StepEngine, workload: Workload, progress: bool = True) -> tuple[list[Record], float]:
    """Serve every item at its arrival time (a session's next turn when its previous turn ends).
    Returns the records and the wall time from start to the last finished request."""
    from tqdm import tqdm

    later_turns = {(it.session, it.turn): it for it in workload.items if it.follows_previous_turn}
    # Sorted by arrival; a turn that follows another joins when that one finishes.
    arrivals: list[tuple[float, WorkItem]] = sorted(
        ((it.arrival_s, it) for it in workload.items if not it.follows_previous_turn), key=lambda a: a[0]
    )
    in_flight: dict[int, Record] = {}
    records: list[Record] = []
    start = time.perf_counter()
    bar = tqdm(total=len(workload.items), desc=workload.name, unit="req", disable=not progress, leave=False)
    while arrivals or in_flight:
        now = time.perf_counter() - start
        while arrivals and arrivals[0][0] <= now:
            due, item = arrivals.pop(0)
            rid = engine.add_request(item.prompt_ids, item.params)
            in_flight[rid] = Record(item, due, time.perf_counter() - start)
        if not engine.has_unfinished():
            if arrivals:  # idle until the next request arrives
                time.sleep(max(0.0, arrivals[0][0] - (time.perf_counter() - start)))
            continue
        for rid, out in engine.step():
            record = in_flight.pop(rid)
            record.output = out
            records.append(record)
            bar.update(1)
            item = record.item
            follower = later_turns.get((item.session, item.turn + 1))
            if follower is not None:
                arrivals.append((record.finished_s + follower.arrival_s, follower))
                arrivals.sort(key=lambda a: a[0])
    bar.close()
    total_s = max(r.finished_s for r in records)
    return records, total_s


# ---------------------------------------------------------------------------------------------
# Metrics


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation (numpy's default), nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def latency_metrics(ttfts: list[float], itls: list[float]) -> dict[str, float]:
    return {
        "ttft_ms_p50": 1000 * percentile(ttfts, 50),
        "ttft_ms_p99": 1000 * percentile(ttfts, 99),
        "itl_ms_p50": 1000 * percentile(itls, 50),
        "itl_ms_p99": 1000 * percentile(itls, 99),
    }


def batch1_metrics(prompt_len: int, num_tokens: int, ttft_s: float, latency_s: float) -> dict[str, float]:
    """Prefill speed from the TTFT; decode speed from the tokens after the first."""
    decode_s = latency_s - ttft_s
    step_s = decode_s / (num_tokens - 1) if num_tokens > 1 else float("nan")
    return {
        "decode_step_ms": 1000 * step_s,
        "ttft_ms": 1000 * ttft_s,
        "decode_tok_per_s": 1 / step_s,
        "prefill_tok_per_s": prompt_len / ttft_s,
        "total_s": latency_s,
        "prompt_tokens": prompt_len,
        "output_tokens": num_tokens,
    }


def prefill_metrics(records: list[Record]) -> dict[str, float]:
    """Per prompt length L, over its requests (one prefill step each, run alone): prefill speed
    from the median TTFT, the median itself, and the first request's TTFT, which is where a
    kernel compiled on first use for that length would show."""
    ttfts: dict[int, list[float]] = {}
    for record in sorted(records, key=lambda r: r.submitted_s):
        ttfts.setdefault(len(record.item.prompt_ids), []).append(record.ttft_s)
    lengths = sorted(ttfts)
    medians = {n: statistics.median(ttfts[n]) for n in lengths}
    return {
        **{f"prefill_tok_per_s_{n}": n / medians[n] for n in lengths},
        **{f"ttft_ms_{n}": 1000 * medians[n] for n in lengths},
        **{f"first_ttft_ms_{n}": 1000 * ttfts[n][0] for n in lengths},
        "requests": len(records),
        "prompt_tokens": sum(n * len(ttfts[n]) for n in lengths),
    }


def decode_step_metrics(records: list[Record], batch: int) -> dict[str, float]:
    """The steps in which all `batch` requests decode: from the step that gave the last request its
    first token until the first request finishes. Each such step gives every request one token, so
    the gaps between a request's tokens there are the steps' durations."""
    times = [[r.submitted_s + t for t in r.output.token_times] for r in records if r.output is not None]
    gaps = [b - a for ts in times for a, b in zip(ts, ts[1:], strict=False)]
    # Two requests' tokens of one step differ by the microseconds between their submissions: a
    # tolerance of half the shortest step tells one step from the next.
    slack = min(gaps, default=0.0) / 2
    start, end = max(ts[0] for ts in times) - slack, min(ts[-1] for ts in times) + slack
    steps = [b - a for ts in times for a, b in zip(ts, ts[1:], strict=False) if a >= start and b <= end]
    step_s = percentile(steps, 50)
    return {
        "decode_step_ms": 1000 * step_s,
        "decode_tok_per_s": batch / step_s,
        "decode_step_ms_p90": 1000 * percentile(steps, 90),
        "full_batch_steps": len(steps) / batch,
    }


def long_prompt_metrics(records: list[Record]) -> dict[str, float]:
    """What a long prefill does to the requests decoding beside it (group 0, the short ones), and
    what chunking costs the long prompts (group 1).

    A long prefill stalls each short request once, so the stalled gaps are a few among thousands
    (64 requests x 255 gaps at full scale, 4 long prompts): a p99 can miss them altogether. The
    worst gap (`max`) and the p99.9 are the stall; the p50 is the pace of ordinary steps."""
    short = [r for r in records if r.item.group == 0]
    long = [r for r in records if r.item.group == 1]
    gaps = [g for r in short for g in r.itls_s]
    long_ttfts = [r.ttft_s for r in long]
    return {
        "short_itl_ms_max": 1000 * max(gaps, default=float("nan")),
        "short_itl_ms_p999": 1000 * percentile(gaps, 99.9),
        "long_ttft_ms_p50": 1000 * percentile(long_ttfts, 50),
        "long_ttft_ms_max": 1000 * max(long_ttfts, default=float("nan")),
        "short_itl_ms_p99": 1000 * percentile(gaps, 99),
        "short_itl_ms_p50": 1000 * percentile(gaps, 50),
        "short_ttft_ms_p99": 1000 * percentile([r.ttft_s for r in short], 99),
    }


def workload_metrics(workload: Workload, records: list[Record], total_s: float) -> dict[str, float]:
    """Metrics in the order they matter for the workload: the first four are plotted."""
    outputs = [r.output for r in records if r.output is not None]
    prompt_tokens = sum(len(o.prompt_ids) for o in outputs)
    output_tokens = sum(len(o.token_ids) for o in outputs)
    cached = sum(o.cached_tokens for o in outputs)
    ttfts = [r.ttft_s for r in records]
    itls = [gap for r in records for gap in r.itls_s]
    throughput = {"output_tok_per_s": output_tokens / total_s, "total_s": total_s}
    counts = {"requests": len(records), "prompt_tokens": prompt_tokens, "output_tokens": output_tokens}
    if workload.name == "latency":
        (record,) = records
        assert record.output is not None
        return batch1_metrics(
            prompt_tokens, output_tokens, record.ttft_s, record.finished_s - record.scheduled_s
        )
    if workload.name == "prefill":
        return prefill_metrics(records)
    if workload.name == "decode-step":
        batch = len(records)
        return {**decode_step_metrics(records, batch), **throughput, **latency_metrics(ttfts, itls), **counts}
    if workload.name in SHARING_WORKLOADS:
        return {
            **throughput,
            "computed_prefill_tokens": prompt_tokens - cached,
            "cached_tokens": cached,
            **latency_metrics(ttfts, itls),
            "cache_hit_rate": cached / prompt_tokens,
            **counts,
        }
    if workload.name == "long-prompt":
        return {**long_prompt_metrics(records), **throughput, **counts}
    return {**throughput, **latency_metrics(ttfts, itls), **counts}


# ---------------------------------------------------------------------------------------------
# The child: one measured run


def warmup_workload(vocab_size: int, like: Workload | None = None) -> Workload:
    """Short requests run before the timed one: they load kernels, compile JIT kernels (FlashInfer
    compiles its sampling kernels on first use) and fill allocator caches. Two greedy ones, and one
    for each kind of sampling `like` uses (at most four), so that no kernel is compiled while the
    clock runs: on an H200, with greedy-only warm-up requests, a kernel compiled inside the timed
    run made an offline result read 1,177 tok/s for about 20,000
    (benchmarks/logs/h200-2026-11-25/kv-fp8-speed.log)."""
    import dataclasses

    from .sampling import SamplingParams
    from .workloads import WorkItem, Workload

    kinds = [SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=4) for _ in range(2)]
    seen: set[tuple[Any, ...]] = set()  # what picks a sampling kernel; the temperature does not
    for item in like.items if like is not None else []:
        params = item.params
        key = (params.top_k, params.top_p, params.min_p, params.logprobs)
        if params.temperature > 0 and key not in seen and len(seen) < 4:
            seen.add(key)
            kinds.append(dataclasses.replace(params, max_tokens=4, ignore_eos=True, stop=[], seed=0))
    lengths = [16] * len(kinds)
    # And one prompt as long as the workload's longest: a library's first call at a new size (a
    # GEMM's heuristics, a kernel loaded lazily) then costs nothing inside the timed run, where a
    # batch-1 TTFT is one measurement (an H100 read 342 ms for a 14 ms median). Not for the prefill
    # workload, which reports its first prompt's TTFT of each length on purpose.
    if like is not None and like.name != "prefill" and like.items:
        kinds.append(SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=2))
        lengths.append(max(len(item.prompt_ids) for item in like.items))
    items = [
        WorkItem(0.0, [(7 * i + j) % min(vocab_size, 1000) for j in range(n)], params)
        for i, (params, n) in enumerate(zip(kinds, lengths, strict=True))
    ]
    return Workload("warmup", items, seed=0, scale=1.0)


def run_engine(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from .devices import synchronize
    from .workloads import make_workload

    module = importlib.import_module(args.engine)
    llm = module.LLM(args.model, device=args.device, dtype=args.dtype, **parse_engine_args(args.engine_arg))
    engine: StepEngine = llm if hasattr(llm, "step") else SerialEngine(llm)
    try:
        settings = parse_engine_args(args.workload_arg)
        workload = make_workload(args.workload, llm.config.vocab_size, args.seed, args.scale, **settings)
    except (TypeError, ValueError) as err:
        raise SystemExit(f"--workload-arg for {args.workload}: {err}") from err
    if args.max_requests is not None:
        workload = workload.head(args.max_requests)
    check_fits(workload, llm.config.max_context)
    drive(engine, warmup_workload(llm.config.vocab_size, workload), progress=False)
    synchronize(llm.device)
    if llm.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(llm.device)
    records, total_s = drive(engine, workload, progress=not args.no_progress)
    metrics = workload_metrics(workload, records, total_s) | kv_cache_facts(llm)
    if llm.device.type == "cuda":
        metrics["peak_memory_gb"] = torch.cuda.max_memory_allocated(llm.device) / 1e9
    return {"metrics": metrics, "device": llm.device.type, "dtype": str(llm.dtype).removeprefix("torch.")}


def kv_cache_facts(llm: Any) -> dict[str, float]:
    """What final/'s engine says of its KV cache: the tokens it holds and the preemptions the run
    needed (what an FP8 cache changes, issue 32). The stages report none of it here."""
    core = getattr(llm, "core", None)
    if core is None or not hasattr(core, "info") or not hasattr(core, "scheduler"):
        return {}
    return {
        "kv_capacity_tokens": core.info().kv_capacity,
        "preemptions": getattr(core.scheduler, "num_preemptions", 0),
    }


def run_hf(args: argparse.Namespace) -> dict[str, Any]:
    """HF transformers `generate`, batch 1, greedy, exactly `output_len` tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    from .devices import pick_device, pick_dtype, synchronize
    from .model_config import load_model_config
    from .model_source import resolve_model
    from .workloads import Workload, make_workload

    if args.workload != "latency":
        raise SystemExit("--engine hf measures batch-1 latency only: use --workload latency")
    folder = resolve_model(args.model)
    config = load_model_config(folder, None)
    device = pick_device(args.device)
    dtype = pick_dtype(args.dtype, config.dtype, device)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    (item,) = make_workload("latency", config.vocab_size, args.seed, args.scale).items
    check_fits(Workload("latency", [item], args.seed, args.scale), config.max_context)

    def timed_generate(prompt: list[int], n: int) -> float:
        ids = torch.tensor([prompt], device=device)
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n,
                pad_token_id=config.eos_token_ids[0] if config.eos_token_ids else 0,
            )  # fmt: skip
        synchronize(device)
        assert out.shape[1] == len(prompt) + n, "generate stopped early"
        return time.perf_counter() - start

    for warm in warmup_workload(config.vocab_size).items:
        timed_generate(warm.prompt_ids, warm.params.max_tokens)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    n = item.params.max_tokens
    ttft_s = timed_generate(item.prompt_ids, 1)  # prefill and one sampled token
    latency_s = timed_generate(item.prompt_ids, n)
    metrics = batch1_metrics(len(item.prompt_ids), n, ttft_s, latency_s)
    if device.type == "cuda":
        metrics["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 1e9
    return {"metrics": metrics, "device": device.type, "dtype": str(dtype).removeprefix("torch.")}


def check_fits(workload: Workload, max_context: int) -> None:
    if workload.longest_request > max_context:
        raise SystemExit(
            f"workload {workload.name} at scale {workload.scale} has a request of {workload.longest_request} "
            f"tokens but the model's context holds {max_context}: lower --scale or use a longer-context model"
        )


def child_main(args: argparse.Namespace) -> None:
    import torch

    from .hardware import describe, versions

    if args.threads:
        torch.set_num_threads(args.threads)
    result = run_hf(args) if args.engine == HF_ENGINE else run_engine(args)
    if result["device"] == "cpu":  # how many cores the CPU run used shapes its numbers
        result["threads"] = torch.get_num_threads()
    # JSON has no NaN: a metric with nothing to measure (no ITL with one output token) is left out.
    result["metrics"] = {k: v for k, v in result["metrics"].items() if math.isfinite(v)}
    # The child describes the machine: the parent never touches the GPU, so a CUDA context it
    # opened cannot shrink the memory the measured engine sizes its KV cache from.
    result |= {"hardware": describe(), "versions": versions()}
    Path(args.child_out).write_text(json.dumps(result))


# ---------------------------------------------------------------------------------------------
# The parent: repeats, medians, the result file


def parse_engine_args(pairs: Sequence[str]) -> dict[str, int | float | str]:
    """`key=value` pairs; values become int or float when they read as one."""
    out: dict[str, int | float | str] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--engine-arg wants key=value, got {pair!r}")
        value: int | float | str = raw
        for kind in (int, float):
            with contextlib.suppress(ValueError):
                value = kind(raw)
                break
        out[key.replace("-", "_")] = value
    return out


def stage_of(engine: str) -> str:
    """`stages.02_paged_kv` -> `02_paged_kv`; `final` and `hf` stay as they are."""
    return engine.removeprefix("stages.")


def default_name(engine: str, workload: str, device: str) -> str:
    stage = stage_of(engine)
    group = f"stage{stage[:2]}" if stage[:2].isdigit() else stage.replace("_", "").replace(".", "")
    return f"{group}_{workload}_{device}"


def model_label(model: str | None) -> str:
    from .default_model import DEFAULT_MODEL_NAME

    return DEFAULT_MODEL_NAME if model is None else Path(model).name or model


def run_child(argv: list[str], repeat: int, repeats: int, threads: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "stages.common.bench", *argv, "--child", "--child-out", str(out)]
        print(f"[bench] run {repeat + 1}/{repeats}: {shlex.join(cmd[1:])}", file=sys.stderr, flush=True)
        # The child finds `stages` (and `final`) from any working directory; relative paths in
        # argv (--model) still resolve against ours, which it inherits.
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, "PYTHONPATH": path, "TOKENIZERS_PARALLELISM": "false"}
        if threads:  # size OpenMP's pool before torch starts it, not just torch's own count
            env["OMP_NUM_THREADS"] = str(threads)
        code = subprocess.run(cmd, env=env).returncode
        if code != 0 or not out.exists():
            raise SystemExit(f"benchmark run {repeat + 1} failed (exit code {code}); its output is above")
        return json.loads(out.read_text())


def warn_if_busy() -> None:
    """Other processes on the same cores slow every step: say so rather than publish noise."""
    from .hardware import usable_cores

    if not hasattr(os, "getloadavg"):
        return
    load, cores = os.getloadavg()[0], usable_cores()
    if load > 0.5 * cores:
        print(
            f"[bench] warning: load average {load:.1f} on {cores} cores; other processes compete "
            "for the CPU and the timings will be noisy",
            file=sys.stderr,
            flush=True,
        )


def median_metrics(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k in runs[0]["metrics"] if all(k in run["metrics"] for run in runs)]
    # The child's order is kept: the docs plot the first four.
    return {k: statistics.median(run["metrics"][k] for run in runs) for k in keys}


def build_result(args: argparse.Namespace, argv: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    first = runs[0]
    config: dict[str, Any] = {
        "scale": args.scale,
        "seed": args.seed,
        "model": model_label(args.model),
        "device": first["device"],
        "dtype": first["dtype"],
        **({"threads": first["threads"]} if "threads" in first else {}),
        **({"max_requests": args.max_requests} if args.max_requests is not None else {}),
        **parse_engine_args(args.engine_arg),
        **parse_engine_args(args.workload_arg),
        "repeats": len(runs),
    }
    result: dict[str, Any] = {
        "name": args.name or default_name(args.engine, args.workload, first["device"]),
        "stage": stage_of(args.engine),
        "workload": args.workload,
        "metrics": median_metrics(runs),
        "config": config,
        "hardware": first["hardware"],
        "versions": first["versions"],
        "command": shlex.join(["python", "-m", "stages.common.bench", *argv]),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if len(runs) > 1:  # every run's metrics, so the docs can show the spread behind a median
        result["runs"] = [run["metrics"] for run in runs]
    return stamp_run_id(result)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m stages.common.bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--engine", default="stages.02_paged_kv", help="an engine module (stages.02_paged_kv, final) or hf"
    )
    parser.add_argument("--workload", default="offline", choices=WORKLOAD_NAMES)
    parser.add_argument(
        "--scale", type=float, default=1.0, help="shrink counts and lengths (0.05 for a CPU smoke run)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None, help="HF folder or hub id (default: the default model)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to LLM(...), repeatable",
    )
    parser.add_argument(
        "--workload-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to the workload generator, repeatable (batch=8 for decode-step, rate=16 for online)",
    )
    parser.add_argument("--repeats", type=int, default=1, help="fresh processes; metrics are medians")
    parser.add_argument(
        "--max-requests",
        type=int,
        default=None,
        metavar="N",
        help="serve only the workload's first N requests (for an engine that serves one at a time)",
    )
    parser.add_argument("--name", default=None, help="result name (default: <group>_<workload>_<device>)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for <name>.json")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default: torch's choice). 1 keeps CPU timings stable on a busy "
        "machine: with more threads than free cores, every op waits for a descheduled thread",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.scale <= 0:
        parser.error("--scale must be > 0")
    if args.max_requests is not None and args.max_requests < 1:
        parser.error("--max-requests must be >= 1")
    if args.threads is not None and args.threads < 1:
        parser.error("--threads must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        child_main(args)
        return
    warn_if_busy()
    runs = [run_child(argv, i, args.repeats, args.threads) for i in range(args.repeats)]
    result = build_result(args, argv, runs)
    path = write_result(result, args.out)
    summary = ", ".join(f"{k}={v:.4g}" for k, v in list(result["metrics"].items())[:4])
    print(f"[bench] {result['name']}: {summary} -> {path}", file=sys.stderr)


if __name__ == "__main__":
    from .errors import run_cli

    run_cli(main)
