"""What the API process's receiving task hands a request: its updates, one per engine step, and one
wake-up for all of those that arrived while it was busy.

An `asyncio.Queue` per request, read with `wait_for(queue.get(), timeout)`, cost a task, a timer
and a future for every token of every request; at a few thousand tokens a second the event loop
spent its time on them and fell behind, and the tokens that waited meanwhile left in a burst.
A mailbox is a list and at most one future: `put` appends and resolves the future if the request
is waiting; `get` takes everything there is. The periodic check that a client is still there
needs no timer per request either: `nudge` wakes a request with nothing new (the client's ticker).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class TokenUpdate:
    """One request's share of one engine step, detokenized."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    cached_tokens: int = 0
    logprobs: list[dict[str, Any]] | None = None
    error: str | None = None
    error_code: str | None = None  # see engine/messages.py's RequestDelta.error_code
    tokens_at: float = 0.0  # time.monotonic() when the engine had the tokens on its host
    detokenized_at: float = 0.0  # when the detokenizer process sent them on
    decode_step: bool = False  # the engine's step computed no prompt tokens (wire.StepColumns)


class Mailbox:
    __slots__ = ("updates", "waiter")

    def __init__(self) -> None:
        self.updates: list[TokenUpdate] = []
        self.waiter: asyncio.Future[None] | None = None

    def put(self, update: TokenUpdate) -> None:
        self.updates.append(update)
        self.nudge()

    def nudge(self) -> None:
        """Wake the request if it is waiting (with nothing new, `get` returns an empty list)."""
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def get(self) -> list[TokenUpdate]:
        """Every update that has arrived, in order: one per step (never merged); waits for one,
        or for a nudge."""
        if not self.updates:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        updates, self.updates = self.updates, []
        return updates
