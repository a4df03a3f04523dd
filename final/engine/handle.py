"""A launched step: what `EngineCore.collect` needs once the device is done with it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..scheduler.request import Request, ScheduledBatch
from .logprobs import TopLogprobs


@dataclass
class StepHandle:
    """A launched step: what `collect` needs once the device is done."""

    batch: ScheduledBatch
    sampled: list[Request]  # the requests that get tokens from this step, in row order
    tokens: torch.Tensor | None  # [len(sampled), k] on the host (pinned) once `done` has fired
    done: torch.cuda.Event | None  # recorded after the copy; None on the CPU (already done)
    logprobs: TopLogprobs | None
    pending: int = 1  # tokens each sampled request has in flight (k)
    decode_only: bool = False  # the step computed no prompt tokens: a decode step

    def ready(self) -> bool:
        """The tokens are on the host (asks the device; never waits)."""
        return self.done is None or self.done.query()

    def wait(self) -> list[list[int]]:
        """Each sampled request's new tokens."""
        if self.done is not None:
            self.done.synchronize()  # the one wait per step: the host needs the tokens
        return [] if self.tokens is None else self.tokens.tolist()
