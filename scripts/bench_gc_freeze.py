"""What a full garbage collection costs each process of the server, before and after it freezes its
start-up heap (final/core/heap.py), on any machine.

    python -m scripts.bench_gc_freeze --out-dir benchmarks/results/cpu     # 3 server starts

Each process of the server (API, detokenizer, engine) logs one line when it is ready: how many
objects it froze, how long the full collection before the freeze took (the pause the process paid
whenever the collector walked its whole heap: a stop of every stream, issue 27) and how long one
takes right after. This starts final/'s real server over the stand-in engine of
tests/fixtures/ticking_engine.py (the engine process's heap is then the engine loop's without a
model: a real engine's is larger) --repeats times and takes the median of each figure.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

from scripts.bench_api_cost import start_server

PROCESSES = ("api", "detokenizer", "engine")
LINE = re.compile(
    r"final\.core\.heap: (\w+): (\d+) start-up objects frozen .*took ([\d.]+) ms, now ([\d.]+) ms"
)


def parse_log(text: str) -> dict[str, dict[str, float]]:
    """{process: {objects, before_ms, after_ms}} from the servers' log lines."""
    return {
        m[1]: {"objects": float(m[2]), "before_ms": float(m[3]), "after_ms": float(m[4])}
        for m in LINE.finditer(text)
    }


def one_start(model: Path) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="bench-gc-") as tmp:
        log_path = Path(tmp) / "server.log"
        server = start_server(model, 0.010, log_path, ["--log-level", "info"])
        try:
            found = parse_log(log_path.read_text())
        finally:
            server.stop()
    missing = set(PROCESSES) - set(found)
    if missing:
        raise SystemExit(f"bench_gc_freeze: no freeze line from {sorted(missing)} in the server's log")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=None, help="a model folder, for its tokenizer")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--name", default=None, help="default: final_gc_freeze_<device>")
    args = parser.parse_args(argv)
    from stages.common import hardware
    from stages.common.bench import script_result, write_result
    from stages.common.default_model import ensure_default_model

    model = args.model or ensure_default_model()
    runs = [one_start(model) for _ in range(args.repeats)]
    metrics = {
        f"{process}_{key}": statistics.median(run[process][key] for run in runs)
        for process in PROCESSES
        for key in ("before_ms", "after_ms", "objects")
    }
    for key, value in metrics.items():
        print(f"{key:24s} {value:12,.1f}")
    if args.out_dir:
        result = script_result(
            "scripts.bench_gc_freeze", argv,
            name=args.name or f"final_gc_freeze_{hardware.device_tag()}",
            stage="final",
            workload="gc-freeze",
            metrics=metrics,
            config={"repeats": args.repeats, "model": model.name, "engine": "stand-in (ticking)"},
            runs=[{f"{p}_{k}": v for p, heap in run.items() for k, v in heap.items()} for run in runs],
        )  # fmt: skip
        print(f"-> {write_result(result, args.out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
