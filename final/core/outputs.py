"""What the offline API returns for a request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestOutput:
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None  # "stop" (EOS, stop token or stop string) or "length"
    logprobs: list[dict[str, Any]] = field(default_factory=list)  # one per token when asked for
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    ttft_s: float = 0.0  # time from submission to the first token
    latency_s: float = 0.0  # time from submission to the last token
    token_times: list[float] = field(default_factory=list)  # when each token arrived, from submission
