"""Online benchmark: Poisson arrivals against a running server; TTFT, ITL and throughput.

    python -m final --model /path/to/model &            # any OpenAI-compatible server
    python -m scripts.bench_online --url http://127.0.0.1:1919 --rates 8,32,64,inf --timing
    python -m scripts.bench_online --scale 0.02 --rates 2,inf   # a CPU smoke run in a minute

The workload is `online` from stages/common/workloads.py: the offline benchmark's requests
(random token ids, input and output lengths uniform in [100, 1024] at scale 1, `ignore_eos`,
temperature 0.6), arriving as a Poisson process at each rate (requests per second; `inf` sends
them all at once). Each request streams from /v1/completions. Per rate we measure

    ttft_ms     time from sending a request to its first streamed token
    itl_ms      time between consecutive streamed chunks of a request (one token each, as a rule)
    tpot_ms     per request, (last token - first token) / (tokens - 1)
    e2e_ms      time from sending a request to its last token
    output_tok_per_s, requests_per_s over the whole run
    burst_share_half_step, burst_share_2ms, smooth_streams_share, step_ms_p50: how smooth the
                streams were, and with --timing (final/'s per-chunk timing) the engine's and the
                frontend's share of each token's latency (scripts/stream_metrics.py says how)

and write one JSON result per rate into --out-dir (benchmarks/README.md's schema), named
`<name>_rate<R>`; `name` defaults to final_online_<device>. One warm-up request precedes each rate
and is not counted. A result carries $BENCH_RUN_ID as its `run_id`, as stages.common.bench's do.

Mini-SGLang's server (scripts/bench_server_online.py) takes neither token ids nor /v1/completions:
its /v1/chat/completions accepts a plain-text `prompt` (its own extension: no chat template) and
streams `delta.content` chunks without usage. `--api chat` speaks that form, and
`--prompt-text MODEL_DIR` sends every prompt as text that MODEL_DIR's tokenizer encodes to exactly
as many tokens as the workload's prompt (one space-led word token per id), checked before sending.
Both engines of a comparison get the same text, so each tokenizes the same prompts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import multiprocessing
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]


from scripts.stream_metrics import Record, step_source, summarize
from stages.common import hardware, workloads
from stages.common.bench import script_result, write_result

ROOT = Path(__file__).resolve().parents[1]

APIS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def chunk_text(chunk: dict[str, Any]) -> str:
    """The text of one streamed chunk: `text` for completions, `delta.content` for chat."""
    choice = chunk["choices"][0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


async def events(response: httpx.Response) -> AsyncIterator[tuple[float, dict[str, Any]]]:
    """The stream's data events, each with the time the read that completed it returned: the
    clock is read as the bytes arrive, not after the events before them were parsed (frames that
    arrived together keep one time, as they should)."""
    pending = b""
    async for piece in response.aiter_bytes():
        at = time.monotonic()
        *complete, pending = (pending + piece).replace(b"\r\n", b"\n").split(b"\n\n")
        for event in complete:
            for line in event.split(b"\n"):
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    yield at, json.loads(line[6:])


async def send(
    http: httpx.AsyncClient, url: str, model: str, item: workloads.WorkItem, record: Record,
    api: str = "completions", prompt: str | list[int] | None = None, timing: bool = False,
) -> None:  # fmt: skip
    options = {"include_usage": True, **({"include_timing": True} if timing else {})}
    body = {
        "model": model, "prompt": item.prompt_ids if prompt is None else prompt,
        "max_tokens": item.params.max_tokens, "temperature": item.params.temperature,
        "ignore_eos": item.params.ignore_eos, "stream": True, "stream_options": options,
    }  # fmt: skip
    token_chunks = 0  # a server without usage (Mini-SGLang) sends one chunk per token
    # time.monotonic(), not perf_counter(): the server's timing is on CLOCK_MONOTONIC
    record.sent = time.monotonic()
    try:
        async with http.stream("POST", f"{url}{APIS[api]}", json=body) as response:
            if response.status_code != 200:
                record.error = f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                return
            async for at, chunk in events(response):
                if "error" in chunk:
                    record.error = chunk["error"]["message"]
                    return
                if chunk.get("usage"):
                    record.completion_tokens = chunk["usage"]["completion_tokens"]
                if not chunk["choices"]:
                    continue
                if chunk["choices"][0].get("finish_reason") is None:
                    token_chunks += 1
                if chunk_text(chunk):
                    record.chunk_times.append(at)
                    if "timing" in chunk:  # final/'s stream_options.include_timing
                        record.engine_times.append(chunk["timing"]["engine"])
                        record.written_times.append(chunk["timing"]["sent"])
                        record.detokenized_times.append(chunk["timing"].get("detokenized", 0.0))
                        record.submitted = record.submitted or chunk["timing"].get("submitted", 0.0)
                        record.decode_steps.append(chunk["timing"].get("decode_step"))
    except httpx.HTTPError as err:
        record.error = f"{type(err).__name__}: {err}"
    if not record.completion_tokens:
        record.completion_tokens = token_chunks
    if not record.chunk_times and record.error is None:
        record.error = "no token streamed"


def word_tokens(tokenizer: Any) -> list[str]:
    """Words that the tokenizer encodes, space-led, as one token each: text built of them has
    exactly one token per word (a byte-level BPE splits before each space-led word)."""
    found = []
    for piece, token_id in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]):
        if re.fullmatch("\u0120[a-z]+", piece) and tokenizer.encode(" " + piece[1:]) == [token_id]:
            found.append(piece[1:])
    if not found:
        raise SystemExit("--prompt-text: this tokenizer has no space-led word tokens to build prompts of")
    return found


def text_prompts(tokenizer: Any, items: list[workloads.WorkItem]) -> list[str]:
    """Each prompt as text of exactly its number of tokens under `tokenizer` (checked)."""
    words = word_tokens(tokenizer)
    texts = ["".join(" " + words[i % len(words)] for i in item.prompt_ids) for item in items]
    for text, item in zip(texts, items, strict=True):
        got = len(tokenizer.encode(text))
        if got != len(item.prompt_ids):
            raise SystemExit(f"--prompt-text: a {len(item.prompt_ids)}-token prompt encodes to {got} tokens")
    return texts


async def run_rate(
    url: str, model: str, load: workloads.Workload, api: str = "completions",
    prompts: list[str] | None = None, timing: bool = False, start: float | None = None,
    warm_up: bool = True,
) -> tuple[list[Record], float]:  # fmt: skip
    """Send `load`'s requests at their arrival times after `start` (default: now, after one warm-up
    request); the records and the seconds from `start` to the last one's end."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    texts: list[str | None] = list(prompts) if prompts is not None else [None] * len(load.items)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits) as http:
        if warm_up:
            await send(http, url, model, load.items[0], Record(), api, texts[0], timing)
        records = [Record() for _ in load.items]
        begin = time.monotonic() if start is None else start

        async def at(item: workloads.WorkItem, record: Record, text: str | None) -> None:
            await asyncio.sleep(max(0.0, begin + item.arrival_s - time.monotonic()))
            await send(http, url, model, item, record, api, text, timing)

        await asyncio.gather(*(at(*job) for job in zip(load.items, records, texts, strict=True)))
        return records, time.monotonic() - begin


# --8<-- [start:client-procs]
# One Python client reading every stream is a bottleneck of its own: httpx parses each SSE chunk
# in Python, and at the H200's 12,000-18,000 streamed tokens a second one event loop falls behind,
# so tokens the server wrote a step apart reach it together (a burst the server did not make) and
# every request's first token waits in its queue. --client-procs spreads the requests over
# processes; CLOCK_MONOTONIC is one clock for all of them, and all start from one instant.
def default_client_procs() -> int:
    """A quarter of the host's cores, 1 to 8: the rest are the server's (engine, detokenizer, API)."""
    return max(1, min(8, (os.cpu_count() or 1) // 4))


def shards(n: int, procs: int) -> list[list[int]]:
    """Request indices per client process, round-robin: each gets every procs-th arrival."""
    return [list(range(k, n, procs)) for k in range(procs) if k < n]


def _client_proc(shard, url, model, load, api, prompts, timing, ready, go, start, out) -> None:  # noqa: ANN001
    ready.put(shard)
    go.wait()
    records, _ = asyncio.run(
        run_rate(url, model, load, api, prompts, timing, start=start.value, warm_up=False)
    )
    out.put((shard, records))


async def _warm_up(url: str, model: str, item: workloads.WorkItem, api: str, prompt: str | None, timing: bool) -> None:  # fmt: skip
    async with httpx.AsyncClient(timeout=httpx.Timeout(None)) as http:
        await send(http, url, model, item, Record(), api, prompt, timing)


def run_sharded(
    url: str,
    model: str,
    load: workloads.Workload,
    api: str,
    prompts: list[str] | None,
    timing: bool,
    procs: int,
) -> tuple[list[Record], float]:
    """run_rate over `procs` processes (one: in this one); the records in the workload's order."""
    if procs <= 1:
        return asyncio.run(run_rate(url, model, load, api, prompts, timing))
    asyncio.run(_warm_up(url, model, load.items[0], api, prompts[0] if prompts else None, timing))
    context = multiprocessing.get_context("spawn")  # no event loop or client state inherited
    ready, out, go, start = context.Queue(), context.Queue(), context.Event(), context.Value("d", 0.0)
    parts = shards(len(load.items), procs)
    workers = []
    for shard, idx in enumerate(parts):
        part = dataclasses.replace(load, items=[load.items[i] for i in idx])
        texts = [prompts[i] for i in idx] if prompts is not None else None
        args = (shard, url, model, part, api, texts, timing, ready, go, start, out)
        workers.append(context.Process(target=_client_proc, args=args, daemon=True))
        workers[-1].start()
    for _ in workers:
        ready.get(timeout=120)
    start.value = time.monotonic() + 0.2  # every process waits on `go`: they all count from here
    go.set()
    got = dict(out.get() for _ in workers)  # before join(): a child exits once its queue is drained
    for worker in workers:
        worker.join()
    records: list[Record] = [Record() for _ in load.items]
    for shard, idx in enumerate(parts):
        for i, record in zip(idx, got[shard], strict=True):
            records[i] = record
    end = max((r.chunk_times[-1] for r in records if r.chunk_times), default=start.value)
    return records, end - start.value


# --8<-- [end:client-procs]


def rate_label(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default="http://127.0.0.1:1919", help="the server's base URL")
    p.add_argument(
        "--rates", default="8,32,64,inf", help="comma-separated request rates per second; inf: all at once"
    )
    p.add_argument(
        "--scale", type=float, default=1.0, help="shrinks request count and lengths (0.02 for a CPU)"
    )
    p.add_argument("--num-requests", type=int, default=None, help="requests per rate (default: 256 x scale)")
    p.add_argument("--seed", type=int, default=0, help="the workload's seed")
    p.add_argument(
        "--out-dir", type=Path, default=ROOT / "benchmarks" / "results", help="where the JSON results go"
    )
    p.add_argument("--name", default=None, help="result name prefix (default: final_online_<device>)")
    p.add_argument("--stage", default="final", help="the `stage` recorded in the results")
    p.add_argument(
        "--api", default="completions", choices=sorted(APIS),
        help="completions: /v1/completions; chat: /v1/chat/completions with a text `prompt` (Mini-SGLang)",
    )  # fmt: skip
    p.add_argument(
        "--prompt-text", type=Path, default=None, metavar="MODEL_DIR",
        help="send prompts as text of the same token counts under this folder's tokenizer",
    )  # fmt: skip
    p.add_argument(
        "--server-args", default="",
        help="the flags the server was started with beyond the comparison's (recorded in the results' config)",
    )  # fmt: skip
    p.add_argument(
        "--timing", action="store_true",
        help="ask for final/'s per-chunk timing (stream_options.include_timing): the engine's and the "
        "frontend's share of each token's latency",
    )  # fmt: skip
    p.add_argument(
        "--client-procs", type=int, default=default_client_procs(),
        help="client processes the requests are spread over (default: a quarter of the cores, 1 to 8)",
    )  # fmt: skip
    args = p.parse_args(argv)
    if args.api == "chat" and args.prompt_text is None:
        p.error("--api chat sends text prompts: give --prompt-text MODEL_DIR")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rates = [float(r) for r in args.rates.split(",")]
    model_card = httpx.get(f"{args.url}/v1/models", timeout=30).json()["data"][0]
    model, vocab = model_card["id"], int(model_card.get("vocab_size") or workloads.MAX_TOKEN_ID + 1)
    info = hardware.describe()
    device = (info["gpu"] or "cpu").lower().replace("nvidia ", "").replace(" ", "-")
    name = args.name or f"final_online_{device}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = None
    if args.prompt_text is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(args.prompt_text))
    status = 0
    for rate in rates:
        wanted = args.num_requests or workloads.scaled(256, args.scale)
        # The workload scales its request count; ask for enough, then keep the first `wanted`.
        load = workloads.online(
            rate, vocab, args.seed, args.scale, num_requests=math.ceil(wanted / args.scale)
        )
        load.items = load.items[:wanted]
        prompts = text_prompts(tokenizer, load.items) if tokenizer is not None else None
        procs = max(1, min(args.client_procs, len(load.items)))
        records, duration = run_sharded(args.url, model, load, args.api, prompts, args.timing, procs)
        metrics = summarize(records, duration)
        failures = [r.error for r in records if r.error]
        result = script_result(
            "scripts.bench_online",
            argv,
            name=f"{name}_rate{rate_label(rate)}",
            stage=args.stage,
            workload="online",
            metrics=metrics,
            config={
                "rate": rate_label(rate),
                "scale": args.scale,
                "num_requests": len(load.items),
                "seed": args.seed,
                "model": model,
                "api": args.api,
                "prompt": "text" if tokenizer is not None else "ids",
                "step_source": step_source(records),
                "client_procs": procs,
                **({"server_args": args.server_args} if args.server_args else {}),
                **{k: v for k, v in load.settings.items() if k != "rate"},
            },  # fmt: skip
        )
        path = write_result(result, args.out_dir)
        print(
            f"rate {rate_label(rate):>5}: {metrics['completed']:.0f}/{len(records)} ok, "
            f"{metrics.get('output_tok_per_s', 0):.1f} tok/s, TTFT p50 {metrics.get('ttft_ms_p50', float('nan')):.1f} ms, "
            f"ITL p50 {metrics.get('itl_ms_p50', float('nan')):.2f} ms, "
            f"bursts {metrics.get('burst_share_half_step', float('nan')):.1%} of gaps under half the "
            f"{metrics.get('step_ms_p50', float('nan')):.2f} ms step -> {path}",
            flush=True,
        )
        if failures:
            print(f"  {len(failures)} failed, e.g. {failures[0]}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
