"""A request's state inside the engine, and the batch one step computes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch

from ..core.sampling_params import SamplingParams
from ..engine.runner import StepInput
from ..kvcache import Handle


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
    generator: torch.Generator | None = None
    output_ids: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    row: int = -1  # the request's row in the page table while it holds pages
    pages: list[int] = field(default_factory=list)  # every page holding its tokens, in order
    # pages[:num_shared_pages] belong to the prefix cache, locked through cache_handle while the
    # request runs; the rest are the request's own, freed when it leaves.
    num_shared_pages: int = 0
    cache_handle: Handle = None
    num_computed: int = 0  # tokens whose K and V are in the cache
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache at admission

    @property
    def own_pages(self) -> list[int]:
        return self.pages[self.num_shared_pages :]

    @property
    def is_decoding(self) -> bool:
        """Past its prompt: the next step computes the one token it sampled last."""
        return bool(self.output_ids) and self.num_uncomputed == 1

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to run through the model: the uncached prompt (in chunks when it exceeds the
        step budget; prompt + output after a preemption), then the last sampled token."""
        return self.seq_len - self.num_computed

    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    def tokens(self, start: int, end: int) -> list[int]:
        """all_ids()[start:end], without building all_ids (a decode step wants one token)."""
        n = len(self.prompt_ids)
        if start >= n:
            return self.output_ids[start - n : end - n]
        if end <= n:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[: end - n]


@dataclass
class ScheduledBatch:
    """One step: for each request, its tokens [num_computed, num_computed + query_len): a whole
    prompt, a chunk of one, or the last sampled token."""

    requests: list[Request]
    query_lens: list[int]
    sampled: list[bool]  # whether the step reaches the request's last token (a cut prompt does not)

    @property
    def size(self) -> int:
        return len(self.requests)

    @property
    def is_prefill(self) -> bool:
        """Some request computes more than one token (decode kernels need exactly one each)."""
        return any(q > 1 for q in self.query_lens)

    def step_input(self) -> StepInput:
        input_ids: list[int] = []
        for req, q_len in zip(self.requests, self.query_lens, strict=True):
            input_ids += req.tokens(req.num_computed, req.num_computed + q_len)
        return StepInput(
            is_prefill=self.is_prefill,
            input_ids=input_ids,
            query_lens=self.query_lens,
            seq_lens=[r.num_computed + q for r, q in zip(self.requests, self.query_lens, strict=True)],
            rows=[r.row for r in self.requests],
            sampled=self.sampled,
        )
