"""Soak `python -m final` on loopback: minutes at saturation with aborts and bad requests mixed in.

    python -m scripts.soak                     # 10 minutes on the default model (make soak)
    python -m scripts.soak --duration 30       # a short run that proves the setup works

It starts its own server (the default model unless --model), warms it up, reads the baseline
(KV pool from /metrics, RSS of the server and its engine), then runs --concurrency workers for
--duration seconds. Each worker loops over a random mix: streamed and plain completions and
chats (greedy, seeded, with stop strings), streams it abandons after a few events (an abort),
and bad requests (malformed or deep JSON, lone surrogates, huge numbers, loose types, a body over
the size cap, text/plain, requests that can never fit, a Host naming another server, bodies of
too many messages). Beside them run a long-prompt client (a prompt of --long-prompt-tokens inside
the limits, again and again) and a slow-body client (raw connections that send their headers or
body a byte at a time, past the server's --read-timeout: each must be closed, the body ones with a
408; and one slow body that finishes in time must be served). The concurrency stays below the
admission limit, so a healthy server answers no 5xx at all. At the end it waits for the pool to
come back and prints: requests by kind and status, any 5xx, the KV pool against its baseline,
and RSS before and after. Exit status 1 if any 5xx, if the pool is not back, or if the server died.
Not a CI test: the lead runs the 10-minute version on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The cat", "Once upon a time", "The capital of France is", "def fibonacci(n):", "A GPU is"]
QUESTIONS = ["What is the capital of France?", "Name three colours.", "Tell me a story.", "Count to ten."]


def bad_requests(max_in_flight: int) -> list[tuple[str, bytes, dict[str, str]]]:
    """(path, body, headers) of requests the server must refuse with a 4xx."""
    chat, comp, js = "/v1/chat/completions", "/v1/completions", {"Content-Type": "application/json"}
    user = [{"role": "user", "content": "x"}]

    def body(**fields) -> bytes:
        return json.dumps(fields).encode()

    return [
        (chat, b"{not json", js),
        (chat, b"[" * 100_000, js),
        (chat, b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', js),
        (chat, body(messages=user, top_k=10**20), js),
        (chat, body(messages=user, seed=2**70), js),
        (comp, body(prompt="x", max_tokens="8"), js),
        (comp, body(prompt="x", stream="yes"), js),
        (comp, body(prompt=["Hi"] * (max_in_flight + 1), max_tokens=2), js),
        (comp, body(prompt="x", tools=[]), js),
        (comp, body(prompt="x", temperature=-1), js),
        (chat, body(messages=user), {"Content-Type": "text/plain"}),
        (comp, body(prompt="x", model="gpt-4"), js),
        (comp, body(prompt="x" * 10_000_000), js),  # past the default body cap: 413
        (chat, body(messages=user * 100_000), js),  # counted before validation: 400
        (comp, body(prompt="x"), {**js, "Host": "rebind.attacker.example"}),  # DNS rebinding: 400
    ]


class Soak:
    def __init__(self, url: str, max_in_flight: int, seed: int):
        self.url, self.rng = url, random.Random(seed)
        self.bad = bad_requests(max_in_flight)
        self.statuses: Counter[str] = Counter()  # "kind status"
        self.server_errors: list[str] = []
        self.tokens = 0

    def record(self, kind: str, status: int, detail: str = "") -> None:
        """Status 0: the request failed in transport (acceptable only for a refused huge body)."""
        self.statuses[f"{kind} {status}"] += 1
        if status >= 500 or (status == 0 and kind != "bad"):
            self.server_errors.append(f"{kind} {status} {detail[:300]}")

    def good_body(self, stream: bool) -> tuple[str, dict]:
        rng = self.rng
        fields: dict = {"max_tokens": rng.randint(8, 64), "stream": stream}
        if rng.random() < 0.5:
            fields["temperature"] = 0
        else:
            fields.update(
                temperature=rng.uniform(0.2, 1.2), top_p=rng.uniform(0.5, 1), seed=rng.randint(0, 99)
            )
        if rng.random() < 0.2:
            fields["stop"] = [rng.choice([".", "\n", " the"])]
        if rng.random() < 0.5:
            return "/v1/completions", {"prompt": rng.choice(PROMPTS), **fields}
        return "/v1/chat/completions", {
            "messages": [{"role": "user", "content": rng.choice(QUESTIONS)}],
            **fields,
        }

    async def one(self, client: httpx.AsyncClient) -> None:
        roll = self.rng.random()
        if roll < 0.2:
            path, body, headers = self.rng.choice(self.bad)
            try:
                response = await client.post(self.url + path, content=body, headers=headers)
                self.record("bad", response.status_code, response.text)
            except httpx.HTTPError as err:  # a 413 may close the connection before the body is sent
                self.record("bad", 0, repr(err))
            return
        stream = roll < 0.8
        path, body = self.good_body(stream)
        if not stream:
            response = await client.post(self.url + path, json=body)
            self.record("plain", response.status_code, response.text)
            if response.status_code == 200:
                self.tokens += response.json()["usage"]["completion_tokens"]
            return
        abort_after = self.rng.randint(1, 6) if roll < 0.35 else None
        kind = "abort" if abort_after else "stream"
        async with client.stream("POST", self.url + path, json=body) as response:
            if response.status_code != 200:
                self.record(kind, response.status_code, (await response.aread()).decode(errors="replace"))
                return
            events = 0
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line.startswith('data: {"error"'):
                    self.record(kind, 500, line)
                    return
                events += 1
                if abort_after and events >= abort_after:
                    break  # leaving the block closes the connection: the server must abort
            self.tokens += events
            self.record(kind, 200)

    async def worker(self, deadline: float) -> None:
        async with httpx.AsyncClient(timeout=300) as client:
            while time.monotonic() < deadline:
                try:
                    await self.one(client)
                except httpx.HTTPError as err:
                    self.record("transport", 0, repr(err))


async def run_workers(soak: Soak, count: int, deadline: float, extra: tuple = ()) -> None:
    await asyncio.gather(*(soak.worker(deadline) for _ in range(count)), *extra)


async def long_prompt_client(soak: Soak, tokens: int, deadline: float) -> None:
    """A prompt of about `tokens` tokens (inside every limit), a new one (no prefix cache hit)
    as soon as the last is answered."""
    vocabulary = ["river", "engine", "page", "cache", "token", "step", "batch", "prefix", "stream"]
    async with httpx.AsyncClient(timeout=900) as client:
        while time.monotonic() < deadline:
            words = " ".join(soak.rng.choice(vocabulary) for _ in range(tokens))
            body = {"prompt": words, "max_tokens": 8, "temperature": 0}
            try:
                response = await client.post(soak.url + "/v1/completions", json=body)
                soak.record("long", response.status_code, response.text)
            except httpx.HTTPError as err:
                soak.record("long", 0, repr(err))


SLOW_HEAD = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
SLOW_EXPECTED = {"headers": 0, "body": 408, "in-time": 200}  # 0: closed without an answer


async def slow_request(port: int, kind: str, read_timeout: float) -> tuple[int, float]:
    """One connection that sends its headers, or its body, a byte at a time: (the status it got,
    0 for a connection closed without an answer; the seconds it took)."""
    body = json.dumps({"prompt": "The", "max_tokens": 2}).encode()
    head, trickle, pause = {
        "headers": (SLOW_HEAD, b"x" * 10**6, 1.0),
        "body": (SLOW_HEAD + "Content-Length: 100000\r\n\r\n", b" " * 10**6, 1.0),
        "in-time": (SLOW_HEAD + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n", body,
                    read_timeout / (2 * len(body))),
    }[kind]  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    # Stop sending at the first byte of an answer: a byte sent after the server closed makes its
    # kernel answer with a reset, which can discard the answer before it is read.
    first = asyncio.ensure_future(reader.read(65536))
    writer.write(head.encode())
    for byte in trickle:
        if first.done() or time.monotonic() - started > read_timeout + 10:
            break
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except OSError:
            break
        await asyncio.wait([first], timeout=pause)
    # A request sent in time waits for its answer like any other (behind a long prefill, say).
    wait = 600 if kind == "in-time" else read_timeout + 10
    try:
        data = await asyncio.wait_for(first, wait)
        data += await asyncio.wait_for(reader.read(), wait) if data else b""
    except (asyncio.TimeoutError, OSError):
        data = b""
    writer.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, time.monotonic() - started


async def slow_client(soak: Soak, port: int, read_timeout: float, deadline: float) -> None:
    """Slow headers, a slow body, and a slow body that arrives in time, in turn: the first two
    must be cut within the read timeout (plus a margin), the last served."""
    n = 0
    while time.monotonic() < deadline:
        kind = list(SLOW_EXPECTED)[n % 3]
        n += 1
        status, elapsed = await slow_request(port, kind, read_timeout)
        soak.statuses[f"slow-{kind} {status}"] += 1
        if status != SLOW_EXPECTED[kind] or (kind != "in-time" and elapsed > read_timeout + 10):
            soak.server_errors.append(
                f"slow {kind}: {status} after {elapsed:.1f} s, not {SLOW_EXPECTED[kind]}"
            )


def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_for_idle_pool(url: str, timeout: float = 120) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(url)
        idle = m["final_requests_running"] == 0 and m["final_requests_waiting"] == 0
        whole = m["final_kv_pages_free"] + m["final_kv_pages_cached"] == m["final_kv_pages_total"]
        if idle and whole and m["final_kv_integrity_ok"] == 1 and m["final_requests_in_flight"] == 0:
            return m
        if time.monotonic() > deadline:
            return m
        time.sleep(0.2)


def rss_mb(pid: int) -> dict[str, float]:
    main = psutil.Process(pid)
    procs = [main, *main.children(recursive=True)]
    return {f"{p.pid} {'server' if p is main else 'child'}": p.memory_info().rss / 2**20 for p in procs}


def start_server(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "final", "--port", str(port), "--log-level", "warning",
           "--max-running-requests", str(args.max_running), "--max-waiting-requests", str(args.max_waiting),
           "--num-pages", str(args.num_pages), "--read-timeout", str(args.read_timeout)] + (
               ["--model", args.model] if args.model else [])  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    sys.exit(f"the server did not start; see {log}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=600, help="seconds at saturation")
    p.add_argument("--concurrency", type=int, default=16, help="client workers (below the admission limit)")
    p.add_argument("--max-running", type=int, default=8, help="the server's --max-running-requests")
    p.add_argument("--max-waiting", type=int, default=24, help="the server's --max-waiting-requests")
    p.add_argument("--num-pages", type=int, default=4096, help="the server's --num-pages")
    p.add_argument("--model", default=None, help="default: the default model")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--long-prompt-tokens", type=int, default=2000, help="the long-prompt client's prompt")
    p.add_argument("--read-timeout", type=float, default=3, help="the server's --read-timeout")
    p.add_argument("--log", default="build/soak-server.log", help="the server's log")
    args = p.parse_args()
    if args.concurrency >= args.max_running + args.max_waiting:
        p.error("--concurrency must stay below --max-running + --max-waiting (no 503 expected)")
    log = ROOT / args.log
    log.parent.mkdir(parents=True, exist_ok=True)
    proc, url = start_server(args, log)
    try:
        limit = args.max_running + args.max_waiting
        warmup = Soak(url, limit, args.seed)  # the first requests allocate: RSS is read after them
        asyncio.run(run_workers(warmup, 4, time.monotonic() + 15))
        before_kv, before_rss = wait_for_idle_pool(url), rss_mb(proc.pid)
        soak = Soak(url, limit, args.seed + 1)
        start = time.monotonic()
        port = int(url.rsplit(":", 1)[1])
        deadline = start + args.duration
        extra = (long_prompt_client(soak, args.long_prompt_tokens, deadline),
                 slow_client(soak, port, args.read_timeout, deadline))  # fmt: skip
        asyncio.run(run_workers(soak, args.concurrency, deadline, extra))
        elapsed = time.monotonic() - start
        after_kv, after_rss = wait_for_idle_pool(url), rss_mb(proc.pid)
        alive = proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return report(soak, elapsed, before_kv, after_kv, before_rss, after_rss, alive)


def report(soak: Soak, elapsed: float, before_kv, after_kv, before_rss, after_rss, alive: bool) -> int:
    print(
        f"soak: {elapsed:.0f} s, {sum(soak.statuses.values())} requests, {soak.tokens} tokens streamed or generated"
    )
    for key, count in sorted(soak.statuses.items()):
        print(f"  {key:<16} {count}")
    pages = ("final_kv_pages_total", "final_kv_pages_free", "final_kv_pages_cached")
    print(
        "KV pool before: "
        + ", ".join(f"{k.removeprefix('final_kv_pages_')} {before_kv[k]:.0f}" for k in pages)
    )
    print(
        "KV pool after:  "
        + ", ".join(f"{k.removeprefix('final_kv_pages_')} {after_kv[k]:.0f}" for k in pages)
    )
    pool_back = (
        after_kv["final_kv_pages_free"] + after_kv["final_kv_pages_cached"]
        == after_kv["final_kv_pages_total"]
        and after_kv["final_kv_integrity_ok"] == 1
        and after_kv["final_requests_running"] == after_kv["final_requests_waiting"] == 0
    )
    print(f"KV pool back to baseline (free + cached == total, integrity ok, nothing running): {pool_back}")
    total_before, total_after = sum(before_rss.values()), sum(after_rss.values())
    print(f"RSS before: {total_before:.0f} MiB {_fmt(before_rss)}")
    print(f"RSS after:  {total_after:.0f} MiB {_fmt(after_rss)}  ({total_after - total_before:+.0f} MiB)")
    print(f"5xx or broken connections: {len(soak.server_errors)}")
    for line in soak.server_errors[:20]:
        print("  " + line)
    ok = alive and pool_back and not soak.server_errors
    print("soak: " + ("PASS" if ok else "FAIL") + ("" if alive else " (the server died)"))
    return 0 if ok else 1


def _fmt(rss: dict[str, float]) -> str:
    return "(" + ", ".join(f"{k}: {v:.0f}" for k, v in rss.items()) + ")"


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
