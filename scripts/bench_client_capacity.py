"""How many streamed tokens a second scripts/bench_online.py's client can read before it, not the
server, makes the bursts: a stand-in server that streams perfectly evenly, read by 1..N client
processes.

    python -m scripts.bench_client_capacity --streams 192 --step-ms 10 --tokens 200 --procs 1,2

The stand-in (a raw asyncio HTTP server in its own process, no framework) acts as an engine whose
decode step takes --step-ms: every step, each open stream gets one SSE chunk of final/'s form,
`timing` included, written at once. Its streams have no bursts by construction, so every gap the
client sees under half a step, and every millisecond between the server's write and the client's
read, is the client's (or the loopback socket's). --streams / --step-ms is the token rate asked of
the client: 192 streams at a 10 ms step is 19,200 tokens a second, about what the H200 streamed at
saturation (issue 27). The stand-in's own process must keep up too: each chunk's `engine` time
is when its step was due and `sent` when it was written, so "stand-in late" (server_ms) shows how
far the stand-in slipped; a result whose stand-in slipped says nothing about the client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time

from scripts import bench_online
from scripts.stream_metrics import summarize
from stages.common import workloads

FRAME = 'data: {{"id":"x","object":"text_completion","choices":[{{"index":0,"text":" a","finish_reason":null}}],"timing":{{"engine":{due:.6f},"sent":{now:.6f}}}}}\n\n'  # fmt: skip
LAST = 'data: {{"id":"x","object":"text_completion","choices":[],"usage":{{"prompt_tokens":1,"completion_tokens":{n},"total_tokens":{m}}}}}\n\ndata: [DONE]\n\n'  # fmt: skip


def chunk(text: str) -> bytes:
    body = text.encode()
    return b"%x\r\n%s\r\n" % (len(body), body)


class StandIn:
    """Streams one token per open request per step, like a batched decode."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.open: list[tuple[asyncio.StreamWriter, list[int], asyncio.Event]] = []

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):  # the client closed the connection
                return
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)  # fmt: skip
            body = json.loads(await reader.readexactly(length)) if length else {}
            if head.startswith(b"GET"):
                card = json.dumps({"data": [{"id": "stand-in", "vocab_size": 1000}]}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(card), card))  # fmt: skip
                await writer.drain()
                continue
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            done = asyncio.Event()
            self.open.append((writer, [int(body.get("max_tokens", 1)), int(body.get("max_tokens", 1))], done))
            await done.wait()

    async def steps(self) -> None:
        due = time.monotonic()
        while True:
            due += self.step_s
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            still = []
            for writer, left, done in self.open:
                writer.write(chunk(FRAME.format(due=due, now=now)))
                left[0] -= 1
                if left[0] == 0:
                    writer.write(chunk(LAST.format(n=left[1], m=left[1] + 1)) + b"0\r\n\r\n")
                    done.set()
                else:
                    still.append((writer, left, done))
            self.open = still


def run_stand_in(port: int, step_s: float, ready) -> None:  # noqa: ANN001
    async def main() -> None:
        stand_in = StandIn(step_s)
        await asyncio.start_server(stand_in.serve, "127.0.0.1", port)
        ready.set()
        await stand_in.steps()

    asyncio.run(main())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=192)
    p.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--procs", default="1,2", help="client process counts to try")
    p.add_argument("--port", type=int, default=19391)
    args = p.parse_args(argv)
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    server = context.Process(target=run_stand_in, args=(args.port, args.step_ms / 1e3, ready), daemon=True)
    server.start()
    ready.wait(30)
    url = f"http://127.0.0.1:{args.port}"
    load = workloads.online(float("inf"), 1000, 0, 1.0, num_requests=args.streams)
    for item in load.items:
        item.params.max_tokens = args.tokens
    print(f"{args.streams} streams x {args.tokens} tokens at a {args.step_ms} ms step: "
          f"{args.streams / args.step_ms * 1e3:,.0f} tokens/s asked of the client")  # fmt: skip
    for procs in (int(x) for x in args.procs.split(",")):
        records, duration = bench_online.run_sharded(url, "stand-in", load, "completions", None, True, procs)
        m = summarize(records, duration)
        print(
            f"client processes {procs}: {m['output_tok_per_s']:,.0f} tok/s read, gaps < half a step "
            f"{m['burst_share_half_step']:.1%} (server {m.get('server_burst_share', float('nan')):.1%}), "
            f"write->read p50 {m['network_ms_p50']:.2f} ms p99 {m['network_ms_p99']:.2f} ms, "
            f"TTFT p50 {m['ttft_ms_p50']:.1f} ms (at the server {m['ttft_server_ms_p50']:.1f} ms); "
            f"stand-in late p50 {m['server_ms_p50']:.2f} ms p99 {m['server_ms_p99']:.2f} ms",
            flush=True,
        )
    server.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
