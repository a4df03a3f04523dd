"""The host's share of a batch-1 prefill, per attention backend: is a slower first token the
kernels' or the host's launching them? (issue 26: FlashAttention 4's prefill trails FlashInfer's
at 512 and 2,048 tokens on an H100 and leads at 8,192.)

    python -m scripts.bench_prefill_host --model checkpoints/qwen3-0.6b-random --attn fi fa --out-dir $OUT/logs

For each backend, one engine; per prompt length, `--repeats` fresh prompts asked for one token,
one at a time, after a warm-up prompt of that length (`--batch B`: B prompts at a time, one step,
as the offline workload's first steps admit 32 at once). Each is one prefill step, timed as
scripts/bench_offline_phases.py times steps: `launch_ms`, the host's time inside
`EngineCore.launch` (every kernel, graph and library call queued), and `step_ms`, from just
before the request was added to its token on the host (the engine's first-token time). The GPU
follows the host, so where `launch_ms` is most of `step_ms` the host sets the pace (an eager
prefill's ten launches a layer, before the piecewise graphs), and a backend whose launch is
longer by as much as its step is has a host cost, not a kernel cost.
Medians; one JSON for all backends (a diagnosis for the logs), and with `--results-dir` one
result per spec (`final_prefill_host_<spec>_<gpu>.json`, metrics `step_ms_<tokens>` and
`launch_ms_<tokens>`), so the book can quote the figures. `--profile`
adds, per length, the Python calls with the most time of their own in one more prefill (cProfile:
its overhead inflates every call, so read the ranking, not the milliseconds). `--breakdown` splits
the launch itself, in `--repeats` more prefills, with plain clock reads around a few calls (a
microsecond or so each, against cProfile's on every call): the runner's `prepare`, the backend's
`prepare`, the piecewise graphs' replays and attention's `forward` (the backend's whole call: the
kernel's launch and the Python around it), their calls a prefill, and what is left of the launch
(`rest`: sampling, the step's bookkeeping, the last norm and LM head). A spec ending in
`:no-replay` (`--attn fa fa:no-replay`) builds its engine with FINAL_FA4_REPLAY=0: FlashAttention 4
through its Python interface at every call (final/attention/fa4_replay.py), to compare in one run;
one ending in `:eager` (`--attn fi fi:eager`) with FINAL_PREFILL_GRAPHS=0: the prefill step run
eagerly, without the piecewise CUDA graphs final/ records by default (final/engine/prefill_graph.py).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest.mock import patch

from stages.common.bench import write_result

PROFILE_ROWS = 30
NO_REPLAY = ":no-replay"
EAGER = ":eager"


def spec_and_switches(attn: str) -> tuple[str, dict[str, str]]:
    """`--attn`'s spec without its suffixes, and the FINAL_* switches they stand for (read where
    the engine builds its backend and its graphs, so they are set around the build alone)."""
    from final.attention import fa4_replay
    from final.engine import prefill_graph

    suffixes = {NO_REPLAY: (fa4_replay.ENV, "0"), EAGER: (prefill_graph.ENV, "0")}
    switches: dict[str, str] = {}
    while suffix := next((s for s in suffixes if attn.endswith(s)), None):  # either order, both
        env, value = suffixes[suffix]
        attn, switches[env] = attn.removesuffix(suffix), value
    return attn, switches


def measure(
    model: Path,
    attn: str,
    device: str,
    lengths: list[int],
    repeats: int,
    seed: int,
    profile: bool = False,
    batch: int = 1,
    breakdown: bool = False,
) -> dict[str, Any]:
    import final
    from scripts.bench_offline_phases import recording

    cpu = device == "cpu"
    # A budget for the largest batch of prompts in one step (the offline workload's first steps).
    budget = max(16384, batch * max(lengths))
    spec, switches = spec_and_switches(attn)
    with patch.dict(os.environ, switches):
        llm = final.LLM(str(model), device=device, dtype="float32" if cpu else "bfloat16", attn=spec,
                        page_size=16, max_prefill_length=budget)  # fmt: skip
    vocab = llm.config.vocab_size
    rng = random.Random(seed)
    params = final.SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)

    def prompts(n: int) -> list[dict[str, list[int]]]:
        return [{"prompt_token_ids": [rng.randrange(3, vocab - 1) for _ in range(n)]} for _ in range(batch)]

    out: dict[str, Any] = {}
    for n in lengths:
        llm.generate(prompts(n), params, progress=False)  # warm-up: a first use at this size
        launch, step = [], []
        for _ in range(repeats):
            fresh = prompts(n)
            with recording(llm.core) as steps:  # a step's time runs from here to its collect
                llm.generate(fresh, params, progress=False)
            (only,) = [s for s in steps if s.prompt_tokens]  # fresh prompts: one prefill step each
            launch.append(1e3 * only.launch_seconds)
            step.append(1e3 * only.seconds)
        out[str(n)] = {"launch_ms": statistics.median(launch), "step_ms": statistics.median(step),
                       "prompt_tokens": only.prompt_tokens}  # fmt: skip
        if breakdown:
            out[str(n)]["breakdown"] = split_launch(llm, lambda: prompts(n), params, repeats)  # noqa: B023
        if profile:  # one more prompt under cProfile: which Python calls the launch spends its time in
            fresh, profiler = prompts(n), cProfile.Profile()
            profiler.enable()
            llm.generate(fresh, params, progress=False)
            profiler.disable()
            out[str(n)]["profile"] = top_calls(profiler)
        print(f"[prefill_host] {attn:10s} {n:6d} tokens: launch {out[str(n)]['launch_ms']:7.2f} ms of a "
              f"{out[str(n)]['step_ms']:7.2f} ms prefill", flush=True)  # fmt: skip
    llm.close()
    return out


def clocked(call: Any, total: list[float]) -> Any:
    """`call`, adding each call's host time and one call to `total` ([seconds, calls])."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            total[0] += time.perf_counter() - start
            total[1] += 1

    return timed


@contextmanager
def host_timers(targets: dict[str, tuple[Any, str]]) -> Iterator[dict[str, list[float]]]:
    """While the block runs, each `owner.name` (a class's method or an object's) is timed on the
    host: label -> [seconds, calls], summed."""
    totals = {label: [0.0, 0] for label in targets}
    with ExitStack() as stack:
        for label, (owner, name) in targets.items():
            stack.enter_context(patch.object(owner, name, clocked(getattr(owner, name), totals[label])))
        yield totals


def split_launch(llm: Any, prompts: Any, params: Any, repeats: int) -> dict[str, Any]:
    """Medians over `repeats` prefills of each part of the launch (ms) and its calls a prefill."""
    from final.engine.graph import CudaGraph
    from scripts.bench_offline_phases import recording

    runner = llm.core.executor.runner
    backend = type(runner.backend)
    targets = {
        "runner_prepare": (type(runner), "prepare"),
        "backend_prepare": (backend, "prepare"),
        "graph_pieces": (CudaGraph, "replay"),  # none on the CPU: its prefill runs eagerly
        "attention": (backend, "forward"),
    }
    rows: list[dict[str, float]] = []
    calls: dict[str, int] = {}
    for _ in range(repeats):
        fresh = prompts()
        with recording(llm.core) as steps, host_timers(targets) as totals:
            llm.generate(fresh, params, progress=False)
        (only,) = [s for s in steps if s.prompt_tokens]
        parts = {label: 1e3 * seconds for label, (seconds, _) in totals.items()}
        calls = {label: int(count) for label, (_, count) in totals.items()}
        launch = 1e3 * only.launch_seconds  # the parts are disjoint: none calls another
        parts["rest"] = launch - sum(parts.values())
        rows.append({"launch": launch, **parts})
    medians = {f"{label}_ms": statistics.median(row[label] for row in rows) for label in rows[0]}
    return {**medians, "calls": calls}


def top_calls(profiler: cProfile.Profile, count: int = PROFILE_ROWS) -> list[dict[str, Any]]:
    """The calls with the most time of their own (tottime), as rows: where the host's time goes."""
    stats = pstats.Stats(profiler)
    rows = [
        {
            "call": f"{Path(file).name}:{line}({name})",
            "calls": calls,
            "own_ms": 1e3 * own,
            "total_ms": 1e3 * total,
        }
        for (file, line, name), (_, calls, own, total, _) in stats.stats.items()  # type: ignore[attr-defined]
    ]
    return sorted(rows, key=lambda r: -r["own_ms"])[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=Path("checkpoints/qwen3-0.6b-random"))
    parser.add_argument("--attn", nargs="+", default=["fi", "fa"])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 2048, 8192])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--batch", type=int, default=1, help="prompts per step (32 x 512 tokens: an offline prefill step)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--name", default="prefill_host", help="the JSON's name in --out-dir")
    parser.add_argument("--results-dir", type=Path, default=None, help="one result per spec here")
    parser.add_argument(
        "--profile", action="store_true", help="add each length's top Python calls (cProfile)"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="add each length's launch split into its parts (clock reads)"
    )
    args = parser.parse_args(argv)
    found = {
        attn: measure(
            args.model,
            attn,
            args.device,
            args.tokens,
            args.repeats,
            args.seed,
            args.profile,
            args.batch,
            args.breakdown,
        )  # fmt: skip
        for attn in args.attn
    }
    if args.out_dir:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        path = args.out_dir / f"{args.name}.json"
        path.write_text(
            json.dumps(
                {"tokens": args.tokens, "batch": args.batch, "repeats": args.repeats, "by_attn": found},
                indent=1,
            )
        )
        print(f"-> {path}")
    if args.results_dir:
        for attn, by_length in found.items():
            print(f"-> {write_result(as_result(attn, by_length, args, argv), args.results_dir)}")
    return 0


def as_result(
    attn: str, by_length: dict[str, Any], args: argparse.Namespace, argv: list[str] | None
) -> dict[str, Any]:
    """One spec's figures as a result (benchmarks/README.md's schema): a row of the results page."""
    from stages.common import hardware
    from stages.common.bench import script_result

    slug = attn.replace(",", "-").replace(":", "-")
    batch = f"_b{args.batch}" if args.batch != 1 else ""
    metrics = {}
    for n, row in by_length.items():
        metrics[f"step_ms_{n}"] = row["step_ms"]
        metrics[f"launch_ms_{n}"] = row["launch_ms"]
    return script_result(
        "scripts.bench_prefill_host", argv,
        name=f"final_prefill_host_{slug}{batch}_{hardware.device_tag(args.device)}",
        stage="final",
        workload="prefill-host",
        config={"model": args.model.name, "attn": attn, "batch": args.batch, "repeats": args.repeats,
                "page_size": 16},
        metrics=metrics,
    )  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
