"""The batch-1 step of several versions of final/, timed in one device call, as one result file.

    python -m scripts.latency_trees logs/latency-trees --out benchmarks/results/h200 --gpu h200

`gpu_run.sh latency-trees` runs `scripts/bench_peer.py --workload latency --final-path <tree>` for
each tree of `.latency-trees/` (one folder per commit, `scripts/export_trees.sh`), round after
round with the trees alternating, one fresh process a run, and names each run `<tree>_r<round>`.
This reads those run files and writes `final_latency_trees_<gpu>.json` (benchmarks/README.md's
schema): per tree the median step and its fastest and slowest run, and across the trees the
lowest and highest median. The question it answers: did one commit make the step longer? Only if
its median stands apart from the others by more than the runs of one tree spread.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from stages.common.bench import script_result, write_result


def read_runs(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Each tree's run results, in round order: files named `<tree>_r<round>.json`."""
    runs: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for path in folder.glob("*_r*.json"):
        tree, _, round_ = path.stem.rpartition("_r")
        if tree and round_.isdigit():
            runs[tree].append((int(round_), json.loads(path.read_text())))
    if not runs:
        raise SystemExit(f"no run files (<tree>_r<round>.json) in {folder}")
    return {tree: [r for _, r in sorted(found, key=lambda x: x[0])] for tree, found in sorted(runs.items())}


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """step_ms_<tree> (the median of its runs), _best and _worst; the lowest and highest median,
    and how far apart they are in percent of the lowest (`medians_spread_pct`)."""
    metrics: dict[str, float] = {}
    medians = []
    for tree, results in runs.items():
        steps = [r["metrics"]["decode_step_ms"] for r in results]
        median = statistics.median(steps)
        medians.append(median)
        metrics[f"step_ms_{tree}"] = median
        metrics[f"step_ms_{tree}_best"] = min(steps)
        metrics[f"step_ms_{tree}_worst"] = max(steps)
    low, high = min(medians), max(medians)
    metrics.update(lowest_median_ms=low, highest_median_ms=high, medians_spread_pct=100 * (high - low) / low)
    return metrics


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("folder", type=Path, help="the run files of gpu_run.sh latency-trees")
    parser.add_argument("--out", type=Path, required=True, help="where the result file goes")
    parser.add_argument("--gpu", required=True, help="the GPU's short name in the result's name (h200)")
    args = parser.parse_args(argv)
    runs = read_runs(args.folder)
    metrics = summarize(runs)
    first = next(iter(runs.values()))[0]
    result = script_result(
        "scripts.latency_trees",
        argv,
        name=f"final_latency_trees_{args.gpu}",
        stage="final",
        workload="latency",
        config={
            **{k: first["config"][k] for k in ("model", "attn", "dtype") if k in first["config"]},
            "trees": list(runs),
            "rounds": max(len(r) for r in runs.values()),
            "method": "each tree's final/ through bench_peer --final-path, trees alternating within a round",
        },
        metrics=metrics,
    )
    # The runs' machine, not this process's: the summary may be written on another host.
    result["hardware"], result["versions"] = first["hardware"], first["versions"]
    result["timestamp"] = max(r["timestamp"] for rs in runs.values() for r in rs)
    if "run_id" in first:
        result["run_id"] = first["run_id"]
    path = write_result(result, args.out)
    for tree in runs:
        m = [f"{metrics[f'step_ms_{tree}{s}']:.3f}" for s in ("", "_best", "_worst")]
        print(f"{tree:>12}: batch-1 step median {m[0]} ms (runs {m[1]} to {m[2]})")
    print(f"medians {metrics['medians_spread_pct']:.1f}% apart -> {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
