"""When a request is acceptable, and when it is done: the rules every engine applies alike."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from .errors import UserError
from .sampling import SamplingParams


def max_new_tokens(
    prompt_ids: Sequence[int], params: SamplingParams, max_context: int, vocab_size: int
) -> int:
    """Reject prompts that cannot be served; return how many tokens the request may generate."""
    if not prompt_ids:
        raise UserError("the prompt is empty")
    room = max_context - len(prompt_ids)
    if room < 1:
        raise UserError(
            f"the prompt has {len(prompt_ids)} tokens but the model's context holds {max_context} "
            f"(prompt and answer together)"
        )
    if max(prompt_ids) >= vocab_size or min(prompt_ids) < 0:
        raise UserError(f"prompt token ids must be in [0, {vocab_size})")
    return room if params.max_tokens is None else min(params.max_tokens, room)


def finish_reason(
    token: int,
    params: SamplingParams,
    eos_ids: Collection[int],
    num_generated: int,
    max_new: int,
    hit_stop: bool,
) -> str | None:
    """ "stop" for EOS, a stop token or a stop string; "length" when out of tokens; else None."""
    if hit_stop or token in params.stop_token_ids:
        return "stop"
    if token in eos_ids and not params.ignore_eos:
        return "stop"
    if num_generated >= max_new:
        return "length"
    return None
