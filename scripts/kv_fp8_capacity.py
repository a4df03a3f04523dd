"""How many tokens final/'s KV pool holds at a fixed --memory-ratio, and how many requests of an
8k-token context fit in it at once, with the model's dtype and with FP8 (issue 32).

    python -m scripts.kv_fp8_capacity --model checkpoints/qwen3-0.6b-random --device cuda \\
        --attn fi --page-size 16 --memory-ratio 0.9 --out benchmarks/results/h200

Each KV dtype is measured in a process of its own (the engine sizes its pool from the memory left
after the weights and the CUDA graphs, which an earlier engine in the same process would take),
and gets a result file `kv_fp8_capacity_<dtype>_<device>.json` (benchmarks/README.md's schema):

    kv_tokens          tokens the pool holds (pages x page size)
    kv_gib             the pool's size, K and V of every layer
    bytes_per_token    what one token of context costs there
    requests_at_ctx    requests of --context tokens (prompt + answer) the pool holds at once
    batch_at_ctx       the same, capped by --max-running-requests: the largest decode batch

On the CPU the pool is a fixed 32768 tokens (no device memory to measure), so only the bytes
differ there; on a GPU the same memory holds twice the tokens in FP8.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DTYPES = ("auto", "fp8_e4m3")


def measure(args: argparse.Namespace, kv_cache_dtype: str) -> dict:
    """Build the engine (in this process) and read its pool."""
    import final
    from final.core.devices import kv_dtype_name

    extra = {"page_size": args.page_size} if args.page_size else {}
    llm = final.LLM(
        args.model, device=args.device, dtype=args.dtype, attn=args.attn, kv_cache_dtype=kv_cache_dtype,
        memory_ratio=args.memory_ratio, max_running_requests=args.max_running, **extra,
    )  # fmt: skip
    runner = llm.core.executor.runner
    page_size, pages = runner.page_size, runner.num_pages
    per_request = -(-args.context // page_size)
    requests = pages // per_request
    page_bytes = runner.page_bytes()
    return {
        "kv_dtype": kv_dtype_name(runner.kv_dtype),
        "model_dtype": str(runner.dtype).removeprefix("torch."),
        "device": llm.device.type,
        "attn": runner.backend.name,
        "page_size": page_size,
        "metrics": {
            "kv_tokens": pages * page_size,
            "batch_at_ctx": min(requests, args.max_running),
            "requests_at_ctx": requests,
            "kv_gib": pages * page_bytes / 2**30,
            "bytes_per_token": page_bytes / page_size,
            "kv_pages": pages,
        },
    }


def result(args: argparse.Namespace, argv: list[str], child: dict, tag: str) -> dict:
    from stages.common.bench import stamp_run_id
    from stages.common.hardware import describe, versions

    model = Path(args.model).name if args.model else "SmolLM2-135M-Instruct"
    name = f"kv_fp8_capacity_{child['kv_dtype']}_{tag}"
    return stamp_run_id(
        {
            "name": name,
            "stage": "final",
            "workload": "kv-capacity",
            "label": f"{child['kv_dtype']} cache, {child['model_dtype']} model",
            "metrics": child["metrics"],
            "config": {
                "model": model,
                "dtype": child["model_dtype"],
                "kv_cache_dtype": child["kv_dtype"],
                "memory_ratio": args.memory_ratio,
                "context": args.context,
                "max_running_requests": args.max_running,
                "attn": child["attn"],
                "page_size": child["page_size"],
                "device": tag,
            },  # fmt: skip
            "hardware": describe(),
            "versions": versions(),
            "command": shlex.join(["python", "-m", "scripts.kv_fp8_capacity", *argv]),
            "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child_out:  # one dtype, in this fresh process
        Path(args.child_out).write_text(json.dumps(measure(args, args.child_dtype)))
        return 0
    from stages.common.hardware import device_tag

    tag = args.device_tag or device_tag(args.device)
    out = args.out or ROOT / "benchmarks" / "results" / tag
    out.mkdir(parents=True, exist_ok=True)
    for kv_cache_dtype in DTYPES:
        with tempfile.TemporaryDirectory() as tmp:
            child_out = Path(tmp) / "child.json"
            cmd = [
                sys.executable,
                "-m",
                "scripts.kv_fp8_capacity",
                *argv,
                "--child-dtype",
                kv_cache_dtype,
                "--child-out",
                str(child_out),
            ]
            if subprocess.run(cmd).returncode != 0:
                print(f"[kv-capacity] the {kv_cache_dtype} run failed; its output is above", file=sys.stderr)
                return 1
            child = json.loads(child_out.read_text())
        data = result(args, argv, child, tag)
        path = out / f"{data['name']}.json"
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"[kv-capacity] {data['name']}: {data['metrics']} -> {path}", file=sys.stderr)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--device", default="auto")
    p.add_argument(
        "--device-tag", default=None, help="the device's name in the result (default: h200, cpu...)"
    )
    p.add_argument("--dtype", default="auto")
    p.add_argument("--attn", default="auto")
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument("--memory-ratio", type=float, default=0.9)
    p.add_argument("--max-running", type=int, default=256, help="--max-running-requests")
    p.add_argument("--context", type=int, default=8192, help="tokens of context per request")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--child-dtype", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
