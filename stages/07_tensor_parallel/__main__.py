"""python -m stages.07_tensor_parallel --tp 2 --prompt "..." --prompt "..."

The model is sharded over `--tp` processes, which the engine starts itself (one per GPU, or on the
CPU with gloo); `--tp 1` is stage 06. Across machines, node 0 runs this command with `--nnodes N
--node-rank 0 --dist-init-addr HOST:PORT` and every other node the same with its own
`--node-rank` and no prompt: it only starts its ranks.

The prompts arrive one engine step apart (`--stagger`), as a server's requests do, so a prompt
finds the prefix an earlier one left in the cache; each answer says how many of its prompt
tokens came from there.
"""

from __future__ import annotations

import argparse
import sys
import time

from stages.common import cli
from stages.common.errors import UserError, run_cli

from .radix_cache import CACHES

# scheduler.py's DEFAULT_MAX_PREFILL_LENGTH and POLICIES, written out so that `--help` needs no
# torch (the scheduler imports it); tests/engines/test_cli_start.py keeps the two equal.
MAX_PREFILL_LENGTH = 8192
CHUNK_POLICIES = ("mixed", "prefill-first")
OVERLAP_MODES = {"auto": None, "on": False, "off": True}  # --overlap -> LLM(disable_overlap=...)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser(
        "python -m stages.07_tensor_parallel",
        "Stage 07: a batch of prompts served by a model sharded over --tp processes (GPUs, or CPU processes).",
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
    p.add_argument(
        "--cuda-graph-max-bs", type=cli.non_negative_int, default=None,
        help="largest decode batch captured as a CUDA graph (default: --max-running-requests, at most 256, "
        "on a GPU; 0: off)",
    )  # fmt: skip
    overlap = p.add_mutually_exclusive_group()
    overlap.add_argument(
        "--overlap", choices=OVERLAP_MODES, default="auto",
        help="schedule step N+1 while step N runs; auto: on a GPU, and off on the CPU, where nothing runs "
        "asynchronously (on: the overlapped loop anyway)",
    )  # fmt: skip
    overlap.add_argument(
        "--disable-overlap",
        dest="overlap",
        action="store_const",
        const="off",
        help="the same as --overlap off",
    )
    p.add_argument(
        "--tp", "--tp-size", "--tensor-parallel-size", type=int, default=1,
        help="tensor-parallel degree: the model sharded over this many processes, rank i on GPU i (gloo on the "
        "CPU); 1: off",
    )  # fmt: skip
    p.add_argument("--nnodes", type=int, default=1, help="machines the ranks span, tp / nnodes on each")
    p.add_argument(
        "--node-rank", type=int, default=0,
        help="this machine's index; a node other than 0 only starts its ranks (no prompt needed)",
    )  # fmt: skip
    p.add_argument(
        "--dist-init-addr", default=None, metavar="HOST:PORT",
        help="where the ranks meet (node 0 serves it; default: a free loopback port); needed with --nnodes > 1",
    )  # fmt: skip
    p.add_argument(
        "--dist-timeout", type=float, default=600.0, metavar="SECONDS",
        help="how long a collective may wait for the other ranks; a rank silent for half of it (30 s at most) is lost",
    )  # fmt: skip
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.node_rank != 0:
        return serve_node(args)
    prompts = cli.read_prompts(args)
    params = cli.sampling_params(args)
    from .engine import LLM
    from .ranks import FAILED_EXIT_CODE, RankFailure

    threads = cli.set_threads(args)
    llm = LLM(
        args.model, device=args.device, dtype=args.dtype, attn=args.attn, page_size=args.page_size,
        num_pages=args.num_pages, memory_ratio=args.memory_ratio,
        max_running_requests=args.max_running_requests, max_context=args.max_seq_len_override, cache=args.cache,
        max_prefill_length=args.max_prefill_length, chunk_policy=args.chunk_policy,
        cuda_graph_max_bs=args.cuda_graph_max_bs, disable_overlap=OVERLAP_MODES[args.overlap], tp=args.tp,
        nnodes=args.nnodes, dist_init_addr=args.dist_init_addr, dist_timeout=args.dist_timeout,
    )  # fmt: skip
    cli.say(threads)  # once the model is up: a bad flag's error stays one line
    with llm:
        ids = cli.encode_prompts(llm.tokenizer, prompts, args)
        start = time.perf_counter()
        try:
            outputs = cli.generate_staggered(llm, ids, params, args.stagger, progress=len(prompts) > 8)
        except RankFailure as err:  # a lost rank: one line, no traceback
            print(f"error: {err}", file=sys.stderr)
            return FAILED_EXIT_CODE
        elapsed = time.perf_counter() - start
    for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True)):
        print(
            f"--- [{i}] {prompt!r} ({out.cached_tokens} of {len(out.prompt_ids)} prompt tokens cached)\n{out.text}"
        )
    generated = sum(len(o.token_ids) for o in outputs)
    runner = llm.runner
    graphs = (
        f"decode batches up to {runner.graphs.max_batch}" if runner.graphs else "off, decode runs eagerly"
    )
    print(
        f"[{llm.device.type}, {str(llm.dtype).removeprefix('torch.')}] {cli.plural(len(prompts), 'request')}, "
        f"{cli.plural(generated, 'token')} in {elapsed:.2f} s: {generated / elapsed:.1f} output tok/s; "
        f"preemptions: {llm.scheduler.num_preemptions}; prefix cache ({args.cache}): "
        f"{llm.scheduler.num_cached_tokens} of {llm.scheduler.num_prompt_tokens} prompt tokens cached "
        f"({100 * llm.scheduler.hit_rate:.1f}%); CUDA graphs: {graphs}; overlap: {overlap_report(llm)}; "
        f"tensor parallelism: {cli.plural(args.tp, 'rank')}",
        file=sys.stderr,
    )
    return 0


def serve_node(args: argparse.Namespace) -> int:
    """A node other than node 0: start its ranks for node 0's engine and wait for them."""
    if args.dist_init_addr is None:
        raise UserError("--node-rank > 0 needs --dist-init-addr HOST:PORT, node 0's rendezvous")
    if not 0 < args.node_rank < args.nnodes or args.tp % args.nnodes:
        raise UserError(f"--node-rank {args.node_rank} with --nnodes {args.nnodes} and --tp {args.tp}: the "
                        "node rank must be below --nnodes, which must divide --tp")  # fmt: skip
    from .ranks import serve_node

    return serve_node(args.tp, args.nnodes, args.node_rank, args.dist_init_addr)


def overlap_report(llm) -> str:
    if llm.overlap:
        return "on"
    return "off (the CPU's default: nothing runs asynchronously)" if llm.device.type == "cpu" else "off"


if __name__ == "__main__":
    run_cli(main)
