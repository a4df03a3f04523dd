"""Issue 15 against a live server on loopback: one bad request must never hurt another.

Each finding of the issue is a test here (shutdown in test_final_server_shutdown.py, the API key
and CORS in test_final_server_security.py, the fuzz in test_final_server_fuzz.py):

1, 6  values the engine cannot represent (top_k 1e20, seed 2**70) are 400s at the door, and the
      streams running meanwhile finish exactly as they would have alone;
3     admission is atomic: a burst of 40 streams against a limit of 8 admits exactly 8;
4     bodies past --max-request-bytes are 413s, text longer than the context can hold is refused
      before it is tokenized, and tokenizing happens off the event loop (/health stays fast);
5     lone surrogates and deep JSON are 400s, and the keep-alive connection stays usable;
7     a request that can never fit (prompts x n past the limit) is a 400 naming the limit;
8     a tiny temperature samples greedily;
9     loose types are refused (strict models);
10    /v1/models reports the name only, text/plain bodies are refused, no CORS headers by default,
      and binding beyond loopback without a key logs a warning;
11    /openapi.json and /docs are served, with the request models.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import random
import select
import socket
import time

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]
import pytest

from final.frontend.tokenizer import Tokenizer
from tests.fixtures.live_server import Server, serving

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
USER = [{"role": "user", "content": "What is the capital of France?"}]
LIMIT_FLAGS = ("--max-running-requests", "4", "--max-waiting-requests", "4")  # 8 sequences in flight
JSON_HEADERS = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    # --host 0.0.0.0 without a key: the server must warn (test_open_bind_without_a_key_warns).
    yield from serving(tiny_qwen3_dir, tmp_path_factory.mktemp("hardening"), *LIMIT_FLAGS,
               "--host", "0.0.0.0", "--served-model-name", "tiny_qwen3")  # fmt: skip


@pytest.fixture(scope="module")
def default_server(default_model_dir, tmp_path_factory):
    """The default model: a long context (big texts) and steps slow enough that streams last."""
    s = Server(default_model_dir, tmp_path_factory.mktemp("hardening_default") / "server.log", *LIMIT_FLAGS,
               "--num-pages", "8192", "--log-level", "warning")  # fmt: skip
    yield s
    s.stop()


def post(server: Server, path: str, body, headers=JSON_HEADERS, timeout: float = 60) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{server.url}{path}", content=content, headers=headers, timeout=timeout)


def assert_openai_error(response: httpx.Response, status: int, needle: str = "") -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and needle in error["message"] + str(error["param"]), error
    return error


# ---------------------------------------------------------------------------------------------
# 1, 6: unrepresentable values, while other requests stream

UNREPRESENTABLE = [
    (CHAT, {"messages": USER, "max_tokens": 4, "top_k": 10**20}, "top_k"),
    (COMPLETIONS, {"prompt": "The", "max_tokens": 4, "top_k": 10**20}, "top_k"),
    (CHAT, {"messages": USER, "max_tokens": 4, "seed": 2**70}, "seed"),
    (COMPLETIONS, {"prompt": "The", "max_tokens": 4, "seed": -(2**70)}, "seed"),
    (COMPLETIONS, {"prompt": "The", "max_tokens": 2**40}, "max_tokens"),
    (COMPLETIONS, {"prompt": [2**40], "max_tokens": 4}, "prompt[0]"),
    (CHAT, {"messages": USER, "stop_token_ids": [2**63]}, "stop_token_ids[0]"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": 1e400}', "temperature"),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', "NaN"),
    (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "surrogate"),
    (COMPLETIONS, b"[" * 100_000, "nested too deeply"),
]


def test_unrepresentable_values_are_400s_and_running_streams_finish_unharmed(server):
    prompts = ["The cat", "A small robot", "One river"]
    kw = {"max_tokens": 200, "temperature": 0, "ignore_eos": True}
    alone = [post(server, COMPLETIONS, {"prompt": p, **kw}).json()["choices"][0]["text"] for p in prompts]

    async def stream(client: httpx.AsyncClient, prompt: str, first: asyncio.Event) -> tuple[str, str, float]:
        text, finish = "", ""
        body = {"prompt": prompt, "stream": True, **kw}
        async with client.stream("POST", f"{server.url}{COMPLETIONS}", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                first.set()
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                finish = choice["finish_reason"] or finish
        return text, finish, time.monotonic()

    async def bad_requests(client: httpx.AsyncClient) -> list[tuple[httpx.Response, str]]:
        out = []
        for path, body, needle in UNREPRESENTABLE:
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            out.append(
                (await client.post(f"{server.url}{path}", content=content, headers=JSON_HEADERS), needle)
            )
        return out

    async def main():
        async with httpx.AsyncClient(timeout=120) as client:
            started = [asyncio.Event() for _ in prompts]
            streams = [
                asyncio.create_task(stream(client, p, e)) for p, e in zip(prompts, started, strict=True)
            ]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
            bad = await bad_requests(client)
            bad_done = time.monotonic()
            return await asyncio.gather(*streams), bad, bad_done

    results, bad, bad_done = asyncio.run(main())
    for response, needle in bad:
        assert_openai_error(response, 400, needle)
    assert [text for text, _, _ in results] == alone
    assert all(finish == "length" for _, finish, _ in results)
    assert all(ended > bad_done for _, _, ended in results), "the streams ended before the bad requests"
    server.wait_for_idle_pool()


# ---------------------------------------------------------------------------------------------
# 3: admission is atomic under a burst


def test_a_burst_of_streams_admits_exactly_the_limit(default_server):
    body = {"prompt": "Count from one to a thousand:", "max_tokens": 4000, "ignore_eos": True, "stream": True}

    refusals: list[dict] = []

    async def one(client: httpx.AsyncClient) -> tuple[int, httpx.Response | None]:
        request = client.build_request("POST", f"{default_server.url}{COMPLETIONS}", json=body)
        response = await client.send(request, stream=True)
        if response.status_code != 200:
            refusals.append(json.loads(await response.aread())["error"])
            await response.aclose()
            return response.status_code, None
        return 200, response  # held open: the stream keeps its place until we close it

    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            results = await asyncio.gather(*(one(client) for _ in range(40)))
            for _, response in results:
                if response is not None:
                    await response.aclose()
            return [status for status, _ in results]

    for _ in range(3):
        statuses = asyncio.run(burst())
        assert sorted(statuses) == [200] * 8 + [503] * 32, statuses
        # it counts sequences (prompts x n), and says so
        assert all(e["code"] == "server_overloaded" and "8 sequences" in e["message"] for e in refusals)
        default_server.wait_for_idle_pool(timeout=60)  # the 8 were aborted when their clients left


# ---------------------------------------------------------------------------------------------
# 4: large bodies


def raw_post(port: int, path: str, headers: dict[str, str], chunks) -> tuple[int, dict]:
    """POST on a raw socket, sending body chunks only while the server has not answered yet (a
    server that answers early and closes would make a plain client fail on a reset)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        sock.sendall((head + "\r\n").encode())
        for chunk in chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # the answer is here: stop sending
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


def test_a_body_over_the_cap_is_a_413_without_being_read(server):
    # Content-Length past the cap: refused before a byte of the body is sent.
    headers = {"Content-Type": "application/json", "Content-Length": str(5 * 1024 * 1024)}
    status, body = raw_post(server.port, COMPLETIONS, headers, [])
    assert status == 413 and "--max-request-bytes" in body["error"]["message"], body
    assert body["error"]["code"] == "request_too_large"

    def chunked():  # no Content-Length: the bytes are counted as they arrive
        piece = b" " * (256 * 1024)
        for _ in range(40):  # 10 MiB at most; the server answers after 4
            yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"

    headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    status, body = raw_post(server.port, CHAT, headers, chunked())
    assert status == 413 and "the limit is 4194304 bytes" in body["error"]["message"], body
    # A body just under the cap is read (and refused for what it says, not for its size).
    almost = json.dumps({"prompt": "x", "user": " " * (4 * 1024 * 1024 - 100)}).encode()
    response = post(server, COMPLETIONS, almost)
    assert response.status_code == 200, response.text


def test_text_longer_than_the_context_is_refused_before_tokenizing(server, tiny_qwen3_dir):
    limit = 256 * Tokenizer(tiny_qwen3_dir).max_token_chars
    error = assert_openai_error(post(server, COMPLETIONS, {"prompt": "a" * (limit + 1)}), 400, "characters")
    assert error["code"] == "context_length_exceeded" and str(limit) in error["message"]
    # Just under the character limit, the text is tokenized and refused by its token count.
    error = assert_openai_error(post(server, COMPLETIONS, {"prompt": "a " * (limit // 2)}), 400, "tokens")
    assert error["code"] == "context_length_exceeded"


def test_health_stays_fast_while_a_huge_prompt_is_tokenized(default_server, default_model_dir):
    tokenizer = Tokenizer(default_model_dir)
    rng = random.Random(0)  # varied characters: slow to tokenize, one token per 1-2 characters
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 .,üé数") for _ in range(600_000))
    assert len(text) < 8192 * tokenizer.max_token_chars  # under the character limit: it is tokenized

    async def main() -> tuple[httpx.Response, float, list[float]]:
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"messages": [{"role": "user", "content": text}], "max_tokens": 4}
            start = time.monotonic()
            big = asyncio.create_task(client.post(f"{default_server.url}{CHAT}", json=body))
            latencies = []
            while not big.done():
                t0 = time.monotonic()
                assert (await client.get(f"{default_server.url}/health")).status_code == 200
                latencies.append(time.monotonic() - t0)
                await asyncio.sleep(0.02)
            return await big, time.monotonic() - start, latencies

    response, elapsed, latencies = asyncio.run(main())
    assert_openai_error(response, 400, "tokens")  # tokenized: more tokens than the context
    assert elapsed > 0.3 and len(latencies) >= 3, (elapsed, latencies)
    assert max(latencies) < 0.5 * elapsed, (elapsed, latencies)


# ---------------------------------------------------------------------------------------------
# 5: bad text and deep JSON keep the connection


def test_bad_text_and_deep_json_are_400s_on_a_kept_alive_connection(server):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    bodies = [
        (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 2}', "surrogate"),
        (CHAT, b"[" * 100_000, "nested too deeply"),
        (COMPLETIONS, b'{"prompt": "\\udfff"}', "surrogate"),
        (COMPLETIONS, b'{"prompt": "\xff\xfe"}', "UTF-8"),
        (COMPLETIONS, b'{"prompt": ' + b"[" * 300 + b"]" * 300 + b"}", "prompt"),
    ]
    sockname = None
    for path, body, needle in bodies:
        conn.request("POST", path, body=body, headers=JSON_HEADERS)
        response = conn.getresponse()
        payload = json.loads(response.read())
        assert response.status == 400, payload
        assert needle in payload["error"]["message"], payload
        assert (response.getheader("connection") or "").lower() != "close"
        sockname = sockname or conn.sock.getsockname()
        assert conn.sock is not None and conn.sock.getsockname() == sockname, "the connection was dropped"
    conn.request(
        "POST", COMPLETIONS, body=json.dumps({"prompt": "The", "max_tokens": 2}), headers=JSON_HEADERS
    )
    assert conn.getresponse().status == 200
    assert conn.sock.getsockname() == sockname
    conn.close()


# ---------------------------------------------------------------------------------------------
# 7, 8, 9


def test_a_request_that_can_never_fit_is_a_400_naming_the_limit(server):
    # One request may hold --max-running-requests sequences (4), not the whole server's 8.
    for path, body in [
        (COMPLETIONS, {"prompt": ["Hi"] * 2000, "max_tokens": 2}),
        (COMPLETIONS, {"prompt": ["Hi"] * 5, "n": 2, "max_tokens": 2}),
        (CHAT, {"messages": USER, "n": 9, "max_tokens": 2}),
    ]:
        error = assert_openai_error(post(server, path, body), 400, "at most 4")
        assert error["code"] == "too_many_sequences" and "--max-running-requests" in error["message"]
    # exactly the limit fits
    out = post(server, COMPLETIONS, {"prompt": ["Hi"] * 2, "n": 2, "max_tokens": 2})
    assert out.status_code == 200 and len(out.json()["choices"]) == 4


@pytest.mark.parametrize("temperature", [1e-300, 1e-7])
def test_a_tiny_temperature_samples_greedily(server, temperature):
    kw = {"prompt": "The old engine", "max_tokens": 24, "ignore_eos": True, "seed": 3}
    greedy = post(server, COMPLETIONS, {**kw, "temperature": 0}).json()["choices"][0]
    tiny = post(server, COMPLETIONS, {**kw, "temperature": temperature}).json()["choices"][0]
    assert tiny["text"] == greedy["text"] and tiny["text"].strip()
    assert tiny["finish_reason"] == "length"


LOOSE = [
    ({"stream": "yes"}, "stream"),
    ({"max_tokens": True}, "max_tokens"),
    ({"n": "2"}, "n"),
    ({"max_tokens": "8"}, "max_tokens"),
    ({"max_tokens": 8.0}, "max_tokens"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"temperature": "0.5"}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"stop": [""]}, "stop[0]"),
    ({"stop": 5}, "stop"),
    ({"ignore_eos": 1}, "ignore_eos"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
]


@pytest.mark.parametrize(("fields", "param"), LOOSE, ids=[json.dumps(f) for f, _ in LOOSE])
def test_loose_types_are_refused(server, fields, param):
    response = post(server, CHAT, {"messages": USER, "max_tokens": 2, **fields})
    error = assert_openai_error(response, 400, param)
    assert error["type"] == "invalid_request_error"


# ---------------------------------------------------------------------------------------------
# 10, 11


def test_models_report_the_name_only(server, tiny_qwen3_dir):
    text = httpx.get(f"{server.url}/v1/models").text
    card = json.loads(text)["data"][0]
    assert card["id"] == "tiny_qwen3"
    assert str(tiny_qwen3_dir) not in text and str(tiny_qwen3_dir.parent) not in text


def test_only_json_bodies_and_no_cors_by_default(server):
    body = json.dumps({"messages": USER, "max_tokens": 2})
    for content_type in ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", ""]:
        headers = {"Content-Type": content_type, "Origin": "http://evil.example"}
        error = assert_openai_error(
            post(server, CHAT, body.encode(), headers=headers), 415, "application/json"
        )
        assert error["code"] == "unsupported_media_type"
    ok = post(server, CHAT, body.encode(), headers={"Content-Type": "application/json; charset=utf-8",
                                                     "Origin": "http://evil.example"})  # fmt: skip
    assert ok.status_code == 200 and "access-control-allow-origin" not in ok.headers
    preflight = httpx.options(
        f"{server.url}{CHAT}",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


def test_open_bind_without_a_key_warns(server):
    assert "without an API key" in server.log_path.read_text()


def test_openapi_schema_and_docs(server):
    schema = httpx.get(f"{server.url}/openapi.json").json()
    for path, model in [(CHAT, "ChatCompletionRequest"), (COMPLETIONS, "CompletionRequest")]:
        body = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
        assert {"400", "413", "415", "503"} <= set(schema["paths"][path]["post"]["responses"])
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["additionalProperties"] is False and chat["required"] == ["messages"]
    top_k = chat["properties"]["top_k"]["anyOf"][0]
    assert top_k == {"type": "integer", "minimum": -1, "maximum": 2**31 - 1,
                     "default": -1, "description": "extension: -1 or 0 for no limit", "title": "Top K"}  # fmt: skip
    docs = httpx.get(f"{server.url}/docs")
    assert docs.status_code == 200 and "/openapi.json" in docs.text


def test_a_client_gone_from_a_plain_request_is_no_error(default_server):
    body = json.dumps({"prompt": "Count from one to a thousand:", "max_tokens": 4000, "ignore_eos": True})
    with socket.create_connection(("127.0.0.1", default_server.port), timeout=60) as sock:
        sock.sendall(
            f"POST {COMPLETIONS} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
        )
        deadline = time.monotonic() + 60
        while default_server.metrics()["final_requests_running"] < 1:  # it is generating
            assert time.monotonic() < deadline, "the request never started"
    default_server.wait_for_idle_pool(timeout=60)  # aborted once the server saw the client leave
    log = default_server.log()
    assert "unexpected error" not in log and "Traceback" not in log, log
