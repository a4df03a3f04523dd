"""The prompts the offline API takes, in vLLM's forms (its TextPrompt and TokensPrompt):

    "Hello"                                   text, tokenized without a chat template
    [15496, 11]                               token ids: one prompt
    {"prompt": "Hello"}                       text
    {"prompt_token_ids": [15496, 11]}         token ids (with "prompt": the text they stand for)

and `generate` takes one of them or a list of them. A string is one prompt, never a sequence of
one-character prompts; a list of ints is one prompt of token ids, a list of lists several.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.errors import UserError
from .tokenizer import Tokenizer

PromptInput = str | Sequence[int] | Mapping[str, Any]
PROMPT_KEYS = ("prompt", "prompt_token_ids")


def _is_token_ids(value: Any) -> bool:
    return _is_sequence(value) and len(value) > 0 and _int_kinds(set(map(type, value)))


def _is_sequence(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


def _int_kinds(kinds: set[type]) -> bool:
    """Whether items of these types are all integers (numpy's too) and none a bool. Judged per
    distinct type, not per token: `set(map(type, ...))` runs in C, where an isinstance per token
    through the numbers.Integral ABC made the offline API spend 130 ms (40 now) between `generate`
    and its first step on Nano-vLLM's 256 prompts, 143,000 tokens (a 2-core CPU; on the H200
    machine the offline run's first step took 485 ms, benchmarks/logs/h200-2026-11-28-s12)."""
    return kinds <= {int} or all(issubclass(k, numbers.Integral) and not issubclass(k, bool) for k in kinds)


def as_prompt_list(prompts: Any) -> list[Any]:
    """One prompt, or a sequence of them, as a list of prompts."""
    if isinstance(prompts, (str, Mapping)) or _is_token_ids(prompts):
        return [prompts]
    if isinstance(prompts, Sequence):
        return list(prompts)
    raise UserError(
        f"prompts must be a string, a list of token ids, a dict or a list of these, got {type(prompts).__name__}"
    )


def read_prompt(prompt: Any, tokenizer: Tokenizer) -> tuple[str | None, list[int]]:
    """(the prompt's text or None, its token ids) for one prompt in any of the forms above."""
    if isinstance(prompt, str):
        return prompt, tokenizer.encode(prompt)
    if isinstance(prompt, Mapping):
        unknown = sorted(str(k) for k in prompt if k not in PROMPT_KEYS)
        if unknown:
            raise UserError(
                f"unsupported prompt key(s) {', '.join(unknown)}; a prompt dict takes {PROMPT_KEYS}"
            )
        text, ids = prompt.get("prompt"), prompt.get("prompt_token_ids")
        if text is not None and not isinstance(text, str):
            raise UserError(f"a prompt dict's 'prompt' must be a string, got {type(text).__name__}")
        if ids is None:
            if text is None:
                raise UserError("a prompt dict needs 'prompt' (text) or 'prompt_token_ids'")
            return text, tokenizer.encode(text)
        return text, _token_ids(ids)
    return None, _token_ids(prompt)


def _token_ids(value: Any) -> list[int]:
    if _is_sequence(value) and not value:
        raise UserError("the prompt is empty")
    kinds = set(map(type, value)) if _is_sequence(value) else set()
    if not kinds or not _int_kinds(kinds):
        raise UserError(
            f"a prompt must be a string, a list of token ids or a dict, got {type(value).__name__}"
            + (" holding other things than ints" if isinstance(value, Sequence) else "")
        )
    return list(value) if kinds == {int} else [int(t) for t in value]
