"""Scheduling policies: how prefill chunks and running decodes share a step (stage 04).

A policy is one small object: `select(scheduler, can_preempt)` returns the step's decodes and
prefill chunks, built from the scheduler's two building blocks, `decodes(can_preempt)` (every
decoding request, one token each, preempting when the pool runs dry) and `prefill_chunks(budget)`
(prompt chunks within the budget: prompts under way first, then admissions). The scheduler does
the rest (the preemption when nothing can run, the batch, the bookkeeping).

    mixed           (default, Sarathi-Serve's idea) every step carries one token for every decoding
                    request plus prefill chunks up to the budget: decodes never stall behind a
                    long prompt
    prefill-first   a step with prefill work carries only prefill; decodes wait

A new policy is a subclass in a file of its own and one line in POLICIES. This module imports no
torch, so `--help` lists the names at once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Protocol

from ..core.errors import UserError

if TYPE_CHECKING:
    from .request import Request

Chunks = list[tuple["Request", int]]  # (request, prompt tokens it computes this step)


class Scheduler(Protocol):
    """What a policy sees of the scheduler (scheduler.py): its budget and its two building blocks."""

    max_prefill_length: int

    def decodes(self, can_preempt: bool) -> list[Request]: ...
    def prefill_chunks(self, budget: int) -> Chunks: ...


class SchedulingPolicy(ABC):
    name = "base"

    @abstractmethod
    def select(self, scheduler: Scheduler, can_preempt: bool) -> tuple[list[Request], Chunks]:
        """The next step's decodes and prefill chunks (either may be empty)."""


class MixedPolicy(SchedulingPolicy):
    name = "mixed"

    def select(self, scheduler: Scheduler, can_preempt: bool) -> tuple[list[Request], Chunks]:
        decodes = scheduler.decodes(can_preempt)  # first: they may preempt, and must not wait for prefill
        return decodes, scheduler.prefill_chunks(scheduler.max_prefill_length)


class PrefillFirstPolicy(SchedulingPolicy):
    name = "prefill-first"

    def select(self, scheduler: Scheduler, can_preempt: bool) -> tuple[list[Request], Chunks]:
        chunks = scheduler.prefill_chunks(scheduler.max_prefill_length)
        return ([] if chunks else scheduler.decodes(can_preempt)), chunks


POLICIES: dict[str, type[SchedulingPolicy]] = {
    MixedPolicy.name: MixedPolicy,
    PrefillFirstPolicy.name: PrefillFirstPolicy,
}


def create_policy(name: str) -> SchedulingPolicy:
    """The policy `--chunk-policy NAME` names; a UserError lists the known ones."""
    if name not in POLICIES:
        raise UserError(f"unknown chunk policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[name]()
