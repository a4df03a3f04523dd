"""How long one long prompt silences the streams already running (issue 29, item 1), on a live server.

    python -m scripts.bench_long_prompt_stall                                   # the default budget
    python -m scripts.bench_long_prompt_stall --server-args "--max-prefill-length 8192"  # the old one

It starts `python -m final` on loopback (the default model unless --model), opens --streams
greedy streams, waits until each has streamed a few tokens, then sends one completion of
--prompt-tokens token ids (inside the context) and waits for its answer. For every stream it
keeps the longest gap between two of its tokens while the long request was in flight: that gap is
the freeze a chat user sees. Prints the gaps (median and worst over the streams), the long
request's own latency, and the streams' gap before it arrived, and writes them as JSON (--out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from scripts.bench_server_online import stop, wait_ready

ROOT = Path(__file__).resolve().parents[1]


async def stream(
    http: httpx.AsyncClient, url: str, i: int, times: list[float], stop_at: asyncio.Event
) -> None:
    body = {"prompt": f"Story {i}: once upon a time", "max_tokens": 4000, "temperature": 0,
            "ignore_eos": True, "stream": True}  # fmt: skip
    async with http.stream("POST", f"{url}/v1/completions", json=body) as response:
        async for line in response.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                times.append(time.monotonic())
            if stop_at.is_set():
                return  # closing the stream aborts the request on the server


async def measure(url: str, streams: int, prompt_tokens: int) -> dict[str, float]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as http:
        times: list[list[float]] = [[] for _ in range(streams)]
        done = asyncio.Event()
        tasks = [asyncio.create_task(stream(http, url, i, times[i], done)) for i in range(streams)]
        while min(len(t) for t in times) < 5:  # every stream is decoding
            await asyncio.sleep(0.05)
        steady = [b - a for t in times for a, b in zip(t[-4:], t[-3:], strict=False)]
        long_body = {
            "prompt": [100 + i % 1000 for i in range(prompt_tokens)],
            "max_tokens": 2,
            "temperature": 0,
        }
        sent = time.monotonic()
        answer = await http.post(f"{url}/v1/completions", json=long_body)
        answered = time.monotonic()
        answer.raise_for_status()
        await asyncio.sleep(0.5)  # the streams' next tokens after it, so the last gap closes
        done.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    worst = []
    for t in times:
        inside = [a for a in t if sent <= a <= answered + 0.5]
        before = [a for a in t if a < sent][-1:]
        marks = before + inside
        worst.append(max((b - a for a, b in zip(marks, marks[1:], strict=False)), default=answered - sent))
    return {
        "stall_s_median": statistics.median(worst),
        "stall_s_max": max(worst),
        "long_request_s": answered - sent,
        "steady_gap_s_median": statistics.median(steady),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the default model")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=3000)
    p.add_argument(
        "--server-args", default="", help="flags for `python -m final`, e.g. '--max-prefill-length 8192'"
    )
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "final", "--port", str(port), "--log-level", "warning",
           *(["--model", args.model] if args.model else []), *shlex.split(args.server_args)]  # fmt: skip
    server = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, server, timeout_s=900)
        figures = asyncio.run(measure(url, args.streams, args.prompt_tokens))
    finally:
        stop(server)
    figures |= {"streams": args.streams, "prompt_tokens": args.prompt_tokens, "server_args": args.server_args}
    print(
        f"{args.streams} streams, one {args.prompt_tokens}-token prompt, server args '{args.server_args}': "
        f"longest gap per stream median {figures['stall_s_median']:.2f} s, worst {figures['stall_s_max']:.2f} s "
        f"(steady gap {figures['steady_gap_s_median'] * 1e3:.0f} ms); the long request took {figures['long_request_s']:.2f} s"
    )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
