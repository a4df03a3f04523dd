"""Where the fused q/k-norm + RoPE + K/V kernel's programmatic dependent launch stops paying.

    python -m scripts.results_pdl LOGS_DIR      # the pdl_kernels_{off,shipped,all}.json of pdl-ab

`bash scripts/gpu_run.sh pdl-ab` takes final/'s decode-step kernel table (scripts/kernel_table.py)
at batch 1, 64 and 256 three ways: PDL off (`FINAL_PDL=0`), as shipped (the fused kernel under PDL
for steps of up to `PDL_MAX_TOKENS` tokens, final/kernels/qk_norm_rope_kv.py) and everywhere
(`FINAL_PDL_MAX_TOKENS` past any batch). Per batch this prints the GPU's busy time a step and the
fused kernel's own time each way, and the bound the figures support: the largest batch measured
at which PDL everywhere keeps the GPU busy no longer than PDL off (within 1%, the tables' noise
between two runs of one call); PDL is on by default below it.

Busy time counts the kernels' union and leaves out the gaps between them, which are what a
dependent launch closes: on the H200 (session 15) the batch-1 step was 12% shorter with PDL while
its busy time was 0.5% longer. So the bound this prints is a lower one; `gpu_run.sh pdl-bound`
compares the decode step's time itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

VARIANTS = ("off", "shipped", "all")
FUSED = "fused_qk_norm_rope_store_kv_kernel"
NOISE = 0.01


def load(logs: Path) -> dict[str, list[dict[str, Any]]]:
    return {v: json.loads((logs / f"pdl_kernels_{v}.json").read_text()) for v in VARIANTS if (logs / f"pdl_kernels_{v}.json").exists()}  # fmt: skip


def fused_us(table: dict[str, Any]) -> float:
    """The fused kernel's exclusive GPU time a step (0 where the table's top list lacks it)."""
    return sum(entry[3] for entry in table.get("top", []) if entry[0] == FUSED)


def busy_us(table: dict[str, Any]) -> float:
    return table.get("busy_us_per_step", table["gpu_us_per_step"])


def by_batch(tables: dict[str, list[dict[str, Any]]]) -> dict[int, dict[str, dict[str, Any]]]:
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for variant, rows in tables.items():
        for row in rows:
            if "batch" in row:
                out.setdefault(row["batch"], {})[variant] = row
    return dict(sorted(out.items()))


def supported_bound(tables: dict[str, list[dict[str, Any]]]) -> int | None:
    """The largest batch at which PDL everywhere is no slower than off, every smaller batch measured
    agreeing; None where the first batch already loses (or a variant is missing)."""
    bound = None
    for batch, row in by_batch(tables).items():
        if "off" not in row or "all" not in row:
            return bound
        if busy_us(row["all"]) > busy_us(row["off"]) * (1 + NOISE):
            return bound
        bound = batch
    return bound


def report(tables: dict[str, list[dict[str, Any]]]) -> str:
    lines = ["batch | " + " | ".join(f"{v}: busy / fused µs" for v in VARIANTS if v in tables)]
    for batch, row in by_batch(tables).items():
        cells = [
            f"{busy_us(row[v]):,.1f} / {fused_us(row[v]):,.1f}" if v in row else "-"
            for v in VARIANTS
            if v in tables
        ]
        lines.append(f"{batch} | " + " | ".join(cells))
    bound = supported_bound(tables)
    lines.append(
        "PDL everywhere loses at the smallest batch measured: keep the fused kernel off PDL"
        if bound is None
        else f"PDL pays up to batch {bound} of those measured: PDL_MAX_TOKENS may be {bound}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("logs", type=Path, help="the folder holding pdl_kernels_*.json")
    args = parser.parse_args(argv)
    tables = load(args.logs)
    if "off" not in tables or "all" not in tables:
        print(f"error: {args.logs} needs pdl_kernels_off.json and pdl_kernels_all.json", file=sys.stderr)
        return 2
    print(report(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
