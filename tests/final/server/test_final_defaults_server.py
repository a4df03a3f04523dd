"""The server a newcomer starts with `make run`: the default model, the README's request, what a
request without max_tokens or sampling fields gets, and how a client that hangs up is logged.

One server on the default model, with a generation_config.json of our own (`--generation-config
FOLDER`: top_k 1, max_new_tokens 8), so the test sees the file's values take effect.
"""

from __future__ import annotations

import json
import re
import shlex
import socket
import time

import pytest

from tests.final.server.test_final_server import ROOT, Server, httpx

README = ROOT / "README.md"
DEFAULT_CAP = 8  # the max_new_tokens of the test's generation_config.json
WENT_AWAY = "the client went away"


@pytest.fixture(scope="module")
def server(default_model_dir, tmp_path_factory):
    config_dir = tmp_path_factory.mktemp("generation_config")
    (config_dir / "generation_config.json").write_text(
        json.dumps({"top_k": 1, "max_new_tokens": DEFAULT_CAP})
    )
    log = tmp_path_factory.mktemp("defaults") / "server.log"
    s = Server(default_model_dir, log, "--num-pages", "4096", "--log-level", "info",
               "--generation-config", str(config_dir))  # fmt: skip
    yield s
    s.stop()


def chat(server: Server, **body) -> dict:
    messages = body.pop("messages", [{"role": "user", "content": "Write a poem about the sea."}])
    response = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": messages, **body}, timeout=300
    )
    assert response.status_code == 200, response.text
    return response.json()


def readme_request_body() -> dict:
    """The JSON body of the README's curl example."""
    text = README.read_text()
    command = re.search(r"^curl .*?(?<!\\)\n", text, re.S | re.M)
    assert command, "the README has no curl example"
    argv = shlex.split(command.group(0).replace("\\\n", " "))
    return json.loads(argv[argv.index("-d") + 1])


def test_the_readme_request_answers_paris(server):
    body = readme_request_body()
    assert "max_tokens" in body, "the README's example should bound its answer"
    for _ in range(2):  # every time, not once
        out = chat(server, **body)
        assert "Paris" in out["choices"][0]["message"]["content"]
        assert out["choices"][0]["finish_reason"] == "stop"


def test_a_chat_request_without_max_tokens_ends_at_the_default_cap(server):
    out = chat(server, temperature=0, ignore_eos=True)
    assert out["usage"]["completion_tokens"] == DEFAULT_CAP
    assert out["choices"][0]["finish_reason"] == "length"
    longer = chat(server, temperature=0, ignore_eos=True, max_tokens=DEFAULT_CAP + 4)  # asked: honoured
    assert longer["usage"]["completion_tokens"] == DEFAULT_CAP + 4


def test_generation_config_fills_in_what_a_request_leaves_out(server):
    greedy = chat(server, temperature=0, max_tokens=12)["choices"][0]["message"]["content"]
    for seed in range(3):  # temperature 1 (the built-in), top_k 1 from the file: greedy all the same
        assert chat(server, seed=seed, max_tokens=12)["choices"][0]["message"]["content"] == greedy
    sampled = {
        chat(server, seed=seed, top_k=-1, max_tokens=12)["choices"][0]["message"]["content"]
        for seed in range(3)
    }
    assert sampled != {greedy}, "a request's own top_k must win over the file's"
    log = server.log_path.read_text()
    assert (
        "top_k 1 (generation_config.json)" in log
        and f"max_tokens {DEFAULT_CAP} (generation_config.json)" in log
    )


# ---------------------------------------------------------------------------------------------
# A client that hangs up: one INFO line, no error


def running(server: Server) -> float:
    return server.metrics()["final_requests_running"]


def wait_for(condition, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        time.sleep(0.05)  # the polling interval


LONG = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 2000,
        "temperature": 0, "ignore_eos": True}  # fmt: skip


def test_a_client_that_hangs_up_is_one_info_line(server):
    before = server.log_path.read_text().count(WENT_AWAY)
    # Not streamed: send the request by hand, hang up once the engine is generating it.
    body = json.dumps(LONG).encode()
    with socket.create_connection(("127.0.0.1", server.port)) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        wait_for(lambda: running(server) == 1, "running request")
    wait_for(
        lambda: server.log_path.read_text().count(WENT_AWAY) == before + 1, "INFO line for the first hang-up"
    )
    # Streamed: read a few chunks, then close.
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{server.url}/v1/chat/completions",
                                                       json={**LONG, "stream": True}) as response:  # fmt: skip
        assert response.status_code == 200
        chunks = [line for line, _ in zip(response.iter_lines(), range(4), strict=False)]
        assert chunks
    wait_for(
        lambda: server.log_path.read_text().count(WENT_AWAY) == before + 2, "INFO line for the second hang-up"
    )
    server.wait_for_idle_pool()
    log = server.log_path.read_text()
    lines = [line for line in log.splitlines() if WENT_AWAY in line]
    assert all(" INFO " in line for line in lines), lines
    assert "Traceback" not in log and " ERROR " not in log and "ERROR:" not in log, log[-3000:]
