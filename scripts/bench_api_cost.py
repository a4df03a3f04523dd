"""The server's CPU cost per streamed frame and per request, process by process, on any machine.

    python -m scripts.bench_api_cost                       # 128 streams x 200 tokens, 128 arrivals
    python -m scripts.bench_api_cost --json out.json --repeats 3

Issue 27: under load on the H200 the API process fell behind the engine (at 64 requests a second a
token waited 196 ms at p90 between the engine and the server's write, while the engine's step was
4.7 ms). Whether a server keeps up is a question of CPU time: each frame a stream writes and each
request that arrives costs the API process (and the detokenizer process) some microseconds, and
when the sum per second reaches a core, frames queue. That cost does not depend on the GPU, so it
is measured here, on final/'s real server (HTTP, API process, detokenizer process, engine process
loop) over the stand-in engine of tests/fixtures/ticking_engine.py, whose step is a clock.

Two phases, each timed by the CPU time of each server process (user + system, all its threads),
read from /proc through psutil before and after, so that other work on the machine (the client
itself, on a small box) changes the figures little:

- `streams`: --streams concurrent streamed completions of --tokens tokens each, short prompts:
  the per-frame cost (`api_frame_us`, `detok_frame_us`, `engine_frame_us`);
- `arrivals`: --arrivals streamed completions of one token, prompts of --prompt-tokens tokens of
  text, sent --concurrency at a time: the per-request cost (`api_request_us`, ...): parsing,
  tokenizing, admission, the response's start and end.

A figure is the median over --repeats runs of the phase. The client is a bare asyncio HTTP/1.1
reader (one connection per request) so that it takes as little of the machine as it can. The
result (benchmarks/README.md's schema, `--out-dir`) records the HTTP protocol and event loop the
server ran on (httptools and uvloop when installed, else h11 and asyncio: uvicorn's own choice).
A per-request figure includes the connection's accept and close (the client opens one per request),
which cost far more on a sandboxed machine, whose system calls are slow, than on a GPU host.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from tests.fixtures.live_server import Server

PHASES = ("streams", "arrivals")
PROCESSES = ("api", "detok", "engine")


def start_server(model_dir: Path, tick_s: float, log_path: Path, extra: list[str]) -> Server:
    """final/'s server over the stand-in engine (tests/fixtures/ticking_engine.py), up and healthy."""
    flags = ["--log-level", "warning", "--max-running-requests", "4096", "--disable-log-requests", *extra]
    return Server(
        model_dir, log_path, *flags, env={"TICK_S": str(tick_s)}, module="tests.fixtures.ticking_server"
    )


def server_processes(server: Server) -> dict[str, psutil.Process]:
    """The API process (the server's own) and its children, the detokenizer and the engine."""
    api = psutil.Process(server.proc.pid)
    processes = {"api": api}
    for child in api.children(recursive=True):
        name = " ".join(child.cmdline()) + child.name()
        processes["detok" if "detok" in name else "engine"] = child
    return processes


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    """Each process's CPU time so far, user and system, all its threads."""
    return {role: sum(proc.cpu_times()[:2]) for role, proc in processes.items()}


async def stream_one(port: int, body: dict[str, Any]) -> int:
    """One streamed completion over its own connection; the number of SSE frames with text."""
    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(payload), payload))  # fmt: skip
    frames, tail = 0, b""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            status = head.split(b"\r\n", 1)[0].decode()
            raise RuntimeError(f"the server answered {status!r}")
        while data := await reader.read(1 << 16):
            text = tail + data
            frames += text.count(b'"text": ') - tail.count(b'"text": ')
            tail = text[-16:]
            if b"data: [DONE]" in text[-64:]:
                break
    finally:
        writer.close()
    return frames


async def run_phase(port: int, bodies: list[dict[str, Any]], concurrency: int) -> int:
    gate = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> int:
        async with gate:
            return await stream_one(port, body)

    return sum(await asyncio.gather(*(one(b) for b in bodies)))


def prompt_text(tokens: int) -> str:
    """About `tokens` tokens of plain words (the stand-in's output is the prompt's tokens again)."""
    words = "the quick brown fox jumps over a lazy dog while seven wise owls watch it".split()
    return " ".join(words[i % len(words)] for i in range(tokens))


def measure(
    server: Server, processes: dict[str, psutil.Process], phase: str, args: argparse.Namespace
) -> dict[str, float]:
    if phase == "streams":
        bodies = [{"prompt": prompt_text(16), "max_tokens": args.tokens, "stream": True, "ignore_eos": True,
                   "temperature": 0} for _ in range(args.streams)]  # fmt: skip
        concurrency, per = args.streams, "frame"
    else:
        bodies = [{"prompt": prompt_text(args.prompt_tokens), "max_tokens": 1, "stream": True,
                   "temperature": 0} for _ in range(args.arrivals)]  # fmt: skip
        concurrency, per = args.concurrency, "request"
    before, start = cpu_seconds(processes), time.perf_counter()
    frames = asyncio.run(run_phase(server.port, bodies, concurrency))
    wall, after = time.perf_counter() - start, cpu_seconds(processes)
    count = frames if per == "frame" else len(bodies)
    out = {f"{role}_{per}_us": (after[role] - before[role]) / count * 1e6 for role in before}
    out[f"{phase}_wall_s"] = wall
    out[f"{phase}_{per}s"] = count
    if phase == "streams":  # how far behind the stand-in's clock the whole phase ran
        out["streams_slip"] = wall / (args.tokens * args.tick_ms / 1e3)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model", type=Path, default=None, help="a model folder, for its tokenizer (default model)"
    )
    p.add_argument("--streams", type=int, default=128, help="concurrent streams in the streams phase")
    p.add_argument("--tokens", type=int, default=200, help="tokens per stream")
    p.add_argument("--tick-ms", type=float, default=10.0, help="the stand-in engine's decode step")
    p.add_argument("--arrivals", type=int, default=128, help="requests in the arrivals phase")
    p.add_argument("--prompt-tokens", type=int, default=560, help="their prompts' length (the online mean)")
    p.add_argument("--concurrency", type=int, default=16, help="arrivals in flight at once")
    p.add_argument("--repeats", type=int, default=3, help="runs of each phase; figures are medians")
    p.add_argument("--server-args", default="", help="more flags for the server")
    p.add_argument("--name", default=None, help="the result's name (default: final_api_cost_<device>)")
    p.add_argument("--label", default=None, help="a short row label for the tables")
    p.add_argument("--out-dir", type=Path, default=None, help="write the result JSON here")
    return p.parse_args(argv)


def server_stack() -> dict[str, str]:
    """What the server runs on in this Python: the HTTP protocol final/ picks (server/timeouts.py),
    the event loop uvicorn picks (uvloop when installed), and their versions."""
    import uvicorn

    from final.server.timeouts import timed_http_protocol

    stack = {"uvicorn": uvicorn.__version__}
    for dist in ("httptools", "uvloop"):
        if importlib.util.find_spec(dist) is not None:
            stack[dist] = importlib.metadata.version(dist)
    stack["http"] = "httptools" if "HttpTools" in timed_http_protocol(1.0).__name__ else "h11"
    stack["loop"] = "uvloop" if "uvloop" in stack else "asyncio"
    return stack


def result_json(args: argparse.Namespace, metrics: dict[str, float], runs: dict[str, list[float]]) -> dict:
    from stages.common.bench import script_result

    stack = server_stack()
    config = {
        "streams": args.streams, "tokens": args.tokens, "tick_ms": args.tick_ms, "arrivals": args.arrivals,
        "prompt_tokens": args.prompt_tokens, "concurrency": args.concurrency, "repeats": args.repeats,
        "model": Path(args.model).name, "http": stack["http"], "loop": stack["loop"],
        "server_args": args.server_args,
    }  # fmt: skip
    keys = [k for k in metrics if k.endswith("_us")] + [k for k in metrics if not k.endswith("_us")]
    from stages.common import hardware

    result = script_result(
        "scripts.bench_api_cost",
        None,
        name=args.name or f"final_api_cost_{hardware.device_tag()}",
        stage="final",
        workload="api-cost",
        metrics={k: metrics[k] for k in keys},
        config=config,
        runs=[{k: runs[k][i] for k in keys} for i in range(args.repeats)],
        **({"label": args.label} if args.label else {}),
    )
    # The HTTP stack's versions (uvicorn, httptools, uvloop) beside the usual ones.
    result["versions"] |= {k: v for k, v in stack.items() if k not in ("http", "loop")}
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from stages.common.default_model import ensure_default_model

        args.model = ensure_default_model()
    runs: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-api-cost-") as tmp:
        server = start_server(
            args.model, args.tick_ms / 1e3, Path(tmp) / "server.log", args.server_args.split()
        )
        try:
            processes = server_processes(server)
            warm_up = [{"prompt": "warm up", "max_tokens": 4, "stream": True}] * 4
            asyncio.run(run_phase(server.port, warm_up, 4))
            for _ in range(args.repeats):
                for phase in PHASES:
                    for key, value in measure(server, processes, phase, args).items():
                        runs.setdefault(key, []).append(value)
        finally:
            server.stop()
    metrics = {key: statistics.median(values) for key, values in runs.items()}
    for key, value in metrics.items():
        print(f"{key:28s} {value:10.1f}   (runs: {', '.join(f'{v:.1f}' for v in runs[key])})")
    if args.out_dir:
        from stages.common.bench import write_result

        print(f"-> {write_result(result_json(args, metrics, runs), args.out_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
