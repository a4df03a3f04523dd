"""What one step needs of the other tensor-parallel ranks, as two small interfaces, so the step
path reads the same at any degree: at --tp 1 both are no-ops (`NO_PEERS`, `SingleRank`), under
TP rank 0 sends each step over distributed/step_channel.py and runtime/ranks.py guards it.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Protocol

from ..core.forward_batch import StepInput
from ..distributed.step_channel import PageWrites


class Peers(Protocol):
    """Where rank 0 sends each step before running it (StepChannel under TP)."""

    def send(self, step: StepInput, page_writes: PageWrites) -> None: ...


class NoPeers:
    """One rank: nobody to tell."""

    def send(self, step: StepInput, page_writes: PageWrites) -> None:
        pass


NO_PEERS = NoPeers()


class Ranks(Protocol):
    """Rank 0's watch over the other ranks (RankGroup under TP)."""

    failure: str | None  # why a rank was lost; every step from then on raises

    def guard(self) -> AbstractContextManager[None]: ...
    def close(self) -> None: ...


class SingleRank:
    """One rank: nothing to watch, nothing to stop."""

    failure: str | None = None

    def guard(self) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def close(self) -> None:
        pass
