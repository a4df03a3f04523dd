"""Slow clients: a request must arrive whole within --read-timeout, or its connection is closed.

uvicorn bounds an idle keep-alive connection (5 s) but not a request on its way in: a client that
opens a connection and sends its headers a byte at a time (slowloris), or never sends the body its
Content-Length announced, holds a connection, and a file handle, for as long as it likes; a few
thousand such clients exhaust the server's file handles. So:

- the headers: uvicorn's HTTP/1.1 protocol is given a timer, armed when a connection opens and
  again when a response is done (the next request's headers on a kept-alive connection), and
  cancelled once the request's headers are complete; when it fires, the connection is closed, with
  one INFO line (there is no request yet to answer);
- the body: `body.read_body` reads it under the same limit, counted from the end of the headers,
  and answers 408 `request_timeout`, closing the connection.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

DEFAULT_READ_TIMEOUT_S = 30.0  # what --read-timeout defaults to (see args.py)


def timed_http_protocol(header_timeout: float) -> type[asyncio.Protocol]:
    """The fastest HTTP/1.1 protocol uvicorn has here, with the header timer: httptools (a C
    parser, and a send that writes a body chunk in one join, where h11 runs its state machine per
    frame) when it is installed, else h11. scripts/bench_api_cost.py measures the server on it."""
    try:
        import httptools  # noqa: F401
    except ImportError:
        return timed_h11_protocol(header_timeout)
    return timed_httptools_protocol(header_timeout)


class HeadTimer:
    """One connection's timer for its next request's headers: armed when the connection opens and
    when a response is done, cancelled once the headers are complete; when it fires before that,
    the connection is closed (one INFO line: there is no request to answer)."""

    def __init__(self, protocol: Any, timeout: float):
        self.protocol, self.timeout = protocol, timeout
        self.handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        self.cancel()
        self.handle = self.protocol.loop.call_later(self.timeout, self._fire)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fire(self) -> None:
        self.handle = None
        protocol = self.protocol
        if not protocol.transport.is_closing():
            client = f"{protocol.client[0]}:{protocol.client[1]}" if protocol.client else "a client"
            log.info("closing the connection of %s: no complete request headers within %.0f s "
                     "(--read-timeout)", client, self.timeout)  # fmt: skip
            protocol.transport.close()


def timed_h11_protocol(header_timeout: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol, closing a connection whose request headers take longer than
    `header_timeout` seconds to arrive."""

    class TimedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            super().connection_made(transport)  # type: ignore[arg-type]
            self.head_timer = HeadTimer(self, header_timeout)
            self.head_timer.arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # the request's headers are complete
                self.head_timer.cancel()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.head_timer.arm()  # the next request on this connection has the same bound

        def connection_lost(self, exc: Exception | None) -> None:
            self.head_timer.cancel()
            super().connection_lost(exc)

    return TimedH11Protocol


def timed_httptools_protocol(header_timeout: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with the same header timer as `timed_h11_protocol`."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class TimedHttpToolsProtocol(HttpToolsProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            super().connection_made(transport)  # type: ignore[arg-type]
            self.head_timer = HeadTimer(self, header_timeout)
            self.head_timer.arm()

        def on_headers_complete(self) -> None:
            self.head_timer.cancel()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            pipelined = bool(self.pipeline)  # a next request whose headers are in: super() starts it
            super().on_response_complete()
            if not pipelined and not self.transport.is_closing():
                self.head_timer.arm()  # the next request on this connection has the same bound

        def connection_lost(self, exc: Exception | None) -> None:
            self.head_timer.cancel()
            super().connection_lost(exc)

    return TimedHttpToolsProtocol
