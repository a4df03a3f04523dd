"""Admission: at most --max-running-requests + --max-waiting-requests sequences in flight.

`reserve` checks the count and takes the places in one synchronous call: nothing can run on the
event loop between the check and the taking, so a burst of 40 streams against a limit of 8 admits
exactly 8, however the tasks interleave (the count used to be read at admission and raised only
once a stream's body began, so a burst slipped through). The places are held by a `Ticket` until
the response is done, whatever ends it (a streamed one through event_stream.EventStream); releasing
twice is a no-op.

One request may hold at most `per_request` places (the server gives --max-running-requests, what
the engine runs at once): a single request of 80 prompts x n=16 used to take every place of the
server for half a minute, and everyone else got 503s. A request asking for more sequences (prompts
x n) than its share can never be served: that is a 400 naming the limit, not a 503 a retrying
client would loop on.
"""

from __future__ import annotations

from .errors import APIError, never_fits, overloaded


class Ticket:
    def __init__(self, admission: Admission, count: int):
        self.admission, self.count, self.released = admission, count, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.admission.in_use -= self.count


class Admission:
    def __init__(self, limit: int, per_request: int | None = None):
        self.limit = limit
        self.per_request = limit if per_request is None else min(per_request, limit)
        self.in_use = 0
        self.closing = False  # set when the server starts shutting down

    # --8<-- [start:reserve]
    def reserve(self, count: int) -> Ticket:
        if count > self.per_request:
            raise never_fits(count, self.per_request)
        if self.closing:
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        if self.in_use + count > self.limit:
            raise overloaded(self.in_use, self.limit)
        self.in_use += count
        return Ticket(self, count)
        # --8<-- [end:reserve]
