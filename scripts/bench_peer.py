"""Our offline or batch-1 workload on a peer engine (Mini-SGLang or Nano-vLLM), as a result file of
our schema.

    python -m scripts.bench_peer --engine mini-sglang --model checkpoints/qwen3-0.6b-random \
        --out benchmarks/results/h200 --name ladder_minisgl_h200
    python -m scripts.bench_peer --engine mini-sglang --workload latency --model ... --name peer_minisgl_latency_h200

`--workload latency` is our batch-1 workload (one 512-token prompt, greedy, 128 new tokens). A
peer's offline API reports no per-token times, so its decode step is a difference of two timed
calls on the same prompt, one asking for 1 token and one for 128: (t_128 - t_1) / 127. Both run
after a warm-up on that prompt, so a prefix cache serves the prompt equally in both and the
prefill cancels (../shared/peers/latency_minisgl.py measures Mini-SGLang the same way).

The performance ladder on the results page puts these rows beside ours. The requests are our
`offline` workload at scale 1, which is Nano-vLLM's own bench.py draw for draw (256 requests, input
and output lengths uniform in [100, 1024], random ids below 10,000, temperature 0.6, ignore_eos,
seed 0), so every engine serves exactly the same tokens. Each repeat runs in a fresh process; the
throughput counts the output tokens asked for (`ignore_eos` makes them exact) over the wall time
of one `generate` call, after a warm-up, as both projects' benchmarks do.

The peer's package must be importable (its source folder on PYTHONPATH, e.g. `.peers/minisgl`,
see scripts/gpu_run.sh). We call its public offline API only; none of its code is copied here.
Nano-vLLM needs FlashAttention 2 (`flash_attn.flash_attn_varlen_func`); where that is missing the
run stops with one line saying so, and the ladder row keeps saying "next GPU run".
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from stages.common.bench import stamp_run_id

# The engines this script drives through their offline API. `final` is ours, measured here by the
# very method used for the peers (two timed calls for the decode step), so that a comparison of
# final/ against a peer (scripts/bench_versus.py) is one method against itself.
PEERS = {"mini-sglang": "minisgl", "nano-vllm": "nanovllm", "final": "final"}


def peer_requests(model: Path, seed: int, scale: float) -> tuple[list[list[int]], list[int], float]:
    from stages.common.workloads import offline

    config = json.loads((model / "config.json").read_text())
    workload = offline(config["vocab_size"], seed, scale)
    prompts = [item.prompt_ids for item in workload.items]
    return prompts, [item.params.max_tokens for item in workload.items], workload.items[0].params.temperature


def minisgl_engine(model: Path, attn: str):
    import torch
    from minisgl.core import SamplingParams
    from minisgl.llm import LLM

    # The settings of ../shared/peers/bench_minisgl.py: graphs up to 256, page size 1 for FlashInfer.
    llm = LLM(
        str(model), dtype=torch.bfloat16, max_seq_len_override=4096, max_extend_tokens=16384,
        cuda_graph_max_bs=256, page_size=1 if attn == "fi" else 256, attention_backend=attn,
    )  # fmt: skip

    def generate(prompts: list[list[int]], outs: list[int], temperature: float) -> None:
        params = [SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=n) for n in outs]
        llm.generate(prompts, params)

    return generate


def nanovllm_engine(model: Path, attn: str):
    try:
        from nanovllm import LLM, SamplingParams
    except ImportError as exc:  # its attention imports flash_attn 2 at module level
        raise SystemExit(
            f"Nano-vLLM cannot be imported ({exc}); it needs FlashAttention 2 and xxhash"
        ) from exc
    llm = LLM(str(model), enforce_eager=False, max_model_len=4096)  # its bench.py's settings

    def generate(prompts: list[list[int]], outs: list[int], temperature: float) -> None:
        # Nano-vLLM's sampler divides by the temperature: greedy is not offered, a tiny one is.
        t = max(temperature, 1e-5)
        params = [SamplingParams(temperature=t, ignore_eos=True, max_tokens=n) for n in outs]
        llm.generate(prompts, params, use_tqdm=False)

    return generate


def final_engine(model: Path, attn: str, final_path: Path | None = None):
    if final_path is not None:  # another version of final/ (bench_versus --base): imported from there
        sys.path.insert(0, str(final_path))
        assert "final" not in sys.modules, "final/ was imported before --final-path could take effect"
    import final

    if final_path is not None:
        assert Path(final.__file__).resolve().is_relative_to(final_path.resolve()), final.__file__

    # As final/ serves: CUDA graphs and overlap on (their defaults on a GPU), page size 16 with fi
    # (the size every GPU result of final/ uses), the attention backend asked for.
    kwargs = {"attn": attn, "page_size": 16} if attn != "torch" else {"attn": "torch"}
    llm = final.LLM(str(model), dtype="bfloat16" if _has_cuda() else "float32", **kwargs)

    def generate(prompts: list[list[int]], outs: list[int], temperature: float) -> None:
        params = [final.SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=n) for n in outs]
        llm.generate(prompts, params, progress=False)

    generate.attention = resolved_attention(llm)  # type: ignore[attr-defined]
    return generate


def resolved_attention(llm) -> str | None:
    """What `--attn auto` became in this engine ("fa,fi" on Hopper with flash-attn-4): a result
    records it, since the table auto follows changes with the GPU, the packages and the commit.
    None for an engine without the attribute (an older final/ under --final-path)."""
    try:
        return llm.core.executor.runner.backend.name
    except AttributeError:
        return None


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


ENGINES = {"mini-sglang": minisgl_engine, "nano-vllm": nanovllm_engine, "final": final_engine}


def timed(fn, *args) -> float:
    synchronize()
    start = time.perf_counter()
    fn(*args)
    synchronize()
    return time.perf_counter() - start


def run_offline(generate, prompts: list[list[int]], outs: list[int], temperature: float) -> float:
    generate([[1, 2, 3]], [8], temperature)  # warm-up
    return timed(generate, prompts, outs, temperature)


def run_latency(generate, prompt: list[int], new_tokens: int) -> dict[str, float]:
    """The decode step as the difference of two timed calls (see the module docstring)."""
    generate([prompt], [16], 0.0)  # warm-up: kernels, graphs, and the prompt into the prefix cache
    one = timed(generate, [prompt], [1], 0.0)
    many = timed(generate, [prompt], [new_tokens], 0.0)
    step_s = (many - one) / (new_tokens - 1)
    return {"decode_step_ms": 1000 * step_s, "decode_tok_per_s": 1 / step_s, "one_token_ms": 1000 * one,
            "total_s": many, "prompt_tokens": len(prompt), "output_tokens": new_tokens}  # fmt: skip


def synchronize() -> None:
    import torch

    if (
        torch.cuda.is_available()
    ):  # the peers run on CUDA; a CPU stand-in (the tests') has nothing to wait for
        torch.cuda.synchronize()


def child(args: argparse.Namespace) -> None:
    from stages.common.hardware import describe, versions
    from stages.common.workloads import latency

    if args.final_path is not None:
        generate = final_engine(args.model, args.attn, args.final_path)
    else:
        generate = ENGINES[args.engine](args.model, args.attn)
    if args.workload == "latency":
        vocab = json.loads((args.model / "config.json").read_text())["vocab_size"]
        item = latency(vocab, args.seed, args.scale).items[0]
        metrics = run_latency(generate, item.prompt_ids, item.params.max_tokens)
    else:
        prompts, outs, temperature = peer_requests(args.model, args.seed, args.scale)
        seconds = run_offline(generate, prompts, outs, temperature)
        metrics = {"output_tok_per_s": sum(outs) / seconds, "total_s": seconds, "requests": len(prompts),
                   "prompt_tokens": sum(map(len, prompts)), "output_tokens": sum(outs)}  # fmt: skip
    import torch

    cuda = torch.cuda.is_available()
    Path(args.child_out).write_text(
        json.dumps({"metrics": metrics, "hardware": describe(), "versions": versions(),
                    "device": "cuda" if cuda else "cpu", "dtype": "bfloat16" if cuda else "float32",
                    "attention": getattr(generate, "attention", None)})
    )  # fmt: skip


def run_once(argv: list[str], repeat: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "scripts.bench_peer", *argv, "--child", "--child-out", str(out)]
        print(f"[bench_peer] run {repeat + 1}: {shlex.join(cmd[1:])}", file=sys.stderr, flush=True)
        code = subprocess.run(cmd).returncode
        if code != 0 or not out.exists():
            raise SystemExit(f"peer run {repeat + 1} failed (exit code {code}); its output is above")
        return json.loads(out.read_text())


def build_result(args: argparse.Namespace, argv: list[str], runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = list(runs[0]["metrics"])
    result: dict[str, Any] = {
        "name": args.name,
        "stage": args.engine,
        "workload": args.workload,
        "metrics": {k: statistics.median(run["metrics"][k] for run in runs) for k in keys},
        "config": {
            "scale": args.scale,
            "seed": args.seed,
            "model": args.model.name,
            "device": runs[0].get("device", "cuda"),
            "dtype": runs[0].get("dtype", "bfloat16"),
            "attn": args.attn,
            **({"attn_resolved": runs[0]["attention"]} if runs[0].get("attention") else {}),
            "repeats": len(runs),
            **(
                {"method": "difference of a 1-token and a 128-token call"}
                if args.workload == "latency"
                else {}
            ),
        },  # fmt: skip
        "hardware": runs[0]["hardware"],
        "versions": runs[0]["versions"],
        "command": shlex.join(["python", "-m", "scripts.bench_peer", *argv]),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    if len(runs) > 1:
        result["runs"] = [run["metrics"] for run in runs]
    return stamp_run_id(result)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", required=True, choices=sorted(PEERS))
    parser.add_argument("--workload", default="offline", choices=["offline", "latency"])
    parser.add_argument("--model", type=Path, required=True, help="the HF folder both engines load")
    parser.add_argument("--attn", default="fi", help="Mini-SGLang's attention backend (Nano-vLLM has one)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--name", required=True, help="result name, e.g. ladder_minisgl_h200")
    parser.add_argument(
        "--final-path",
        type=Path,
        default=None,
        help="with --engine final: a folder holding another final/ to measure",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    runs = [run_once(argv, i) for i in range(args.repeats)]
    result = build_result(args, argv, runs)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.name}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    m = result["metrics"]
    figure = (
        f"{m['decode_step_ms']:.2f} ms/step"
        if args.workload == "latency"
        else f"{m['output_tok_per_s']:.0f} tok/s"
    )
    print(f"[bench_peer] {args.name}: {figure} -> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
