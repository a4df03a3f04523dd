"""python -m stages.06_overlap --prompt "..." --prompt "..." [--disable-overlap]"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from stages.common.errors import UserError, run_cli
from stages.common.sampling import SamplingParams

from .engine import LLM
from .radix_cache import CACHES
from .scheduler import DEFAULT_MAX_PREFILL_LENGTH, POLICIES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m stages.06_overlap",
        description="Stage 06: a batch of prompts served together; the host schedules step N+1 while the GPU runs step N.",
    )
    p.add_argument("--model", default=None, help="HF model folder or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
    p.add_argument("--prompts-file", type=Path, help="one prompt per line, or JSONL with a 'prompt' field")
    p.add_argument("--chat", action="store_true", help="wrap each prompt in the model's chat template")
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate per prompt")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    p.add_argument("--top-k", type=int, default=-1, help="keep the k likeliest tokens (-1: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the likeliest")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating after end-of-sequence")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (default)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument("--max-seq-len-override", type=int, default=None, help="cap the context length")
    p.add_argument("--attn", default="auto", help="attention backend: torch, fi, PREFILL,DECODE or auto")
    p.add_argument("--page-size", type=int, default=1, help="tokens per KV page (default 1)")
    p.add_argument("--num-pages", type=int, default=None, help="KV pages in the pool (default: from memory)")
    p.add_argument(
        "--memory-ratio", type=float, default=0.9, help="share of GPU memory for weights + KV cache"
    )
    p.add_argument("--max-running-requests", type=int, default=256, help="most requests decoding at once")
    p.add_argument(
        "--cache",
        "--cache-type",
        choices=sorted(CACHES),
        default="radix",
        help="prefix cache: radix reuses shared prefixes (default), naive recomputes every prompt",
    )
    p.add_argument(
        "--max-prefill-length",
        type=int,
        default=DEFAULT_MAX_PREFILL_LENGTH,
        help=f"prompt tokens one step computes; longer prompts are chunked (default {DEFAULT_MAX_PREFILL_LENGTH})",
    )
    p.add_argument(
        "--chunk-policy", choices=POLICIES, default="mixed",
        help="mixed: decodes ride along with prefill chunks (default); prefill-first: decodes wait",
    )  # fmt: skip
    p.add_argument(
        "--cuda-graph-max-bs", type=int, default=None,
        help="largest decode batch captured as a CUDA graph (default: --max-running-requests, at most 256, "
        "on a GPU; 0: off)",
    )  # fmt: skip
    p.add_argument(
        "--disable-overlap", action="store_true",
        help="process each step before scheduling the next (default: overlap them; also STAGE06_DISABLE_OVERLAP=1)",
    )  # fmt: skip
    return p.parse_args(argv)


def read_prompts(args: argparse.Namespace) -> list[str]:
    prompts = list(args.prompt)
    if args.prompts_file:
        try:
            lines = args.prompts_file.read_text().splitlines()
        except OSError as err:
            raise UserError(f"cannot read {args.prompts_file}: {err}") from err
        for line in filter(str.strip, lines):
            prompts.append(json.loads(line)["prompt"] if line.lstrip().startswith("{") else line)
    if not prompts:
        raise UserError("give at least one --prompt or a --prompts-file")
    return prompts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prompts = read_prompts(args)
    params = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        max_tokens=args.max_tokens, stop=args.stop, ignore_eos=args.ignore_eos,
    )  # fmt: skip
    llm = LLM(
        args.model, device=args.device, dtype=args.dtype, attn=args.attn, page_size=args.page_size,
        num_pages=args.num_pages, memory_ratio=args.memory_ratio,
        max_running_requests=args.max_running_requests, max_context=args.max_seq_len_override, cache=args.cache,
        max_prefill_length=args.max_prefill_length, chunk_policy=args.chunk_policy,
        cuda_graph_max_bs=args.cuda_graph_max_bs, disable_overlap=args.disable_overlap or None,
    )  # fmt: skip
    ids = [llm.tokenizer.encode_prompt(p, chat=args.chat) for p in prompts]
    start = time.perf_counter()
    outputs = llm.generate(ids, params, progress=len(prompts) > 8)
    elapsed = time.perf_counter() - start
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        print(f"--- [{i}] {prompt!r}\n{out.text}")
    generated = sum(len(o.token_ids) for o in outputs)
    runner = llm.runner
    graphs = (
        f"decode batches up to {runner.graphs.max_batch}" if runner.graphs else "off, decode runs eagerly"
    )
    print(
        f"[{llm.device.type}, {str(llm.dtype).removeprefix('torch.')}] {len(prompts)} requests, "
        f"{generated} tokens in {elapsed:.2f} s: {generated / elapsed:.1f} output tok/s; "
        f"preemptions: {llm.scheduler.num_preemptions}; prefix cache ({args.cache}): "
        f"{llm.scheduler.num_cached_tokens} of {llm.scheduler.num_prompt_tokens} prompt tokens cached "
        f"({100 * llm.scheduler.hit_rate:.1f}%); CUDA graphs: {graphs}; overlap: {'on' if llm.overlap else 'off'}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
