"""final/ against Mini-SGLang in one device call: the offline workload, the batch-1 decode step and
the kernel table of a decode step, both engines measured by the same code, into one JSON. final/
runs as it serves (`--final-attn auto`), Mini-SGLang with FlashInfer (`--attn fi`, the backend its
peer harness installs); `--final-attn fi` compares the two on the same attention kernels.

    PYTHONPATH=.peers/minisgl:$PYTHONPATH python -m scripts.bench_versus \
        --model checkpoints/qwen3-0.6b-random --out benchmarks/results/h200 --gpu h200 --repeats 3

Each measurement runs in a fresh process (scripts/bench_peer.py for the offline workload and the
batch-1 step, scripts/kernel_table.py for the kernels); the engines alternate, final/ then
Mini-SGLang, repeat after repeat, so a drift of the machine falls on both. The figures are the
medians over the repeats. The result, `versus_minisgl_<gpu>.json` (`versus_minisgl_fi_<gpu>.json` with
`--final-attn fi`), holds both engines' figures,
every repeat, the commit, the call's run id and each ratio, written so that a ratio above 1 always
means final/ is ahead (throughput: final / peer; step time: peer / final).

`--base DIR` adds a third engine: an older final/ (DIR holds its `final` package, e.g. from `git
archive <commit> final | tar -x -C DIR`), measured the same way in the same call, so the JSON also
says what the change since that commit bought (`vs_base`: above 1, the current final/ is ahead).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stages.common.bench import stamp_run_id

ROOT = Path(__file__).resolve().parents[1]

ENGINES = ("final", "mini-sglang")
BASE = "final-base"  # --base: an older final/, measured beside them
# workload -> (metric, whether higher is better)
MEASURES = {"offline": ("output_tok_per_s", True), "latency": ("decode_step_ms", False)}


def run(cmd: list[str]) -> None:
    print(f"[bench_versus] {shlex.join(cmd)}", file=sys.stderr, flush=True)
    code = subprocess.run(cmd, cwd=ROOT).returncode
    if code != 0:
        raise SystemExit(f"[bench_versus] failed (exit code {code}): {shlex.join(cmd)}")


GPU_FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw", "clocks_throttle_reasons.active")


def machine_state() -> dict[str, Any]:
    """What the machine was doing as a run started: the host's load average, the GPU's clocks,
    temperature, power and throttle reasons, and how many processes held the GPU. Kept beside each
    run so that a slow repeat can be told from a slow engine (the H200 gave one of each engine in
    one call of session 14, unexplained). Empty where nvidia-smi is missing (the CPU)."""
    state: dict[str, Any] = {"loadavg_1m": round(os.getloadavg()[0], 2)}
    query = ["nvidia-smi", "--format=csv,noheader,nounits"]
    try:
        gpu = subprocess.run(
            [*query, "--query-gpu=" + ",".join(GPU_FIELDS)], capture_output=True, text=True, timeout=20
        )
        apps = subprocess.run(
            [*query, "--query-compute-apps=pid"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return state
    if gpu.returncode == 0 and gpu.stdout.strip():
        values = [v.strip() for v in gpu.stdout.splitlines()[0].split(",")]
        state |= dict(zip(GPU_FIELDS, values, strict=False))
    if apps.returncode == 0:
        state["gpu_processes"] = len([line for line in apps.stdout.splitlines() if line.strip()])
    return state


def peer_run(engine: str, workload: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """One fresh-process run of bench_peer.py; its result file's content, with the machine's state
    as it started (`machine`). `final-base` is final/ imported from --base's folder."""
    name = f"{engine}_{workload}".replace("-", "_")
    extra = []
    if engine == BASE:  # final/ imported from --base's folder (bench_peer.py checks it was)
        engine, extra = "final", ["--final-path", str(args.base)]
    cmd = [sys.executable, "-m", "scripts.bench_peer", "--engine", engine, "--workload", workload, *extra]
    # --scale shrinks the offline workload only: the batch-1 step is a difference of two calls,
    # which needs its full 128 tokens.
    scale = args.scale if workload == "offline" else 1.0
    cmd += ["--model", str(args.model), "--attn", attn_of(engine, args), "--scale", str(scale)]
    before = machine_state()
    run(cmd + ["--out", str(tmp), "--name", name])
    return json.loads((tmp / f"{name}.json").read_text()) | {"machine": before}


def final_attn_resolved(runs: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, str]:
    """{"final_attn_resolved": "fa,fi"}: the backend final/'s runs were built with (bench_peer.py
    records it), or nothing where no run says."""
    seen = {r["config"].get("attn_resolved") for w in runs.get("final", {}).values() for r in w}
    seen.discard(None)
    return {"final_attn_resolved": ",".join(sorted(seen))} if seen else {}


def attn_of(engine: str, args: argparse.Namespace) -> str:
    """The --attn an engine runs with: Mini-SGLang's, or final/'s (also for --base's final/)."""
    return args.attn if engine == "mini-sglang" else args.final_attn


def result_name(args: argparse.Namespace) -> str:
    """versus_minisgl_<gpu>, or with final/'s backend in it where that is not auto's."""
    tag = "" if args.final_attn == "auto" else args.final_attn.replace(",", "-") + "_"
    return f"versus_minisgl_{tag}{args.gpu}"


def ratio(final: float, peer: float, higher_is_better: bool) -> float:
    """Above 1: final/ is ahead."""
    return final / peer if higher_is_better else peer / final


def assemble(
    runs: dict[str, dict[str, list[dict[str, Any]]]], kernels: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """The comparison from each engine's runs per workload and its kernel tables."""
    out: dict[str, Any] = {}
    for workload, (metric, higher) in MEASURES.items():
        values = {
            e: [r["metrics"][metric] for r in runs[e][workload]] for e in ENGINES if runs[e].get(workload)
        }
        if len(values) < 2:
            continue
        median = {e: statistics.median(v) for e, v in values.items()}
        out[workload] = {
            "metric": metric,
            "final": median["final"],
            "mini-sglang": median["mini-sglang"],
            "ratio": ratio(median["final"], median["mini-sglang"], higher),
            "runs": values,
            # each run's machine state as it started (machine_state), in the order of `runs`
            "machine": {e: [r.get("machine", {}) for r in runs[e][workload]] for e in values},
        }
        base = [r["metrics"][metric] for r in runs.get(BASE, {}).get(workload, [])]
        if base:
            out[workload] |= {"base": statistics.median(base), "base_runs": base}
            out[workload]["vs_base"] = ratio(median["final"], out[workload]["base"], higher)
    tables = []
    for mine in kernels.get("final", []):
        theirs = next(
            (
                t
                for t in kernels.get("mini-sglang", [])
                if (t["batch"], t["temperature"]) == (mine["batch"], mine["temperature"])
            ),
            None,
        )
        row = {
            "batch": mine["batch"],
            "temperature": mine["temperature"],
            "final": mine,
            "mini-sglang": theirs,
        }
        if theirs is not None:  # the busy times where both tables have them (kernel_table.py)
            total = (
                "busy_us_per_step"
                if "busy_us_per_step" in mine and "busy_us_per_step" in theirs
                else "gpu_us_per_step"
            )
            row["gpu_us_ratio"] = ratio(mine[total], theirs[total], False)
        key = (mine["batch"], mine["temperature"])
        before = [t for t in kernels.get(BASE, []) if (t["batch"], t["temperature"]) == key]
        if before:  # the older final/ of --base: the kernel table before the change
            row["final-base"] = before[0]
        tables.append(row)
    if tables:
        out["kernels"] = tables
    return out


def flat_metrics(out: dict[str, Any]) -> dict[str, float]:
    """The comparison as the results' flat `metrics` (what the docs' result() reads): per workload
    each engine's figure (the median), its best and worst run (a call where one engine's runs
    spread widely says so in the docs' own numbers) and the ratio, per kernel table each engine's
    GPU microseconds a step."""
    metrics: dict[str, float] = {}
    for workload, (_, higher) in MEASURES.items():
        if workload in out:
            r = out[workload]
            metrics |= {f"{workload}_final": r["final"], f"{workload}_minisgl": r["mini-sglang"], f"{workload}_ratio": r["ratio"]}  # fmt: skip
            for engine, key in (("final", "final"), ("mini-sglang", "minisgl")):
                ordered = sorted(r.get("runs", {}).get(engine, []), reverse=higher)  # best first
                if ordered:
                    metrics |= {f"{workload}_{key}_best": ordered[0], f"{workload}_{key}_worst": ordered[-1]}
            if "base" in r:
                metrics |= {f"{workload}_base": r["base"], f"{workload}_vs_base": r["vs_base"]}
    for row in out.get("kernels", []):
        case = f"kernels_b{row['batch']}_t{round(10 * row['temperature']):02d}"  # t06: temperature 0.6
        metrics[f"{case}_final_us"] = row["final"]["gpu_us_per_step"]
        if "busy_us_per_step" in row["final"]:  # each overlapped stretch once (kernel_table.py)
            metrics[f"{case}_final_busy_us"] = row["final"]["busy_us_per_step"]
        if row["mini-sglang"] is not None:
            metrics[f"{case}_minisgl_us"] = row["mini-sglang"]["gpu_us_per_step"]
            if "busy_us_per_step" in row["mini-sglang"]:
                metrics[f"{case}_minisgl_busy_us"] = row["mini-sglang"]["busy_us_per_step"]
            metrics[f"{case}_ratio"] = row["gpu_us_ratio"]
        if "final-base" in row:
            metrics[f"{case}_base_us"] = row["final-base"]["gpu_us_per_step"]
    return metrics


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument(
        "--out", type=Path, required=True, help="results folder, e.g. benchmarks/results/h200"
    )
    parser.add_argument("--gpu", required=True, help="the GPU's tag in file names, e.g. h200")
    parser.add_argument(
        "--attn", default="fi", help="Mini-SGLang's attention backend (its fi needs no sgl-kernel)"
    )
    parser.add_argument(
        "--final-attn",
        default="auto",
        help="final/'s --attn: auto, what it serves with (on Hopper FlashAttention 4's prefill and "
        "FlashInfer's decode where flash-attn-4 is installed; the result records what it resolved to); "
        "fi for kernel-for-kernel parity with Mini-SGLang's fi",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0, help="the workloads' scale (CPU smoke runs)")
    parser.add_argument("--workloads", nargs="+", default=list(MEASURES), choices=list(MEASURES))
    parser.add_argument(
        "--kernel-batches", type=int, nargs="*", default=[1, 256], help="none: no kernel table"
    )
    parser.add_argument("--kernel-temperatures", type=float, nargs="+", default=[0.0, 0.6])
    parser.add_argument("--base", type=Path, default=None, help="a folder holding an older `final` package")
    args = parser.parse_args(argv)
    engines = ENGINES + ((BASE,) if args.base else ())
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {e: {w: [] for w in args.workloads} for e in engines}
    kernels: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        for _ in range(args.repeats):
            for workload in args.workloads:
                for engine in engines:  # alternating: a drift of the machine falls on all of them
                    runs[engine][workload].append(peer_run(engine, workload, args, tmp))
        if args.kernel_batches:
            for engine in engines:
                path = tmp / f"kernels_{engine}.json"
                name, extra = ("final", ["--final-path", str(args.base)]) if engine == BASE else (engine, [])
                cmd = [
                    sys.executable,
                    "-m",
                    "scripts.kernel_table",
                    "--engine",
                    name,
                    *extra,
                    "--model",
                    str(args.model),
                ]
                cmd += ["--attn", attn_of(engine, args), "--batch", *map(str, args.kernel_batches)]
                cmd += ["--temperature", *map(str, args.kernel_temperatures), "--json", str(path)]
                run(cmd)
                kernels[engine] = json.loads(path.read_text())
    first = next(r for e in ENGINES for w in args.workloads for r in runs[e][w])
    result: dict[str, Any] = {
        "name": result_name(args),
        "stage": "versus",
        "workload": "versus",
        "config": {
            "model": args.model.name,
            "attn": args.attn,  # Mini-SGLang's
            "final_attn": args.final_attn,
            # What it resolved to in final/'s runs (auto's choice moves with the GPU and packages).
            **final_attn_resolved(runs),
            "repeats": args.repeats,
            "scale": args.scale,
            "final_page_size": 16,
            "minisgl_page_size": 1,
        },  # fmt: skip
        "hardware": first["hardware"],
        "versions": first["versions"],
        "command": shlex.join(["python", "-m", "scripts.bench_versus", *argv]),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **assemble(runs, kernels),
    }
    result["metrics"] = flat_metrics(result)
    stamp_run_id(result)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{result['name']}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    for workload in args.workloads:
        if workload in result:
            r = result[workload]
            print(
                f"[bench_versus] {workload}: final {r['final']:.4g}, Mini-SGLang {r['mini-sglang']:.4g}, ratio {r['ratio']:.3f}"
            )
    for row in result.get("kernels", []):
        theirs = row["mini-sglang"] or {}
        print(
            f"[bench_versus] kernels b{row['batch']} t{row['temperature']}: final {row['final']['gpu_us_per_step']} us, "
            f"Mini-SGLang {theirs.get('gpu_us_per_step')} us"
        )
    print(f"[bench_versus] -> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
