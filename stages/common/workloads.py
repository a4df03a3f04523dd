"""Seeded benchmark workloads: what requests arrive, when, and how much each one asks for.

Every generator is deterministic for a `seed` and takes the same three knobs:

- `vocab_size`: prompt token ids are drawn from [0, min(10000, vocab_size - 1)], so a workload
  fits any model (random ids need no tokenizer, and `ignore_eos` makes output lengths exact);
- `seed`: the whole workload (ids, lengths, arrival times) follows from it;
- `scale`: shrinks request counts and token lengths (not times) for CPU smoke runs; `scale=1` is
  the GPU benchmark, `scale=0.05` finishes in minutes on a laptop.

    offline        Nano-vLLM's benchmark: 256 requests at t=0, input and output lengths in [100, 1024]
    latency        batch 1: one 512-token prompt, 128 greedy tokens
    prefill        batch 1, prefill only: prompts of 512, 2048 and 8192 tokens, one after another,
                   one token each: TTFT and prompt tokens per second per length
    decode-step    a batch of B requests (512-token prompts) decoding together: the decode step's time
    shared-prefix  groups sharing a long system prompt, and multi-turn chat sessions
    no-sharing     shared-prefix's sizes with nothing shared: what a prefix cache costs when it never hits
    long-prompt    a few 16k-32k prompts arriving while many short requests decode
    long-context   64 prompts of 4k-16k tokens at t=0, decoding together: the KV cache's size and
                   attention's reads over it set the pace (the FP8 KV cache's workload)
    online         offline-like requests arriving as a Poisson process (the bench harness serves it
                   in-process at --workload-arg rate=R, default 16 per second; scripts/bench_online.py
                   sends it to a server)

A `WorkItem` with `session` set belongs to a multi-turn chat: its `turn` k > 0 is sent only when
turn k - 1 has finished (a user reads the answer before typing the next message), and then its
`arrival_s` is the delay after that moment rather than a time since the start.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from .sampling import SamplingParams

MAX_TOKEN_ID = 10_000  # Nano-vLLM's bench.py draws ids with randint(0, 10000)


@dataclass(frozen=True)
class WorkItem:
    arrival_s: float  # seconds after the start; for a session's later turn, after the previous turn ends
    prompt_ids: list[int]
    params: SamplingParams
    group: int | None = None  # requests with the same group share a prompt prefix
    session: int | None = None  # a multi-turn chat: its turns are sent one after another
    turn: int = 0  # position within the session

    @property
    def follows_previous_turn(self) -> bool:
        return self.session is not None and self.turn > 0


@dataclass
class Workload:
    name: str
    items: list[WorkItem]
    seed: int
    scale: float
    settings: dict[str, float | int | str | None] = field(default_factory=dict)  # the sizes it was built with

    @property
    def num_requests(self) -> int:
        return len(self.items)

    @property
    def prompt_tokens(self) -> int:
        return sum(len(item.prompt_ids) for item in self.items)

    @property
    def max_output_tokens(self) -> int:
        return sum(item.params.max_tokens for item in self.items)

    def head(self, n: int) -> Workload:
        """The first `n` requests: the same requests, fewer of them. For an engine that serves one
        request at a time, whose throughput does not depend on how many there are, but whose full
        run would take an hour. Generators list a chat's turns in order, so a later turn is never
        kept without the turns before it."""
        if n < 1:
            raise ValueError(f"a workload needs at least one request, got {n}")
        return Workload(
            self.name, self.items[:n], self.seed, self.scale, {**self.settings, "max_requests": n}
        )

    @property
    def longest_request(self) -> int:
        """Prompt plus output tokens of the largest request: what an engine's context must hold."""
        return max(len(item.prompt_ids) + item.params.max_tokens for item in self.items)


# ---------------------------------------------------------------------------------------------
# Helpers


def scaled(n: int, scale: float) -> int:
    """A count or length shrunk by `scale`, never below 1."""
    return max(1, round(n * scale))


def _random_ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    high = min(MAX_TOKEN_ID, vocab_size - 1)
    return [rng.randint(0, high) for _ in range(n)]


def _check(vocab_size: int, scale: float) -> None:
    if vocab_size < 2:
        raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")


def _poisson_arrivals(rng: random.Random, n: int, rate: float) -> list[float]:
    """Arrival times of a Poisson process: independent exponential gaps with mean 1/rate."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 requests per second, got {rate}")
    times, now = [], 0.0
    for _ in range(n):
        now += rng.expovariate(rate)
        times.append(now)
    return times


# ---------------------------------------------------------------------------------------------
# Generators


def offline(
    vocab_size: int, seed: int = 0, scale: float = 1.0, *, num_requests: int = 256,
    min_len: int = 100, max_len: int = 1024, temperature: float = 0.6,
) -> Workload:  # fmt: skip
    """Nano-vLLM's bench.py: every request at t=0; throughput is all that counts.

    At scale 1 with a vocabulary above 10000 the prompts and lengths are exactly Nano-vLLM's
    (same `random` calls in the same order with seed 0), so our numbers compare with theirs.
    """
    _check(vocab_size, scale)
    rng = random.Random(seed)
    n, lo = scaled(num_requests, scale), scaled(min_len, scale)
    hi = max(lo, scaled(max_len, scale))
    prompts = [_random_ids(rng, rng.randint(lo, hi), vocab_size) for _ in range(n)]
    outputs = [rng.randint(lo, hi) for _ in range(n)]
    items = [
        WorkItem(0.0, ids, SamplingParams(temperature=temperature, ignore_eos=True, max_tokens=out))
        for ids, out in zip(prompts, outputs, strict=True)
    ]
    settings = {"num_requests": n, "min_len": lo, "max_len": hi, "temperature": temperature}
    return Workload("offline", items, seed, scale, settings)


def latency(
    vocab_size: int, seed: int = 0, scale: float = 1.0, *, prompt_len: int = 512, output_len: int = 128
) -> Workload:
    """Batch 1: one prompt, greedy decode. TTFT measures prefill, the rest the decode step."""
    _check(vocab_size, scale)
    rng = random.Random(seed)
    p, o = scaled(prompt_len, scale), scaled(output_len, scale)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=o)
    items = [WorkItem(0.0, _random_ids(rng, p, vocab_size), params)]
    return Workload("latency", items, seed, scale, {"prompt_len": p, "output_len": o})


def prefill(
    vocab_size: int, seed: int = 0, scale: float = 1.0, *, lengths: str | int = "512,2048,8192",
    per_length: int = 5,
) -> Workload:  # fmt: skip
    """Batch-1 prefill: `per_length` prompts of each of `lengths` (comma-separated), the lengths
    interleaved, each sent when the previous one has finished (one chat session's turns) and
    asking for one greedy token, so each request's TTFT is one prefill step. Every prompt starts
    with its own index, so none shares a first page with another (no radix hit, any page size).
    """
    _check(vocab_size, scale)
    sizes = [scaled(int(n), scale) for n in str(lengths).split(",")]
    if not sizes or per_length < 1 or len(sizes) * per_length > min(MAX_TOKEN_ID, vocab_size - 1):
        raise ValueError(
            f"prefill wants lengths like 512,2048 and per_length >= 1, got {lengths!r} x {per_length}"
        )
    rng = random.Random(seed)
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=1)
    order = [n for _ in range(per_length) for n in sizes]
    items = [
        WorkItem(0.0, [k, *_random_ids(rng, n - 1, vocab_size)], params, session=0, turn=k)
        for k, n in enumerate(order)
    ]
    settings = {"lengths": ",".join(map(str, sizes)), "per_length": per_length}
    return Workload("prefill", items, seed, scale, settings)


def decode_step(
    vocab_size: int, seed: int = 0, scale: float = 1.0, *, batch: int = 64, prompt_len: int = 512,
    output_len: int = 128,
) -> Workload:  # fmt: skip
    """`batch` requests at t=0, each a `prompt_len`-token prompt and `output_len` greedy tokens.

    Once the last prompt is prefilled, every step decodes all `batch` requests until the first
    one finishes: the time of those steps is the decode step at batch size `batch`. `scale`
    shrinks the lengths, never the batch, which is what the workload measures.
    """
    _check(vocab_size, scale)
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    rng = random.Random(seed)
    p, o = scaled(prompt_len, scale), max(2, scaled(output_len, scale))  # two tokens: one step to time
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=o)
    items = [WorkItem(0.0, _random_ids(rng, p, vocab_size), params) for _ in range(batch)]
    return Workload("decode-step", items, seed, scale, {"batch": batch, "prompt_len": p, "output_len": o})


def shared_prefix(
    vocab_size: int, seed: int = 0, scale: float = 1.0, *, groups: int = 16, per_group: int = 16,
    prefix_len: int = 1024, suffix_len: int = 64, output_len: int = 64, sessions: int = 16, turns: int = 4,
    first_message_len: int = 256, reply_len: int = 128, message_len: int = 64, rate: float | None = None,
    share: bool = True,
) -> Workload:  # fmt: skip
    """Two kinds of reuse a prefix cache exploits.

    (a) `groups` x `per_group` requests: each group shares one `prefix_len`-token system prompt,
        then a unique `suffix_len`-token question; all arrive at t=0 (or at Poisson `rate`), in a
        shuffled order, as a server sees them.
    (b) `sessions` chats of `turns` turns: turn k's prompt is turn k-1's prompt, then a fixed
        random "assistant reply" of `reply_len` tokens, then a new `message_len`-token user
        message. The reply is fixed in advance (the real answer is unknown when the workload is
        built), so every turn's history is deterministic; turn k+1 is sent when turn k finishes.

    `share=False` draws every prompt afresh with the same lengths and order (see `no_sharing`).
    Counts and lengths scale with `scale`, except `turns`, and `per_group` stays at least 2: a smoke
    run must still share something.
    """
    _check(vocab_size, scale)
    rng = random.Random(seed)
    # At least two requests per group, or a smoke run would share nothing.
    n_groups, n_per_group = scaled(groups, scale), max(2, scaled(per_group, scale))
    n_sessions = scaled(sessions, scale)
    prefix, suffix, out = scaled(prefix_len, scale), scaled(suffix_len, scale), scaled(output_len, scale)
    first, reply, message = (
        scaled(first_message_len, scale),
        scaled(reply_len, scale),
        scaled(message_len, scale),
    )

    def ids(n: int) -> list[int]:
        return _random_ids(rng, n, vocab_size)

    grouped: list[WorkItem] = []
    for g in range(n_groups):
        system = ids(prefix)
        for _ in range(n_per_group):
            prompt = (system if share else ids(prefix)) + ids(suffix)
            grouped.append(WorkItem(0.0, prompt, _chat_params(out), group=g))
    # Order and clock come from their own stream, so no_sharing gets the same ones.
    clock = random.Random(f"arrivals-{seed}")
    clock.shuffle(grouped)
    if rate is not None:
        arrivals = _poisson_arrivals(clock, len(grouped), rate)
        grouped = [
            WorkItem(t, it.prompt_ids, it.params, group=it.group)
            for t, it in zip(arrivals, grouped, strict=True)
        ]

    chats: list[WorkItem] = []
    for s in range(n_sessions):
        history = ids(first)
        for k in range(turns):
            if k > 0:
                extended = len(history) + reply + message
                history = history + ids(reply) + ids(message) if share else ids(extended)
            chats.append(WorkItem(0.0, history, _chat_params(reply), session=s, turn=k))

    settings = {
        "groups": n_groups, "per_group": n_per_group, "prefix_len": prefix, "suffix_len": suffix,
        "output_len": out, "sessions": n_sessions, "turns": turns, "first_message_len": first,
        "reply_len": reply, "message_len": message, "rate": rate,
    }  # fmt: skip
    return Workload("shared-prefix" if share else "no-sharing", grouped + chats, seed, scale, settings)


def no_sharing(vocab_size: int, seed: int = 0, scale: float = 1.0, **sizes: float | int | None) -> Workload:
    """shared_prefix's request count, lengths, arrivals and turn order, with nothing shared: the
    price a prefix cache pays (matching, bookkeeping, evictions) when it never hits."""
    return shared_prefix(vocab_size, seed, scale, share=False, **sizes)  # type: ignore[arg-type]


def long_prompt(
    vocab_size: int, seed: int = 0, scale: float = 1.0, *, num_long: int = 4, long_min: int = 16_384,
    long_max: int = 32_768, num_short: int = 64, short_len: int = 64, short_output: int = 256,
    long_output: int = 16, stagger_s: float = 0.1,
) -> Workload:  # fmt: skip
    """Many short requests decoding at t=0; long prompts arrive at stagger_s, 2*stagger_s, ...

    Without chunked prefill, each long prompt's prefill is one huge step that stalls every
    decoding request: watch the short requests' ITL p99. `stagger_s` is not scaled: on a slower
    machine the short requests decode for longer, so the long prompts still land among them.
    """
    _check(vocab_size, scale)
    rng = random.Random(seed)
    lo = scaled(long_min, scale)
    hi = max(lo, scaled(long_max, scale))
    short_params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=scaled(short_output, scale))
    items = [
        WorkItem(0.0, _random_ids(rng, scaled(short_len, scale), vocab_size), short_params, group=0)
        for _ in range(scaled(num_short, scale))
    ]
    long_params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=scaled(long_output, scale))
    n_long = scaled(num_long, scale)
    for i in range(n_long):
        items.append(
            WorkItem(
                (i + 1) * stagger_s, _random_ids(rng, rng.randint(lo, hi), vocab_size), long_params, group=1
            )
        )
    settings = {
        "num_long": n_long, "long_min": lo, "long_max": hi, "num_short": scaled(num_short, scale),
        "short_len": scaled(short_len, scale), "short_output": scaled(short_output, scale),
        "long_output": scaled(long_output, scale), "stagger_s": stagger_s,
    }  # fmt: skip
    return Workload("long-prompt", items, seed, scale, settings)


def long_context(
    vocab_size: int, seed: int = 0, scale: float = 1.0, *, num_requests: int = 64, min_len: int = 4096,
    max_len: int = 16_384, output_len: int = 128,
) -> Workload:  # fmt: skip
    """`num_requests` prompts of `min_len` to `max_len` tokens (uniform), all at t=0, each asking for
    `output_len` greedy tokens. About 660k tokens of KV at full scale: on a small pool not all of
    them fit at once (preemptions), and a decode step reads every request's whole context, so the
    KV cache's dtype shows twice, in how many decode together and in how long a step takes."""
    _check(vocab_size, scale)
    rng = random.Random(seed)
    lo = scaled(min_len, scale)
    hi = max(lo, scaled(max_len, scale))
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=scaled(output_len, scale))
    n = scaled(num_requests, scale)
    items = [WorkItem(0.0, _random_ids(rng, rng.randint(lo, hi), vocab_size), params) for _ in range(n)]
    settings = {"num_requests": n, "min_len": lo, "max_len": hi, "output_len": params.max_tokens}
    return Workload("long-context", items, seed, scale, settings)


def online(
    rate: float, vocab_size: int, seed: int = 0, scale: float = 1.0, *, num_requests: int = 256,
    min_len: int = 100, max_len: int = 1024, temperature: float = 0.6,
) -> Workload:  # fmt: skip
    """The offline requests, arriving as a Poisson process at `rate` requests per second (for a
    server benchmark: TTFT and ITL percentiles depend on load, throughput saturates)."""
    base = offline(
        vocab_size, seed, scale, num_requests=num_requests, min_len=min_len, max_len=max_len,
        temperature=temperature,
    )  # fmt: skip
    # A separate stream for the clock, so the requests are the offline workload's, byte for byte.
    arrivals = _poisson_arrivals(random.Random(f"online-{seed}"), len(base.items), rate)
    items = [WorkItem(t, it.prompt_ids, it.params) for t, it in zip(arrivals, base.items, strict=True)]
    return Workload("online", items, seed, scale, {**base.settings, "rate": rate})


def _chat_params(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=max_tokens)


# A moderate load for the offline requests at scale 1 on one GPU: a Qwen3-0.6B-sized model serves
# about 30 of them per second there, so queues stay short and TTFT and ITL show the engine's pace.
DEFAULT_ONLINE_RATE = 16.0


def online_in_process(
    vocab_size: int,
    seed: int = 0,
    scale: float = 1.0,
    *,
    rate: float = DEFAULT_ONLINE_RATE,
    **sizes: float | int,
) -> Workload:
    """`online` by name for the bench harness, which feeds the arrivals to an engine in-process
    (a stage has no server): the harness's `drive` adds each request at its arrival time."""
    return online(rate, vocab_size, seed, scale, **sizes)


# The workloads the bench harness runs by name.
WORKLOADS: dict[str, Callable[..., Workload]] = {
    "offline": offline,
    "latency": latency,
    "prefill": prefill,
    "decode-step": decode_step,
    "shared-prefix": shared_prefix,
    "no-sharing": no_sharing,
    "long-prompt": long_prompt,
    "long-context": long_context,
    "online": online_in_process,
}


def make_workload(
    name: str, vocab_size: int, seed: int = 0, scale: float = 1.0, **settings: float | int | str
) -> Workload:
    """The workload `name`; `settings` override its keyword sizes (`batch=8` for decode-step)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return WORKLOADS[name](vocab_size, seed, scale, **settings)
