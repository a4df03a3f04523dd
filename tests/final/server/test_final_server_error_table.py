"""docs/serving/safety.md's error table is what the server answers: each row, provoked.

The table is read from the page; every row needs a provocation here, and each one must answer the
row's status and `code` (a row without one, or one without a row, fails). The rows that end a
server (`shutting_down`, `engine_dead`) get a server of their own. One row cannot be provoked from
outside: `engine_error` comes only from a bug in the engine, so it is checked on the function the
handlers answer such a failure with.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]
import pytest

from final.frontend.mailbox import TokenUpdate
from final.server.generation import Served
from final.server.launch import ENGINE_LOST_EXIT
from final.server.streaming import engine_error
from tests import ROOT
from tests.fixtures.live_server import Server, is_engine_process

psutil = pytest.importorskip("psutil", reason="the terminal rows stop the engine with psutil")

SAFETY = ROOT / "docs" / "serving" / "safety.md"
KEY = "sk-table-5b1e"
AUTH = {"Authorization": f"Bearer {KEY}"}
FLAGS = ("--max-running-requests", "4", "--max-waiting-requests", "4", "--read-timeout", "1",
         "--engine-silence-timeout", "60", "--served-model-name", "tiny")  # fmt: skip
Row = tuple[int, str | None]


def table_rows() -> list[Row]:
    """(status, code) of every row of the page's "What each error means" table."""
    section = SAFETY.read_text().split("## What each error means", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            code = re.match(r"`([a-z_]+)`", cells[1])
            rows.append((int(cells[0]), code.group(1) if code else None))
    return rows


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    s = Server(
        tiny_qwen3_dir, tmp_path_factory.mktemp("table") / "server.log", *FLAGS, env={"FINAL_API_KEY": KEY}
    )
    yield s
    s.stop()


def post(server: Server, path: str, body: dict | bytes, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **AUTH, **headers}
    return httpx.post(f"{server.url}{path}", content=content, headers=headers, timeout=60)


def raw(server: Server, head: str, body: bytes = b"") -> httpx.Response:
    """A request on a raw socket whose body is slower than the server waits for, or never sent."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        answer = http.client.HTTPResponse(sock)
        answer.begin()
        return httpx.Response(answer.status, headers=answer.getheaders(), content=answer.read())


def engine_of(server: Server) -> psutil.Process:
    children = psutil.Process(server.proc.pid).children(recursive=True)
    return next(p for p in children if is_engine_process(p))


def in_flight(server: Server, count: int) -> None:
    """Wait until `count` sequences hold admission places (each /metrics waits up to 5 s for a
    stopped engine's stats, then reports the places from the server's own count)."""
    deadline = time.monotonic() + 60
    while server.metrics()["final_requests_in_flight"] < count:
        assert time.monotonic() < deadline, "the requests never took their places"


class Pending(threading.Thread):
    def __init__(self, server: Server, body: dict):
        super().__init__(daemon=True)
        self.server, self.body, self.response = server, body, None

    def run(self) -> None:
        self.response = post(self.server, "/v1/completions", self.body)


GOOD = {"prompt": "The", "max_tokens": 2}
HOST = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


def overloaded(server: Server) -> httpx.Response:
    engine = engine_of(server)
    engine.suspend()  # the places stay taken while it is stopped
    try:
        holders = [Pending(server, {**GOOD, "prompt": ["The"] * 4}) for _ in range(2)]
        for h in holders:
            h.start()
        in_flight(server, 8)
        response = post(server, "/v1/completions", GOOD)
    finally:
        engine.resume()
    for h in holders:
        h.join(60)
        assert h.response is not None and h.response.status_code == 200
    return response


def timed_out(server: Server) -> httpx.Response:
    return raw(server, HOST + f"Authorization: Bearer {KEY}\r\nContent-Length: 100\r\n", b"{")


def too_large(server: Server) -> httpx.Response:
    return raw(server, HOST + f"Authorization: Bearer {KEY}\r\nContent-Length: {5 * 2**20}\r\n")


LIVE: dict[Row, Callable[[Server], httpx.Response]] = {
    (400, None): lambda s: post(s, "/v1/completions", {**GOOD, "temperature": 5}),
    (400, "context_length_exceeded"): lambda s: post(s, "/v1/completions", {"prompt": [5] * 300}),
    (400, "too_many_sequences"): lambda s: post(s, "/v1/completions", {**GOOD, "prompt": ["The"] * 5}),
    (400, "host_not_allowed"): lambda s: post(s, "/v1/completions", GOOD, Host="rebind.attacker.example"),
    (401, "invalid_api_key"): lambda s: post(s, "/v1/completions", GOOD, Authorization="Bearer sk-wrong"),
    (404, "model_not_found"): lambda s: post(s, "/v1/completions", {**GOOD, "model": "gpt-4"}),
    (404, None): lambda s: httpx.get(f"{s.url}/no/such/path", headers=AUTH),
    (408, "request_timeout"): timed_out,
    (413, "request_too_large"): too_large,
    (415, "unsupported_media_type"): lambda s: post(
        s, "/v1/completions", GOOD, **{"Content-Type": "text/plain"}
    ),
    (503, "server_overloaded"): overloaded,
}
TERMINAL = {(503, "shutting_down"), (503, "engine_dead")}
BY_FUNCTION = {(500, "engine_error")}


def test_every_row_has_a_provocation():
    rows = table_rows()
    assert len(rows) == len(set(rows)) >= 14, rows
    assert set(rows) == set(LIVE) | TERMINAL | BY_FUNCTION


@pytest.mark.parametrize("row", [r for r in table_rows() if r in LIVE], ids=lambda row: f"{row[0]}-{row[1]}")
def test_a_row(server, row):
    status, code = row
    response = LIVE[row](server)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, error
    if row == (404, None):
        assert error["type"] == "not_found"
    if status == 503:
        assert response.headers["retry-after"] == "1"


def test_engine_error_row(tiny_qwen3_dir):
    request = Served(7, arrival=0.0)
    request.apply(TokenUpdate([], "", finish_reason="error", error="the engine failed: RuntimeError: boom"))
    err = engine_error(request)
    assert (err.status, err.code, err.type) == (500, "engine_error", "server_error")
    assert "RuntimeError" not in err.message and "boom" not in err.message


def start_then_stop_engine(tiny_qwen3_dir: Path, log: Path) -> tuple[Server, psutil.Process, Pending]:
    server = Server(tiny_qwen3_dir, log, "--engine-silence-timeout", "60", "--log-level", "warning")
    engine = engine_of(server)
    engine.suspend()
    pending = Pending(server, GOOD)
    pending.start()
    in_flight(server, 1)
    return server, engine, pending


def test_shutting_down_row(tiny_qwen3_dir, tmp_path):
    server, engine, pending = start_then_stop_engine(tiny_qwen3_dir, tmp_path / "server.log")
    try:
        server.proc.send_signal(signal.SIGTERM)
        pending.join(60)
        engine.resume()  # so that it stops at once, rather than after the shutdown's grace periods
        response = pending.response
        assert response is not None and response.status_code == 503, response
        assert response.json()["error"]["code"] == "shutting_down"
        assert server.proc.wait(60) == 0, server.log()
    finally:
        server.stop()


def test_engine_dead_row(tiny_qwen3_dir, tmp_path):
    server, engine, pending = start_then_stop_engine(tiny_qwen3_dir, tmp_path / "server.log")
    try:
        engine.kill()
        pending.join(60)
        response = pending.response
        assert response is not None and response.status_code == 503, response
        error = response.json()["error"]
        assert error["code"] == "engine_dead" and "SIGKILL" not in error["message"], error
        assert server.proc.wait(60) == ENGINE_LOST_EXIT, server.log()
        assert "killed by SIGKILL" in server.log_path.read_text()
    finally:
        server.stop()
