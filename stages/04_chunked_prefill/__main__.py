"""python -m stages.04_chunked_prefill --prompt "..." --prompt "..." [--max-prefill-length N]

The prompts arrive one engine step apart (`--stagger`), as a server's requests do, so a prompt
finds the prefix an earlier one left in the cache; each answer says how many of its prompt
tokens came from there.
"""

from __future__ import annotations

import argparse
import sys
import time

from stages.common import cli
from stages.common.errors import run_cli

from .radix_cache import CACHES

# scheduler.py's DEFAULT_MAX_PREFILL_LENGTH and POLICIES, written out so that `--help` needs no
# torch (the scheduler imports it); tests/engines/test_cli_start.py keeps the two equal.
MAX_PREFILL_LENGTH = 8192
CHUNK_POLICIES = ("mixed", "prefill-first")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser(
        "python -m stages.04_chunked_prefill",
        "Stage 04: a batch of prompts served together; long prompts are prefilled in chunks.",
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
    p.add_argument(
        "--cache", "--cache-type", choices=sorted(CACHES), default="radix",
        help="prefix cache: radix reuses shared prefixes, naive recomputes every prompt",
    )  # fmt: skip
    p.add_argument(
        "--stagger", type=cli.non_negative_int, default=1, metavar="STEPS",
        help="add the prompts this many engine steps apart; 0: all in the first step, where a prompt "
        "reuses another's prefix only when it is long enough to be worth waiting a step for (scheduler.py)",
    )  # fmt: skip
    p.add_argument(
        "--max-prefill-length", type=int, default=MAX_PREFILL_LENGTH,
        help="prompt tokens one step computes; longer prompts are chunked",
    )  # fmt: skip
    p.add_argument(
        "--chunk-policy", choices=CHUNK_POLICIES, default="mixed",
        help="mixed: decodes ride along with prefill chunks; prefill-first: decodes wait",
    )  # fmt: skip
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
        max_running_requests=args.max_running_requests, max_context=args.max_seq_len_override, cache=args.cache,
        max_prefill_length=args.max_prefill_length, chunk_policy=args.chunk_policy,
    )  # fmt: skip
    cli.say(threads)  # once the model is up: a bad flag's error stays one line
    ids = cli.encode_prompts(llm.tokenizer, prompts, args)
    start = time.perf_counter()
    outputs = cli.generate_staggered(llm, ids, params, args.stagger, progress=len(prompts) > 8)
    elapsed = time.perf_counter() - start
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        print(
            f"--- [{i}] {prompt!r} ({out.cached_tokens} of {len(out.prompt_ids)} prompt tokens cached)\n{out.text}"
        )
    generated = sum(len(o.token_ids) for o in outputs)
    print(
        f"[{llm.device.type}, {str(llm.dtype).removeprefix('torch.')}] {cli.plural(len(prompts), 'request')}, "
        f"{cli.plural(generated, 'token')} in {elapsed:.2f} s: {generated / elapsed:.1f} output tok/s; "
        f"preemptions: {llm.scheduler.num_preemptions}; prefix cache ({args.cache}): "
        f"{llm.scheduler.num_cached_tokens} of {llm.scheduler.num_prompt_tokens} prompt tokens cached "
        f"({100 * llm.scheduler.hit_rate:.1f}%)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
