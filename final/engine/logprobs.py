"""Log-probabilities of a step's sampled tokens and top candidates, on the device until the host
reads them (engine/core.py copies them behind the step, `entries()` once it has completed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core.sampling_params import SamplingParams


def to_host(t: torch.Tensor | None) -> torch.Tensor | None:
    """A GPU tensor's copy in pinned host memory, queued on the stream (no wait: read it only after
    an event recorded later has fired); a CPU tensor (or None) as it is."""
    if t is None or not t.is_cuda:
        return t
    return torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)


@dataclass
class TopLogprobs:
    """Log-probabilities of a step, still on the device: `entries()` copies them to the host."""

    wanted: list[int | None]  # per row: None, or how many top candidates the request asked for
    chosen: torch.Tensor  # [S] logprob of each sampled token
    top_ids: torch.Tensor | None  # [S, max n] or None when no row wants candidates
    top_values: torch.Tensor | None

    def to_host(self) -> TopLogprobs:
        """The same numbers, copied to pinned host memory behind the kernels that compute them."""
        return TopLogprobs(self.wanted, to_host(self.chosen), to_host(self.top_ids), to_host(self.top_values))

    def entries(self) -> list[dict[str, Any] | None]:
        chosen = self.chosen.tolist()
        top_ids: list[list[int]] = [[] for _ in self.wanted]
        top_values: list[list[float]] = [[] for _ in self.wanted]
        if self.top_ids is not None and self.top_values is not None:
            top_ids, top_values = self.top_ids.tolist(), self.top_values.tolist()  # one copy each
        return [
            None
            if n is None
            else {
                "token_logprob": chosen[row],
                "top_ids": top_ids[row][:n],
                "top_logprobs": top_values[row][:n],
            }
            for row, n in enumerate(self.wanted)
        ]


def logprobs_of(
    logits: torch.Tensor, tokens: torch.Tensor, params: list[SamplingParams]
) -> TopLogprobs | None:
    """The log-probabilities a batch's requests asked for (None when none did)."""
    wanted = [p.logprobs for p in params]
    if all(n is None for n in wanted):
        return None
    # Log-probabilities of the model's own distribution (before temperature and filters), in
    # float32 whatever the logits' dtype (computed so, not copied first).
    logp = logits.log_softmax(dim=-1, dtype=torch.float32)
    top_n = max(n or 0 for n in wanted)
    chosen = logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if not top_n:
        return TopLogprobs(wanted, chosen, None, None)
    values, ids = logp.topk(min(top_n, logp.shape[-1]), dim=-1)
    return TopLogprobs(wanted, chosen, ids, values)
