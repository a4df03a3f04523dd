"""The server at its capacity with overlap scheduling on: more requests than rows, finishing on
tokens the scheduler cannot foresee. Under overlap a finished request keeps its page-table row
until the step in flight is done; an admission that counted running requests only took a row from
an empty list and stopped the engine (an H200 server at 64 requests a second, session 19). On the
CPU overlap is off by default, so every other live-server test runs the serial loop."""

from __future__ import annotations

import asyncio

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]
import pytest

from tests.fixtures.live_server import serving

FLAGS = ("--overlap", "on", "--max-running-requests", "2", "--max-waiting-requests", "64",
         "--served-model-name", "tiny", "--log-level", "warning")  # fmt: skip
REQUESTS = 24


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    yield from serving(tiny_qwen3_dir, tmp_path_factory.mktemp("capacity"), *FLAGS)


def test_more_requests_than_rows_all_finish_and_the_engine_keeps_serving(server):
    """24 requests at once on 2 rows: each stops on one of many token ids (a finish the scheduler
    cannot foresee, so the step launched after it still holds the request) or at its max_tokens;
    every one answers 200 with at most its max_tokens, and the server is healthy after."""

    async def one(client: httpx.AsyncClient, i: int) -> httpx.Response:
        body = {"model": "tiny", "prompt": f"request {i}: " + "word " * (i % 7 + 1), "max_tokens": 3 + i % 9,
                "temperature": 0.8, "seed": i, "stop_token_ids": list(range(1, 512, 8))}  # fmt: skip
        return await client.post(f"{server.url}/v1/completions", json=body, timeout=120)

    async def all_of_them() -> list[httpx.Response]:
        async with httpx.AsyncClient() as client:
            return await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))

    answers = asyncio.run(all_of_them())
    assert [a.status_code for a in answers] == [200] * REQUESTS, [
        a.text for a in answers if a.status_code != 200
    ]
    reasons = [a.json()["choices"][0]["finish_reason"] for a in answers]
    assert "stop" in reasons, reasons  # some finished on a token the scheduler could not foresee
    for i, answer in enumerate(answers):
        assert answer.json()["usage"]["completion_tokens"] <= 3 + i % 9
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert "pop from empty list" not in server.log_path.read_text()
