"""python -m stages.01_naive_generate --prompt "What is the capital of France?"

The arguments are parsed before the engine (and with it torch) is imported, so `--help` answers
at once; the flags every stage shares live in stages/common/cli.py.
"""

from __future__ import annotations

import argparse
import sys

from stages.common import cli
from stages.common.errors import run_cli


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser(
        "python -m stages.01_naive_generate",
        "Stage 01: answer one prompt with a contiguous KV cache, streaming the answer.",
    )
    cli.add_model_args(p)
    cli.add_prompt_args(p, many=False)
    cli.add_sampling_args(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = cli.sampling_params(args)
    from .engine import LLM

    threads = cli.set_threads(args)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_context=args.max_seq_len_override)
    cli.say(threads)  # once the model is up: a bad flag's error stays one line
    (prompt_ids,) = cli.encode_prompts(llm.tokenizer, [args.prompt], args)
    out = llm.generate_one(prompt_ids, params, on_text=lambda text: print(text, end="", flush=True))
    print()
    decoded = len(out.token_ids) - 1
    decode_s = out.latency_s - out.ttft_s
    print(
        f"[{llm.device.type}, {str(llm.dtype).removeprefix('torch.')}] "
        f"prefill: {cli.plural(len(prompt_ids), 'token')}, {len(prompt_ids) / out.ttft_s:.0f} tok/s "
        f"(time to first token {out.ttft_s * 1000:.0f} ms); "
        f"decode: {cli.plural(decoded, 'token')}, {decoded / decode_s if decode_s > 0 else 0:.1f} tok/s; "
        f"finish: {out.finish_reason}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run_cli(main)
