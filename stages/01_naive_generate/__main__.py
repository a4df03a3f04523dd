"""python -m stages.01_naive_generate --prompt "What is the capital of France?" --chat"""

from __future__ import annotations

import argparse
import sys

from stages.common.errors import run_cli
from stages.common.sampling import SamplingParams

from .engine import LLM


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m stages.01_naive_generate",
        description="Stage 01: answer one prompt with a contiguous KV cache, streaming the answer.",
    )
    p.add_argument("--model", default=None, help="HF model folder or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--prompt", required=True, help="the prompt")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, help="system message (with --chat)")
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
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
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        max_tokens=args.max_tokens, stop=args.stop, ignore_eos=args.ignore_eos,
    )  # fmt: skip
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_context=args.max_seq_len_override)
    prompt_ids = llm.tokenizer.encode_prompt(args.prompt, chat=args.chat, system=args.system)
    out = llm.generate_one(prompt_ids, params, on_text=lambda text: print(text, end="", flush=True))
    print()
    decoded = len(out.token_ids) - 1
    decode_s = out.latency_s - out.ttft_s
    print(
        f"[{llm.device.type}, {str(llm.dtype).removeprefix('torch.')}] "
        f"prefill: {len(prompt_ids)} tokens, {len(prompt_ids) / out.ttft_s:.0f} tok/s "
        f"(time to first token {out.ttft_s * 1000:.0f} ms); "
        f"decode: {decoded} tokens, {decoded / decode_s if decode_s > 0 else 0:.1f} tok/s; "
        f"finish: {out.finish_reason}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
