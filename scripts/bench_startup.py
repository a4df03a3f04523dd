"""Start-up time of the command lines: how long `--help` takes, and where a real run's start-up goes.

    python -m scripts.bench_startup                        # results in benchmarks/results/
    python -m scripts.bench_startup --repeats 1 --out /tmp/startup   # a quick look

Every measurement is a fresh process (a warm import cache is what a reader has on the second
run, so one untimed run goes first). For every stage and `final` it writes
`<group>_startup_cpu.json` with `help_s`, the median wall time of `python -m ENGINE --help`;
stage 01's file adds the phases of a real run, timed inside one process: the interpreter, importing
torch, transformers and the stage, loading the tokenizer, building the engine (config, tokenizer
again, weights), and the first token.
The results follow benchmarks/README.md; scripts/render_results.py renders them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.stage_contract import list_stages

ROOT = Path(__file__).resolve().parents[1]

# One real run of stage 01, phase by phase, in a fresh process; prints the phases as JSON.
PHASES = """
import importlib, json, time
marks, start = {}, time.perf_counter()
def mark(name):
    global start
    now = time.perf_counter()
    marks[name], start = now - start, now
import torch; mark("import_torch_s")
import transformers; mark("import_transformers_s")
from stages.common.model_source import resolve_model
from stages.common.sampling import SamplingParams
from stages.common.tokenizer import Tokenizer
engine = importlib.import_module("stages.01_naive_generate.engine"); mark("import_stage_s")
Tokenizer(resolve_model(None)); mark("tokenizer_s")
llm = engine.LLM(None, device="cpu"); mark("engine_s")
ids = llm.tokenizer.encode_prompt("What is the capital of France?")
llm.generate_one(ids, SamplingParams(temperature=0, max_tokens=1)); mark("first_token_s")
print(json.dumps(marks))
"""


def wall(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=ROOT, check=True, capture_output=True)
    return time.perf_counter() - start


def median_wall(argv: list[str], repeats: int) -> float:
    wall(argv)  # untimed: the first run fills the OS page cache and Python's bytecode cache
    return statistics.median(wall(argv) for _ in range(repeats))


def stage01_phases(repeats: int) -> dict[str, float]:
    runs = []
    subprocess.run([sys.executable, "-c", PHASES], cwd=ROOT, check=True, capture_output=True)
    for _ in range(repeats):
        proc = subprocess.run(
            [sys.executable, "-c", PHASES], cwd=ROOT, check=True, capture_output=True, text=True
        )
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    phases = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    phases["interpreter_s"] = median_wall([sys.executable, "-c", "pass"], repeats)
    return phases


def engines() -> list[tuple[str, str, str]]:
    """(group, stage, module) for every stage and final."""
    out = [(f"stage{s.name[:2]}", s.name, f"stages.{s.name}") for s in list_stages(ROOT)]
    return [*out, ("final", "final", "final")]


def record(name: str, stage: str, metrics: dict[str, float], repeats: int) -> dict:
    from stages.common.bench import script_result

    return script_result(
        "scripts.bench_startup",
        None,
        name=name,
        stage=stage,
        workload="startup",
        metrics={k: round(v, 4) for k, v in metrics.items()},
        config={"device": "cpu", "repeats": repeats, "model": "SmolLM2-135M-Instruct"},
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (median)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="result folder")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for group, stage, module in engines():
        metrics = {"help_s": median_wall([sys.executable, "-m", module, "--help"], args.repeats)}
        if stage.startswith("01_"):
            metrics |= stage01_phases(args.repeats)
        name = f"{group}_startup_cpu"
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(record(name, stage, metrics, args.repeats), indent=2) + "\n")
        print(f"{path}: " + ", ".join(f"{k} {v:.3f}" for k, v in metrics.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
