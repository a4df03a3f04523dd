"""Presence, frequency and repetition penalties on the device, for a whole batch at once.

What they do (vLLM's and OpenAI's definitions; core/sampling_params.py has the ranges):

    logit of a token seen in the prompt or the answer   / repetition when > 0, * repetition when < 0
    logit of every token                                 - frequency * (times it is in the answer)
                                                         - presence * (1 if it is in the answer)

Like the sampling parameters, every row's penalties live in device tensors indexed by its
page-table row, written once when a request takes the row; so do two [rows, vocab] tables: how
many times each token is in the row's answer (`counts`, int32) and which tokens its prompt holds
(`in_prompt`, bool, for the repetition penalty). A step adds its sampled tokens to `counts` on the
device, so nothing waits for the host, with overlap scheduling too (the next step reads counts its
predecessor wrote, in stream order). The tables are made when the first penalized request arrives:
an engine that never sees one allocates nothing, and a batch without a penalized row runs none of
this (the sampler checks on the host first). At 256 rows and Qwen3's 151,936 tokens they take
148 MiB (counts) and 37 MiB (prompt), outside the KV cache's share of memory.

The penalties apply to the logits the model produced (after a CUDA graph's replay, outside it),
before the temperature and the filters; log-probabilities stay those of the model's own
distribution, as vLLM's default (raw) logprobs are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..core.sampling_params import SamplingParams


def _ids_on(ids: Sequence[int], device: torch.device) -> torch.Tensor:
    """Token ids as a long tensor on `device`; through pinned memory on a GPU, so the copy is queued
    on the stream and the host does not wait."""
    host = torch.tensor(list(ids), dtype=torch.long)
    return host.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else host


class Penalties:
    def __init__(self, num_rows: int, vocab_size: int, device: torch.device):
        self.num_rows, self.vocab_size, self.device = num_rows, vocab_size, device
        self.presence = torch.zeros(num_rows, device=device)
        self.frequency = torch.zeros(num_rows, device=device)
        self.repetition = torch.ones(num_rows, device=device)
        self.counts: torch.Tensor | None = None  # [rows, vocab] int32: each token's count in the answer
        self.in_prompt: torch.Tensor | None = None  # [rows, vocab] bool: the prompt's tokens
        self.row_penalized = [False] * num_rows  # on the host: which rows hold non-neutral values
        self.any_row = False  # some row was penalized since start-up (else `needed` is one check)

    def needed(self, params: Sequence[SamplingParams]) -> bool:
        """Whether this batch has a penalized request (decided on the host, no device work)."""
        return self.any_row and any(p.penalized for p in params)

    def admit(
        self, row: int, params: SamplingParams, prompt_ids: Sequence[int], output_ids: Sequence[int]
    ) -> None:
        """Write a request's penalties into its row, and its prompt's and answer's tokens (an
        answer exists when it comes back after a preemption) into the row's tables."""
        penalized = params.penalized
        if not penalized and not self.row_penalized[row]:
            return  # the row holds neutral values already
        self.row_penalized[row] = penalized
        self.any_row = self.any_row or penalized
        # Slices filled, not `table[row] = value`: that copies from pageable memory and so waits
        # for the stream (Sampler.write_rows says why); a fill is queued like any kernel.
        self.presence[row : row + 1].fill_(float(params.presence_penalty))
        self.frequency[row : row + 1].fill_(float(params.frequency_penalty))
        self.repetition[row : row + 1].fill_(float(params.repetition_penalty))
        if not penalized:
            return  # the tables' stale entries for this row multiply neutral values: no effect
        if self.counts is None:
            self.counts = torch.zeros(self.num_rows, self.vocab_size, dtype=torch.int32, device=self.device)
        self.counts[row].zero_()
        if output_ids:
            self.counts[row].index_add_(
                0,
                _ids_on(output_ids, self.device),
                torch.ones(len(output_ids), dtype=torch.int32, device=self.device),
            )
        if params.repetition_penalty != 1:
            if self.in_prompt is None:
                self.in_prompt = torch.zeros(
                    self.num_rows, self.vocab_size, dtype=torch.bool, device=self.device
                )
            self.in_prompt[row].zero_()
            self.in_prompt[row].index_fill_(0, _ids_on(prompt_ids, self.device), True)

    def apply(
        self, logits: torch.Tensor, rows: torch.Tensor, params: Sequence[SamplingParams]
    ) -> torch.Tensor:
        """The penalized logits [S, vocab] (float32, a new tensor) of the requests in page-table
        rows `rows`; `params` tells the host which of the three any row uses."""
        assert self.counts is not None, "admit() a penalized request first"
        scores = logits.float()
        counts = torch.index_select(self.counts, 0, rows)
        if any(p.repetition_penalty != 1 for p in params):
            seen = counts > 0
            if self.in_prompt is not None:
                seen |= torch.index_select(self.in_prompt, 0, rows)
            factor = torch.index_select(self.repetition, 0, rows).unsqueeze(1)
            # A positive logit shrinks and a negative one grows more negative: either way the token
            # gets less likely for a penalty above 1.
            scores = torch.where(seen, torch.where(scores > 0, scores / factor, scores * factor), scores)
        if any(p.presence_penalty or p.frequency_penalty for p in params):
            frequency = torch.index_select(self.frequency, 0, rows).unsqueeze(1)
            presence = torch.index_select(self.presence, 0, rows).unsqueeze(1)
            scores = scores - frequency * counts - presence * (counts > 0)
        return scores

    def record(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count each row's sampled token (rows are distinct within a step)."""
        assert self.counts is not None
        self.counts[rows, tokens] += 1
