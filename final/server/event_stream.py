"""A streamed response's frames written straight to the HTTP server, past the middleware stack.

Every frame of every stream is one ASGI `send`. Through Starlette's stack that call passes five
wrappers (our InternalErrorMiddleware, Starlette's error and exception middlewares, FastAPI's)
before it reaches uvicorn, each an `async def` that only watches for the response's start. At
thousands of frames a second they were a share of the API process's time per frame worth taking
back (issue 27; scripts/bench_api_cost.py measures it).

So `DirectSend`, the outermost layer of the app, puts uvicorn's own `send` into the scope, and an
`EventStream` sends its start and its end through the stack as any response does (every
middleware sees the response start, so none of them answers a 500 over it), and its frames in
between through that direct `send`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from .admission import Ticket
from .formatting import SSE_HEADERS

DIRECT_SEND = "final.direct_send"  # the scope key of the HTTP server's own send


class DirectSend:
    """The outermost ASGI layer: hands uvicorn's `send` down in the scope, and nothing else."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[DIRECT_SEND] = send
        await self.app(scope, receive, send)


class EventStream(StreamingResponse):
    """A text/event-stream response of the frames `content` yields, which gives its admission
    places back when it ends, even when it is cancelled before its first frame. Starlette's
    StreamingResponse around it watches for the client's disconnect (one task per response) and
    cancels the stream then."""

    def __init__(
        self, ticket: Ticket, content: AsyncIterator[str], on_close: Callable[[], None] | None = None
    ):
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.ticket = ticket
        self.on_close = on_close  # what the frames' generator cannot do if it never started
        self.direct: Send | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.direct = scope.get(DIRECT_SEND)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.ticket.release()
            if self.on_close is not None:
                self.on_close()

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        direct = self.direct or send
        # aclosing: however the response ends, the frames' generator runs its `finally` now
        # (generation.py aborts the request in the engine there), not when it is collected.
        async with aclosing(self.body_iterator) as frames:  # type: ignore[type-var]
            async for frame in frames:
                await direct({"type": "http.response.body", "body": frame.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
