"""python -m stages.02_paged_kv --prompt "..." --prompt "..." [--prompts-file FILE] [--attn fi]

The arguments are parsed before the engine (and with it torch) is imported, so `--help` answers
at once; the flags every stage shares live in stages/common/cli.py.
"""

from __future__ import annotations

import argparse
import sys
import time

from stages.common import cli
from stages.common.errors import run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser(
        "python -m stages.02_paged_kv",
        "Stage 02: a batch of prompts served together with a paged KV cache and continuous batching.",
    )
    cli.add_model_args(p)
    cli.add_prompt_args(p, many=True)
    cli.add_sampling_args(p)
    p.add_argument(
        "--attn", default="auto", help="attention backend: torch, fi (CUDA), PREFILL,DECODE or auto"
    )
    p.add_argument("--page-size", type=int, default=1, help="tokens per KV page")
    p.add_argument("--num-pages", type=int, default=None, help="KV pages in the pool (default: from memory)")
    p.add_argument(
        "--memory-ratio", type=float, default=0.9, help="share of GPU memory for weights + KV cache"
    )
    p.add_argument("--max-running-requests", type=int, default=256, help="most requests decoding at once")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prompts = cli.read_prompts(args)
    params = cli.sampling_params(args)
    from .engine import LLM

    threads = cli.set_threads(args)
    llm = LLM(
        args.model, device=args.device, dtype=args.dtype, attn=args.attn, page_size=args.page_size,
        num_pages=args.num_pages, memory_ratio=args.memory_ratio,
        max_running_requests=args.max_running_requests, max_context=args.max_seq_len_override,
    )  # fmt: skip
    cli.say(threads)  # once the model is up: a bad flag's error stays one line
    ids = cli.encode_prompts(llm.tokenizer, prompts, args)
    start = time.perf_counter()
    outputs = llm.generate(ids, params, progress=len(prompts) > 8)
    elapsed = time.perf_counter() - start
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        print(f"--- [{i}] {prompt!r}\n{out.text}")
    generated = sum(len(o.token_ids) for o in outputs)
    print(
        f"[{llm.device.type}, {str(llm.dtype).removeprefix('torch.')}] {cli.plural(len(prompts), 'request')}, "
        f"{cli.plural(generated, 'token')} in {elapsed:.2f} s: {generated / elapsed:.1f} output tok/s; "
        f"preemptions: {llm.scheduler.num_preemptions}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
