"""A request's state inside the engine, and the batch one step computes."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..core.forward_batch import StepInput
from ..core.sampling_params import SamplingParams
from ..kvcache.manager import RequestPages


class Status(Enum):
    WAITING = "waiting"  # queued, holding no pages (new, or preempted)
    RUNNING = "running"  # holding pages, computed every step
    FINISHED = "finished"  # done, or aborted


@dataclass(eq=False)  # compared by identity: two requests with equal fields are still two requests
class Request:
    rid: int
    prompt_ids: list[int]
    params: SamplingParams
    max_new_tokens: int  # params.max_tokens, capped by the room left in the context (core/limits)
    output_ids: list[int] = field(default_factory=list)  # sampled tokens the host has collected
    # Tokens sampled by a launched step whose values have not reached the host yet: the device's
    # token table has them, and a decode step reads them from there. 0 in the synchronous loop
    # whenever the scheduler runs; 1 while an overlapped step is in flight.
    num_pending: int = 0
    # Whether the runner's token table holds this request's last sampled token, in its current row
    # (true once a step has sampled it there; false again when a preemption takes the row away).
    last_token_on_device: bool = False
    status: Status = Status.WAITING
    kv: RequestPages = field(default_factory=RequestPages)  # owned by the KV cache manager
    num_computed: int = 0  # tokens whose K and V are in the cache (or written by a launched step)
    cached_tokens: int = 0  # prompt tokens reused from the prefix cache at admission

    # The scheduler reads these for every running request several times a step (thousands of
    # reads a step at batch 256), so each one reads the fields directly instead of going through
    # the others: the same definitions, without the extra property calls.

    @property
    def num_generated(self) -> int:
        return len(self.output_ids) + self.num_pending

    @property
    def seq_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids) + self.num_pending  # prompt + num_generated

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to run through the model: the uncached prompt (in chunks when it exceeds the
        step budget; prompt + output after a preemption), then the last sampled token."""
        return len(self.prompt_ids) + len(self.output_ids) + self.num_pending - self.num_computed

    @property
    def out_of_tokens(self) -> bool:
        """Every token it may generate has been sampled (some may still be in flight)."""
        return len(self.output_ids) + self.num_pending >= self.max_new_tokens

    @property
    def is_decoding(self) -> bool:
        """Past its prompt: the next step computes the one token it sampled last
        (num_generated > 0 and num_uncomputed == 1)."""
        generated = len(self.output_ids) + self.num_pending
        return generated > 0 and len(self.prompt_ids) + generated - self.num_computed == 1

    def all_ids(self) -> list[int]:
        """The tokens the host knows: the prompt and the collected output."""
        return self.prompt_ids + self.output_ids

    def tokens(self, start: int, end: int) -> list[int]:
        """all_ids()[start:end], without building all_ids (a decode step wants one token)."""
        n = len(self.prompt_ids)
        assert end <= n + len(self.output_ids), "a token the host has not collected yet"
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

    def load(self) -> tuple[int, int]:
        """The prompt tokens this step computes and the requests it decodes (read before `launch`,
        which moves the requests on): what a step trace records of it."""
        decoding = [req.is_decoding for req in self.requests]
        prompt = sum(q for q, dec in zip(self.query_lens, decoding, strict=True) if not dec)
        return prompt, sum(decoding)

    def step_input(self) -> StepInput:
        rows: list[int] = []
        seq_lens: list[int] = []
        input_ids: list[int] = []
        from_table: list[bool] = []
        for req, q_len in zip(self.requests, self.query_lens, strict=True):
            rows.append(req.kv.row)
            seq_lens.append(req.num_computed + q_len)
            # A decoding request's token is the one it sampled last: the device has it (unless a
            # preemption moved the request to another row since; then the host supplies it).
            on_device = req.last_token_on_device and req.is_decoding
            from_table.append(on_device)
            if on_device:
                input_ids.append(0)
            else:
                input_ids += req.tokens(req.num_computed, req.num_computed + q_len)
        return StepInput(
            rows=rows,
            query_lens=list(self.query_lens),
            seq_lens=seq_lens,
            sampled=list(self.sampled),
            input_ids=input_ids,
            from_table=from_table,
        )
