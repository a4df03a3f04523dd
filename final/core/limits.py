"""When a request is acceptable, and when it is done: the rules the engine and the server share."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .errors import ContextLengthError, UserError
from .sampling_params import SamplingParams


def check_prompt(prompt_ids: Sequence[int], max_context: int, vocab_size: int) -> None:
    if not prompt_ids:
        raise UserError("the prompt is empty")
    if len(prompt_ids) >= max_context:
        raise ContextLengthError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context holds {max_context} "
            f"(prompt and answer together), so at most {max_context - 1} prompt tokens"
        )
    if max(prompt_ids) >= vocab_size or min(prompt_ids) < 0:
        raise UserError(f"prompt token ids must be in [0, {vocab_size})")


def max_new_tokens(
    prompt_ids: Sequence[int], max_tokens: int | None, max_context: int, vocab_size: int, kv_capacity: int
) -> int:
    """Reject requests that cannot be served; return how many tokens the request may generate.

    This is the one place the cap is decided (the engine calls it on admission, the server before
    sending, to answer 400 early). `max_tokens` as asked is capped by the room left in the context
    (the answer then ends with "length"); None asks for all the room the context and the pool leave.
    """
    check_prompt(prompt_ids, max_context, vocab_size)
    if max_tokens is None:
        room = min(max_context, kv_capacity) - len(prompt_ids)
        if room < 1:
            raise ContextLengthError(
                f"the prompt has {len(prompt_ids)} tokens but the KV pool holds {kv_capacity}: raise "
                f"--num-pages / --memory-ratio"
            )
        return room
    budget = min(max_tokens, max_context - len(prompt_ids))
    if len(prompt_ids) + budget > kv_capacity:
        raise ContextLengthError(
            f"the request needs up to {len(prompt_ids) + budget} tokens of KV cache ({len(prompt_ids)} "
            f"prompt + {budget} new) but the pool holds {kv_capacity}: lower max_tokens, or raise "
            f"--num-pages / --memory-ratio"
        )
    return budget


def finish_reason(
    token: int, params: SamplingParams, eos_ids: Collection[int], num_generated: int, max_new: int
) -> str | None:
    """ "stop" for EOS or a stop token; "length" when out of tokens; else None. Stop strings are
    the detokenizer's business: they need text, and the engine sees only token ids."""
    if token in params.stop_token_ids:
        return "stop"
    if token in eos_ids and not params.ignore_eos:
        return "stop"
    if num_generated >= max_new:
        return "length"
    return None
