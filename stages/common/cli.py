"""The command line every stage shares: the model, the prompts and how they are wrapped, sampling.

A stage's `__main__.py` declares its own engine flags and takes these from here. Nothing in this
module imports torch or transformers: a stage parses its arguments first and imports its engine
after, so `--help` and a mistyped flag answer at once instead of after seconds of imports.

The chat default: an instruct model asked a bare question often answers nothing (its first
token is end-of-turn), because it was trained on conversations. So a prompt is wrapped in the
model's chat template whenever the model has one; `--raw` sends the text as it is.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UserError

if TYPE_CHECKING:
    from .outputs import RequestOutput
    from .sampling import SamplingParams
    from .tokenizer import Tokenizer


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default, unless it is None or False (the help text says what those mean)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == []:
            return action.help
        return super()._get_help_string(action)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


class FlagParser(argparse.ArgumentParser):
    """argparse with one rule for flags, the same in every stage and in final/: a flag is spelled
    out (no abbreviations, which a new flag could silently change the meaning of), and a flag it
    does not know gets the nearest it does: `--max-token 8` -> "did you mean --max-tokens?"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            known = list(self._option_string_actions)
            hints = {}
            for item in extras:
                flag = item.split("=", 1)[0]
                near = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("-") else []
                if near:
                    hints[flag] = near[0]
            if len(hints) == 1:
                hint = f"; did you mean {next(iter(hints.values()))}?"
            else:
                hint = "".join(f"; {flag}: did you mean {near}?" for flag, near in hints.items())
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace


def new_parser(prog: str, description: str) -> argparse.ArgumentParser:
    return FlagParser(prog=prog, description=description, formatter_class=HelpFormatter)


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model folder or hub id (default: SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="auto", help="cpu, cuda or auto (CUDA when available)")
    p.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    p.add_argument(
        "--max-seq-len-override", "--max-model-len", type=int, default=None, help="cap the context length"
    )
    p.add_argument(
        "--threads", type=positive_int, default=None,
        help="PyTorch threads on the CPU (default: one per usable CPU, less one; OMP_NUM_THREADS, when set, as it is)",
    )  # fmt: skip


def add_prompt_args(p: argparse.ArgumentParser, many: bool) -> None:
    """--prompt (one, or repeatable with --prompts-file), and how prompts are wrapped."""
    if many:
        p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable)")
        p.add_argument(
            "--prompts-file", type=Path, help="one prompt per line, or JSONL with a 'prompt' field"
        )
    else:
        p.add_argument("--prompt", required=True, help="the prompt")
    wrap = p.add_mutually_exclusive_group()
    wrap.add_argument(
        "--chat", action="store_const", const=True, dest="chat", default=None,
        help="wrap the prompt in the model's chat template (the default when it has one; an error when not)",
    )  # fmt: skip
    wrap.add_argument(
        "--raw", action="store_const", const=False, dest="chat",
        help="send the prompt as plain text to continue, without the chat template",
    )  # fmt: skip
    p.add_argument("--system", default=None, help="a system message before the prompt (chat template only)")


def add_sampling_args(p: argparse.ArgumentParser, max_tokens: int = 128) -> None:
    p.add_argument(
        "--max-tokens", type=int, default=max_tokens,
        help="most tokens to generate per prompt; 0: no cap (until end-of-sequence or the context is full)",
    )  # fmt: skip
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    p.add_argument("--top-k", type=int, default=-1, help="keep the k likeliest tokens (-1: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the likeliest")
    p.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating after end-of-sequence")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    from .sampling import SamplingParams  # torch: only once the arguments are known to be good

    if args.max_tokens < 0:
        raise UserError(f"max_tokens must be >= 0 (0: no cap), got {args.max_tokens}")
    return SamplingParams(
        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        max_tokens=args.max_tokens or None, stop=args.stop, ignore_eos=args.ignore_eos,
    )  # fmt: skip


def set_threads(args: argparse.Namespace) -> str | None:
    """On the CPU, PyTorch's threads by the rule every stage and final/ follow
    (devices.cpu_threads); returns the line that says so (None on a GPU), for `say` to print once
    the model is up (a bad flag's error stays one line). `--threads N` is passed on as
    OMP_NUM_THREADS too, so the processes a stage starts (stage 07's ranks) take it."""
    from .devices import pick_device, set_cpu_threads

    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if pick_device(args.device).type != "cpu":
        return None
    return set_cpu_threads(args.threads, getattr(args, "tp", 1))


def say(line: str | None) -> None:
    """A start-up line on stderr, in brackets like the stages' closing report."""
    if line is not None:
        print(f"[{line}]", file=sys.stderr)


def read_prompts(args: argparse.Namespace) -> list[str]:
    """--prompt values, then the lines of --prompts-file."""
    prompts = list(args.prompt) if isinstance(args.prompt, list) else [args.prompt]
    if getattr(args, "prompts_file", None):
        try:
            lines = args.prompts_file.read_text().splitlines()
        except OSError as err:
            raise UserError(f"cannot read {args.prompts_file}: {err}") from err
        for line in filter(str.strip, lines):
            prompts.append(json.loads(line)["prompt"] if line.lstrip().startswith("{") else line)
    if not prompts:
        raise UserError("give at least one --prompt or a --prompts-file")
    return prompts


def encode_prompts(tokenizer: Tokenizer, prompts: Sequence[str], args: argparse.Namespace) -> list[list[int]]:
    """Token ids of each prompt: in the chat template unless --raw (see the module docstring)."""
    return [tokenizer.encode_prompt(p, chat=args.chat, system=args.system) for p in prompts]


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def generate_staggered(
    llm: Any, prompt_ids: Sequence[list[int]], params: SamplingParams, every: int, progress: bool = False
) -> list[RequestOutput]:
    """Add prompt i before engine step i * `every` (0: all at once), then run until all finish.

    `llm` is any stage engine with add_request / step / has_unfinished. Prompts arriving a step
    apart is what a server sees; it is also what lets a later prompt find an earlier one's prefix
    in a cache, which two prompts admitted in the same step cannot.
    """
    from tqdm import tqdm

    pending = list(enumerate(prompt_ids))
    order: dict[int, int] = {}
    results: list[RequestOutput | None] = [None] * len(prompt_ids)
    step = 0
    with tqdm(total=len(prompt_ids), disable=not progress, desc="generate", unit="req") as bar:
        while pending or llm.has_unfinished():
            while pending and step >= pending[0][0] * every:
                index, ids = pending.pop(0)
                order[llm.add_request(ids, params)] = index
            for rid, out in llm.step():
                results[order[rid]] = out
                bar.update(1)
            step += 1
    return results  # type: ignore[return-value]
