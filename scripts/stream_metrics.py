"""What the online benchmark computes from its streams (scripts/bench_online.py): latency
percentiles, throughput, and how smooth each stream was.

Per request the client keeps when it sent it and when each streamed chunk arrived (one token
each, as a rule), all on `time.monotonic()`. A server that sends `timing` with its chunks (final/,
stream_options.include_timing) adds, per chunk, when its token reached the engine's host and when
the server wrote it, on the same clock (CLOCK_MONOTONIC is one clock for every process of a
machine): a token's latency then splits into the engine's part and the frontend's.

    itl_ms           time between consecutive chunks of a request, at the client
    step_ms_p50      the engine's decode step at that load: the median gap between a request's
                     tokens on the engine's clock; for a server without timing, the median TPOT
                     (step_source(), in the result's config, says which)
    burst_share_half_step   share of the client's gaps under half that step: tokens sampled a step
                     apart that arrived together (the issue-27 goal: at most 5% below saturation)
    burst_share_2ms  share of the client's gaps under 2 ms
    smooth_streams_share    share of requests with at most 5% of their gaps under half the step
    engine_burst_share      share of the gaps on the engine's clock under half the step: tokens the
                     engine itself handed over close together (a step whose tokens reached the
                     host late, then the next on time), before any frontend (with timing only)
    decode_step_ms_p50  the engine's decode step proper: the median engine gap ending at a step that
                     computed no prompt tokens (a server whose timing says `decode_step`). Under
                     the mixed policy most steps at 32-64 req/s carry a prefill chunk, so the
                     median gap (step_ms_p50) is a mixed step's, and a decode step after one is
                     "under half a step" without any burst
    burst_share_half_decode_step, engine_burst_share_decode_step, smooth_streams_share_decode_step
                     the three shares above against half of decode_step_ms_p50: issue 27's
                     criterion ("half the engine's decode step at that load")
    burst_share_half_decode_step_steady  burst_share_half_decode_step over the load's steady part
                     only: gaps that end between the first request's send plus the median e2e
                     (by then the running set has filled) and the last request's send (after it
                     the batch drains); steady_window_s is that stretch's length. "At that load"
                     read literally: a run of 256 requests at 64/s is mostly ramp
    burst_share_local_step, engine_burst_share_local_step, smooth_streams_share_local_step
                     the same shares against half the engine's decode step at the moment of each
                     gap: the median decode-only step of the LOCAL_STEPS steps either side. A load's
                     batch ramps up and down, and its step with it; against one median for the
                     whole load, the quick steps of a small batch count as bursts
    frontend_burst_share    share of gaps at the client under half the same two tokens' gap at
                     the engine: the bursts the frontend made (with timing only)
    server_burst_share      the same, with the times the server wrote the chunks: bursts the server
                     made; what frontend_burst_share has beyond it came between the server's
                     write and the client's read (the socket, or a client that fell behind)
    ttft_server_ms   from sending a request to the server's writing its first token: the TTFT
                     without the client's own delay in reading it (with timing only)
    engine_itl_ms    the gaps on the engine's clock
    frontend_ms      a token's time from the engine's host to the client (detokenizer, API process,
                     HTTP); server_ms of it until the server wrote it, network_ms the rest;
                     server_ms is detok_ms (engine -> the detokenizer's send) + api_ms (-> the write)
    ingress_ms       a first token's wait split at the engine's door: from sending the request to
    engine_ttft_ms   the server's sending it on to the engine (HTTP, parsing, tokenizing), then to
    first_frontend_ms  the first token on the engine's host (waiting for a step, the prefill), then
                     to the client (with timing from a server that stamps `submitted`)
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

SMOOTH_MAX_BURSTS = 0.05  # a stream is smooth with at most this share of its gaps in bursts
LOCAL_STEPS = 8  # engine steps either side of a gap whose decode steps set its line (local_step_lines)


@dataclass
class Record:
    sent: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    engine_times: list[float] = field(default_factory=list)  # per chunk, when the server says
    written_times: list[float] = field(default_factory=list)  # per chunk: when the server wrote it
    detokenized_times: list[float] = field(default_factory=list)  # per chunk: when it left the detokenizer
    submitted: float = 0.0  # when the server sent the request to the engine (its first chunk says)
    decode_steps: list[bool | None] = field(default_factory=list)  # per chunk: a decode-only step's?
    completion_tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.sent

    @property
    def e2e(self) -> float:
        return self.chunk_times[-1] - self.sent

    def gaps_ms(self) -> list[float]:
        return _gaps(self.chunk_times)

    def timed(self) -> bool:
        return bool(self.chunk_times) and len(self.engine_times) == len(self.chunk_times)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def spread(name: str, values: list[float]) -> dict[str, float]:
    return {f"{name}_p50": percentile(values, 50), f"{name}_p90": percentile(values, 90),
            f"{name}_p99": percentile(values, 99)}  # fmt: skip


def _gaps(times: list[float]) -> list[float]:
    return [(b - a) * 1e3 for a, b in zip(times, times[1:], strict=False)]


def step_source(records: list[Record]) -> str:
    """Where step_ms_p50 comes from: the engine's clock, or (a server without timing) the TPOT."""
    return (
        "engine" if any(r.timed() and len(r.engine_times) > 1 for r in records if r.error is None) else "tpot"
    )


def shares_under(
    half: float, streams: list[list[float]], engine_gaps: list[float]
) -> tuple[float, float, float]:
    """Against a line of `half` ms: the share of the client's gaps under it, the share of streams
    with at most SMOOTH_MAX_BURSTS of their gaps under it, and the share of the engine's gaps under
    it (0 without them). `streams`: each stream's gaps at the client, none empty."""
    gaps = [g for stream in streams for g in stream]
    smooth = sum(sum(g < half for g in s) / len(s) <= SMOOTH_MAX_BURSTS for s in streams) / len(streams)
    engine = sum(g < half for g in engine_gaps) / len(engine_gaps) if engine_gaps else 0.0
    return sum(g < half for g in gaps) / len(gaps), smooth, engine


def smoothness(done: list[Record], tpot: list[float]) -> dict[str, float]:
    timed = [r for r in done if r.timed()]
    engine_gaps = [g for r in timed for g in _gaps(r.engine_times)]
    step = percentile(engine_gaps, 50) if engine_gaps else percentile(tpot, 50)
    streams = [gaps for gaps in (r.gaps_ms() for r in done) if gaps]
    if not streams or math.isnan(step):
        return {}
    under, smooth, engine = shares_under(step / 2, streams, engine_gaps)
    out: dict[str, float] = {
        "step_ms_p50": step,
        "burst_share_half_step": under,
        "burst_share_2ms": shares_under(2.0, streams, [])[0],
        "smooth_streams_share": smooth,
    }
    if engine_gaps:
        out["engine_burst_share"] = engine
        # Bursts the frontend made: a gap at the client under half the same two tokens' gap at the
        # engine (the engine's own uneven steps, a prefill among decodes, are not counted).
        pairs = [
            (c, e) for r in timed for c, e in zip(r.gaps_ms(), _gaps(r.engine_times), strict=True) if e > 0
        ]
        out["frontend_burst_share"] = sum(c < e / 2 for c, e in pairs) / len(pairs) if pairs else 0.0
        written = [
            (w, e)
            for r in timed
            if len(r.written_times) == len(r.engine_times)
            for w, e in zip(_gaps(r.written_times), _gaps(r.engine_times), strict=True)
            if e > 0
        ]
        if written:
            out["server_burst_share"] = sum(w < e / 2 for w, e in written) / len(written)
        out |= against_decode_step(streams, timed, engine_gaps)
        if "decode_step_ms_p50" in out:
            out |= steady_share(done, out["decode_step_ms_p50"] / 2)
        out |= against_local_step(timed)
        first = [(r.written_times[0] - r.sent) * 1e3 for r in timed if r.written_times]
        out |= spread("ttft_server_ms", first)
        frontend = [(c - e) * 1e3 for r in timed for c, e in zip(r.chunk_times, r.engine_times, strict=True)]
        server = [(w - e) * 1e3 for r in timed for w, e in zip(r.written_times, r.engine_times, strict=False)]
        network = [(c - w) * 1e3 for r in timed for c, w in zip(r.chunk_times, r.written_times, strict=False)]
        out |= spread("engine_itl_ms", engine_gaps) | spread("frontend_ms", frontend)
        out |= spread("server_ms", server) | spread("network_ms", network)
        # server_ms in two: engine -> detokenizer process (ZMQ and the step's text), detokenizer ->
        # the API's write (ZMQ, the API's event loop): which process falls behind under load.
        stamped = [
            r for r in timed if len(r.detokenized_times) == len(r.engine_times) and all(r.detokenized_times)
        ]
        if stamped:
            detok = [
                (d - e) * 1e3
                for r in stamped
                for d, e in zip(r.detokenized_times, r.engine_times, strict=True)
            ]
            api = [
                (w - d) * 1e3
                for r in stamped
                for w, d in zip(r.written_times, r.detokenized_times, strict=False)
            ]
            out |= spread("detok_ms", detok) | spread("api_ms", api)
        # The first token's wait in three: to the engine's door, in the engine, back to the client.
        doors = [r for r in timed if r.submitted]
        if doors:
            out |= spread("ingress_ms", [(r.submitted - r.sent) * 1e3 for r in doors])
            out |= spread("engine_ttft_ms", [(r.engine_times[0] - r.submitted) * 1e3 for r in doors])
            out |= spread("first_frontend_ms", [(r.chunk_times[0] - r.engine_times[0]) * 1e3 for r in doors])
    return out


def against_decode_step(
    streams: list[list[float]], timed: list[Record], engine_gaps: list[float]
) -> dict[str, float]:
    """The burst shares against half the engine's decode-only step (empty without `decode_step`
    in the timing)."""
    kinds = [r for r in timed if len(r.decode_steps) == len(r.engine_times)]
    decode_gaps = [
        g for r in kinds for g, kind in zip(_gaps(r.engine_times), r.decode_steps[1:], strict=True) if kind
    ]
    if not decode_gaps:
        return {}
    step = percentile(decode_gaps, 50)
    under, smooth, engine = shares_under(step / 2, streams, engine_gaps)
    return {
        "decode_step_ms_p50": step,
        "burst_share_half_decode_step": under,
        "engine_burst_share_decode_step": engine,
        "smooth_streams_share_decode_step": smooth,
    }


def steady_share(done: list[Record], half: float) -> dict[str, float]:
    """The share of the client's gaps under `half` ms among those ending in the load's steady
    part: from the first send plus the median e2e to the last send (empty if that is no stretch)."""
    sends = [r.sent for r in done]
    start, end = min(sends) + statistics.median(r.e2e for r in done), max(sends)
    gaps = [
        (b - a) * 1e3
        for r in done
        for a, b in zip(r.chunk_times, r.chunk_times[1:], strict=False)
        if start <= b <= end
    ]
    if end <= start or not gaps:
        return {}
    return {
        "burst_share_half_decode_step_steady": sum(g < half for g in gaps) / len(gaps),
        "steady_window_s": end - start,
    }


def local_step_lines(timed: list[Record], window: int = LOCAL_STEPS) -> dict[float, float]:
    """Each engine step (its time on the engine's clock) -> the median decode-only step among the
    `window` steps either side of it: the engine's decode step at that moment. Within one load the
    batch, and with it the step, ramps up as requests arrive and down as they finish; a step of 1.5
    ms at batch 10 is no burst beside the 4 ms of batch 60 later in the same load."""
    kinds: dict[float, bool] = {}
    for r in timed:
        flags = r.decode_steps if len(r.decode_steps) == len(r.engine_times) else [None] * len(r.engine_times)
        for t, kind in zip(r.engine_times, flags, strict=True):
            kinds[t] = kinds.get(t, False) or kind is None or bool(kind)  # no flag: any step counts
    steps = sorted(kinds)
    gaps = [((b - a) * 1e3, kinds[b]) for a, b in zip(steps, steps[1:], strict=False)]
    medians = local_medians(gaps, window)
    if not medians:
        return {}
    # Step j + 1 ends gap j; the first step ends none (no stream's second token is there).
    return dict(zip(steps, [medians[0], *medians], strict=True))


def local_medians(gaps: list[tuple[float, bool]], window: int = LOCAL_STEPS) -> list[float]:
    """Per gap (ms, whether it ends at a decode-only step): the median of the decode-only gaps among
    the `window` gaps either side of it, itself included, or of all of them where none is that near;
    empty without a decode-only gap. Also scripts/step_trace_report.py's line."""
    decode = [g for g, kind in gaps if kind]
    if not decode:
        return []
    overall = statistics.median(decode)
    out = []
    for j in range(len(gaps)):
        near = [g for g, kind in gaps[max(0, j - window) : j + window + 1] if kind]
        out.append(statistics.median(near) if near else overall)
    return out


def against_local_step(timed: list[Record]) -> dict[str, float]:
    """The burst shares against half the engine's decode step at the moment of each gap
    (local_step_lines), at the client and on the engine's clock; with timing only."""
    lines = local_step_lines(timed)
    if not lines:
        return {}
    client: list[bool] = []
    engine: list[bool] = []
    smooth = []
    for r in timed:
        flags = [
            (c < lines[t] / 2, e < lines[t] / 2)
            for c, e, t in zip(r.gaps_ms(), _gaps(r.engine_times), r.engine_times[1:], strict=True)
        ]
        if flags:
            client += [c for c, _ in flags]
            engine += [e for _, e in flags]
            smooth.append(sum(c for c, _ in flags) / len(flags) <= SMOOTH_MAX_BURSTS)
    if not client:
        return {}
    return {
        "burst_share_local_step": sum(client) / len(client),
        "engine_burst_share_local_step": sum(engine) / len(engine),
        "smooth_streams_share_local_step": sum(smooth) / len(smooth),
    }


def summarize(records: list[Record], duration: float) -> dict[str, float]:
    done = [r for r in records if r.error is None]
    ttft = [r.ttft * 1e3 for r in done]
    itl = [g for r in done for g in r.gaps_ms()]
    tpot = [
        (r.chunk_times[-1] - r.chunk_times[0]) * 1e3 / (r.completion_tokens - 1)
        for r in done
        if r.completion_tokens > 1
    ]
    e2e = [r.e2e * 1e3 for r in done]
    tokens = sum(r.completion_tokens for r in done)
    metrics: dict[str, float] = {
        "output_tok_per_s": tokens / duration,
        "ttft_ms_p50": percentile(ttft, 50),
        "itl_ms_p50": percentile(itl, 50),
        "ttft_ms_p99": percentile(ttft, 99),
        "itl_ms_p99": percentile(itl, 99),
        "ttft_ms_mean": statistics.fmean(ttft) if ttft else float("nan"),
        "ttft_ms_p90": percentile(ttft, 90),
        "itl_ms_mean": statistics.fmean(itl) if itl else float("nan"),
        "itl_ms_p10": percentile(itl, 10),
        "itl_ms_p90": percentile(itl, 90),
        "tpot_ms_mean": statistics.fmean(tpot) if tpot else float("nan"),
        "tpot_ms_p50": percentile(tpot, 50),
        "tpot_ms_p99": percentile(tpot, 99),
        "e2e_ms_p50": percentile(e2e, 50),
        "e2e_ms_p99": percentile(e2e, 99),
        "requests_per_s": len(done) / duration,
        "completed": len(done),
        "failed": len(records) - len(done),
        "output_tokens": tokens,
        "duration_s": duration,
        **smoothness(done, tpot),
    }
    # JSON has no NaN: a metric nobody measured (one-token answers have no ITL) is left out.
    return {k: v for k, v in metrics.items() if not math.isnan(v)}
