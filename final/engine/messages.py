"""What the frontend (API server, shell) and the engine process say to each other.

Frontend -> engine: AddRequest, AbortRequest, StatsQuery, Shutdown.
Engine -> frontend: a step's outputs (one message per step: a RequestDelta per request that got a
token, was rejected, or failed, sent as arrays: wire.py) and EngineStats (the answer to a StatsQuery).
The engine sends token ids only; text is the frontend's business (tokenizer, detokenizer, stop
strings: the server's detokenizer process), so the engine never waits on it. The other messages
are pickled over local ZMQ sockets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from .resolve import ResolvedConfig

ENGINE_DEAD = "engine_dead"  # RequestDelta.error_code of every request when the engine is lost


@dataclass
class AddRequest:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams


@dataclass
class AbortRequest:
    rid: int


@dataclass
class StatsQuery:
    query_id: int


@dataclass
class Shutdown:
    pass


@dataclass
class RequestDelta:
    """New tokens of one request in one step; `finish_reason` set on its last delta.
    `error` set (and finish_reason "error") when the engine rejected or lost the request."""

    rid: int
    token_ids: list[int]
    logprobs: list[dict[str, Any]] | None = None  # one entry per token when asked for
    finish_reason: str | None = None  # "stop", "length", "abort" or "error"
    cached_tokens: int = 0
    error: str | None = None
    # With `error`: "invalid_request" when the engine refused the request's input (a 400 for an
    # API client), "shutting_down" when the server is stopping, ENGINE_DEAD when the engine is lost
    # (a lost tensor-parallel rank; the process exits); None for a failure of the engine.
    error_code: str | None = None


@dataclass
class EngineInfo:
    """What the frontend needs to validate requests before sending them."""

    model_dir: str
    vocab_size: int
    max_context: int
    eos_token_ids: tuple[int, ...]
    num_pages: int
    page_size: int
    device: str
    dtype: str
    attn: str
    cache: str

    @property
    def kv_capacity(self) -> int:
        return self.num_pages * self.page_size

    @classmethod
    def of(cls, config: ResolvedConfig, num_pages: int, attn: str) -> EngineInfo:
        """The engine's description from its resolved configuration and what its runner built."""
        return cls(
            model_dir=str(config.model_dir),
            vocab_size=config.model.vocab_size,
            max_context=config.model.max_context,
            eos_token_ids=tuple(config.model.eos_token_ids),
            num_pages=num_pages,
            page_size=config.page_size,
            device=str(config.device),
            dtype=str(config.dtype).removeprefix("torch."),
            attn=attn,
            cache=config.cache,
        )


@dataclass
class EngineStats:
    query_id: int = 0
    num_running: int = 0
    num_waiting: int = 0
    num_pages: int = 0
    free_pages: int = 0  # pages on the free list
    cached_pages: int = 0  # pages the prefix cache holds
    prompt_tokens: int = 0  # admitted prompt tokens, all requests so far
    cached_prompt_tokens: int = 0  # of which reused from the prefix cache
    generated_tokens: int = 0
    num_preemptions: int = 0
    num_steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
