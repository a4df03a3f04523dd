"""The HTTP layer under the server, in-process: both of uvicorn's HTTP/1.1 protocols we may serve
with (httptools when installed, else h11) keep the header timer, and a streamed response's frames
go straight to the HTTP server, past the middleware stack (server/event_stream.py, issue 27).

The live-server tests (test_final_server_reliability.py, ...) run whichever protocol is installed;
here each is run on its own, with a bare ASGI app, so both stay covered.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from final.server.admission import Admission
from final.server.event_stream import DirectSend, EventStream
from final.server.timeouts import timed_h11_protocol, timed_httptools_protocol
from tests.fixtures.live_server import free_port

HEADER_TIMEOUT_S = 0.5
FRAMES = 50
SLOW_FRAMES = 10
PROTOCOLS = {"h11": timed_h11_protocol, "httptools": timed_httptools_protocol}


class CountingSends:
    """A middleware that counts the messages the app sends through it."""

    def __init__(self, app: ASGIApp):
        self.app, self.sent = app, []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted(message: Message) -> None:
            self.sent.append(message["type"])
            await send(message)

        await self.app(scope, receive, counted)


def make_app(admission: Admission) -> tuple[ASGIApp, list[str]]:
    app = FastAPI()

    @app.get("/stream")
    async def stream() -> EventStream:
        async def frames() -> AsyncIterator[str]:
            for i in range(FRAMES):
                yield f"data: {i}\n\n"

        return EventStream(admission.reserve(1), frames())

    @app.get("/plain")
    async def plain() -> dict:
        return {"ok": True}

    @app.get("/slow")
    async def slow() -> EventStream:
        async def frames() -> AsyncIterator[str]:  # twice the header timeout, a frame at a time
            for i in range(SLOW_FRAMES):
                await asyncio.sleep(2 * HEADER_TIMEOUT_S / SLOW_FRAMES)
                yield f"data: {i}\n\n"

        return EventStream(admission.reserve(1), frames())

    counting = CountingSends(app)
    return DirectSend(counting), counting.sent


@pytest.fixture(params=sorted(PROTOCOLS))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[int, list[str], Admission]]:
    if request.param == "httptools":
        pytest.importorskip("httptools", reason="needs httptools (installed with the project)")
    admission = Admission(limit=4)
    app, sent = make_app(admission)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", loop="asyncio",
                            http=PROTOCOLS[request.param](HEADER_TIMEOUT_S), lifespan="off")  # fmt: skip
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    yield port, sent, admission
    server.should_exit = True
    thread.join(10)


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float | None]:
    """Everything the server sends until it closes the connection (and when), or until limit_s."""
    started, data = time.monotonic(), b""
    sock.settimeout(0.1)
    while time.monotonic() - started < limit_s:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        if not chunk:
            return data, time.monotonic() - started
        data += chunk
    return data, None


def test_a_connection_without_whole_headers_is_closed(served):
    port, _, _ = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /plain HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never the blank line
        data, closed_after = read_until_closed(sock, HEADER_TIMEOUT_S + 5)
    assert data == b"" and closed_after is not None, "the half-sent request's connection is still open"
    assert HEADER_TIMEOUT_S - 0.05 <= closed_after < HEADER_TIMEOUT_S + 2


def test_a_kept_alive_connection_gets_the_timer_again_after_each_response(served):
    port, _, _ = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(2):  # each request answered, within the timer's bound of the last
            sock.sendall(b"GET /plain HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.settimeout(5)
            answer = b""
            while not answer.endswith(b'{"ok":true}'):
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200")
        data, closed_after = read_until_closed(sock, HEADER_TIMEOUT_S + 5)
    assert data == b"" and closed_after is not None and closed_after < HEADER_TIMEOUT_S + 2


def test_a_response_slower_than_the_header_timer_is_not_cut_off(served):
    """The timer bounds the request's headers only: once they are in, a response may take as long
    as it takes (a stream of minutes)."""
    port, _, _ = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data, closed_after = read_until_closed(sock, 10)
    frames = [
        line for line in dechunk(data.partition(b"\r\n\r\n")[2]).split(b"\n") if line.startswith(b"data: ")
    ]
    assert frames == [b"data: %d" % i for i in range(SLOW_FRAMES)]
    assert closed_after is not None and closed_after >= 2 * HEADER_TIMEOUT_S - 0.05


def test_a_pipelined_request_is_not_cut_off_by_the_timer_rearmed_after_the_first(served):
    """Two slow requests in one write (HTTP/1.1 pipelining): when the first response is done the
    second's headers are already in, so the timer must not be armed for it."""
    port, _, _ = served
    head = b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(head + b"\r\n" + head + b"Connection: close\r\n\r\n")
        data, closed_after = read_until_closed(sock, 10)
    answers = data.split(b"HTTP/1.1 200")[1:]
    assert len(answers) == 2, data[-300:]
    last = [
        line
        for line in dechunk(answers[1].partition(b"\r\n\r\n")[2]).split(b"\n")
        if line.startswith(b"data: ")
    ]
    assert last == [b"data: %d" % i for i in range(SLOW_FRAMES)]
    assert closed_after is not None


def test_frames_bypass_the_middleware_stack_but_start_and_end_pass_through_it(served):
    port, sent, admission = served
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        data, closed_after = read_until_closed(sock, 10)
    assert closed_after is not None and data.startswith(b"HTTP/1.1 200")
    head, _, body = data.partition(b"\r\n\r\n")
    assert b"text/event-stream" in head.lower() and b"content-length" not in head.lower()
    frames = [line for line in dechunk(body).split(b"\n") if line.startswith(b"data: ")]
    assert frames == [b"data: %d" % i for i in range(FRAMES)]
    # Through the middleware: the response's start and its end, not one message per frame.
    assert sent == ["http.response.start", "http.response.body"]
    # The stream gives its place back once its response returns, just after uvicorn closed the
    # connection on its last message: wait for that (bounded), not for a fixed time.
    deadline = time.monotonic() + 5
    while admission.in_use and time.monotonic() < deadline:
        time.sleep(0.01)
    assert admission.in_use == 0


def dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        out, body = out + rest[:n], rest[n + 2 :]
    return out


def test_a_stream_cut_off_by_its_consumer_closes_its_frames_and_gives_its_place_back():
    """The connection breaks mid-stream (a send fails): the frames' generator runs its `finally`
    at once (where generation.py aborts the request in the engine), and the place comes back."""
    admission = Admission(limit=1)
    closed = asyncio.Event()

    async def frames() -> AsyncIterator[str]:
        try:
            while True:
                yield "data: x\n\n"
                await asyncio.sleep(0)
        finally:
            closed.set()

    async def scenario() -> int:
        written = 0
        never = asyncio.Event()

        async def receive() -> Message:  # the client says nothing more
            await never.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal written
            written += message["type"] == "http.response.body"
            if written == 5:
                raise ConnectionResetError("the client is gone")

        response = EventStream(admission.reserve(1), frames())
        scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}
        with pytest.raises(ConnectionResetError):
            await response(scope, receive, send)
        assert closed.is_set()
        return written

    assert asyncio.run(scenario()) == 5
    assert admission.in_use == 0
