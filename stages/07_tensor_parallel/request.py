"""A request's state as it moves through the engine, and the batch one step computes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

import torch

from stages.common.outputs import RequestOutput
from stages.common.sampling import SamplingParams
from stages.common.tokenizer import TextStream

from .radix_cache import Handle


class Status(Enum):
    WAITING = "waiting"  # queued, holding no pages (new, or preempted)
    RUNNING = "running"  # holding pages, computed every step
    FINISHED = "finished"  # done, or aborted


@dataclass(eq=False)  # compared by identity: two requests with equal fields are still two requests
class Request:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int  # params.max_tokens, capped by the room left in the context
    stream: TextStream
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)  # sampled tokens the host has seen
    # Tokens a launched step has sampled whose values the host has not seen yet (0 or 1): they
    # exist only on the device, in the runner's token table, where the next decode step reads them.
    num_pending: int = 0
    status: Status = Status.WAITING
    row: int = -1  # the request's row in the page table while it holds pages
    pages: list[int] = field(default_factory=list)
    # pages[:num_shared_pages] belong to the prefix cache, locked through cache_handle while the
    # request runs; the rest are the request's own, freed when it leaves.
    num_shared_pages: int = 0
    cache_handle: Handle = None
    num_computed: int = 0  # tokens whose K and V are in the cache, or written by a launched step
    output: RequestOutput = field(init=False)
    arrival: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.output = RequestOutput(prompt_ids=self.prompt_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_generated(self) -> int:
        return len(self.output_ids) + self.num_pending

    @property
    def seq_len(self) -> int:
        """Prompt and generated tokens, the pending one included."""
        return len(self.prompt_ids) + self.num_generated

    @property
    def out_of_tokens(self) -> bool:
        """Its last allowed token is sampled (perhaps still in flight): no step may run it again."""
        return self.num_generated >= self.max_new_tokens

    def tokens(self, start: int, end: int) -> list[int]:
        """all_ids[start:end], without building all_ids (a decode step wants one token)."""
        n = len(self.prompt_ids)
        assert end <= n + len(self.output_ids), "the host does not know a pending token"
        if start >= n:
            return self.output_ids[start - n : end - n]
        if end <= n:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[: end - n]

    @property
    def num_uncomputed(self) -> int:
        """Tokens the next step must run through the model: the whole prompt on the first step
        (or prompt + output after a preemption), then just the last sampled token."""
        return self.seq_len - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Past its prompt: the next step computes the one token it sampled last."""
        return self.num_generated > 0 and self.num_uncomputed == 1


@dataclass
class Batch:
    """What one forward pass computes: for each request, its tokens [num_computed, num_computed +
    query_len): a whole prompt, a chunk of one, or the last sampled token."""

    requests: list[Request]
    is_prefill: bool  # some request computes more than one token
    # Host-side per-request numbers, kept for the attention backends' planning.
    query_lens: list[int]  # tokens computed this step
    seq_lens: list[int]  # tokens in the cache after this step
    sampled: list[bool]  # whether the step reaches the request's last token (a cut prompt does not)
    # Device tensors, one entry per token ([T]) or per request ([B]).
    input_ids: torch.Tensor | None = None
    positions: torch.Tensor | None = None
    out_slots: torch.Tensor | None = None  # pool slot receiving each token's K and V
    rows: torch.Tensor | None = None  # [B] page-table rows
    last_token_index: torch.Tensor | None = None  # [sampled] where each sampled request's last token sits

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def num_tokens(self) -> int:
        return sum(self.query_lens)
