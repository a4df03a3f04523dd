"""scripts/stream_metrics.py: how smooth the online benchmark's streams were, on streams whose
answers are worked out by hand."""

from __future__ import annotations

import pytest

from scripts.stream_metrics import Record, step_source, summarize


def record(engine_ms: list[float], client_ms: list[float], timed: bool = True) -> Record:
    r = Record(sent=0.0, chunk_times=[t / 1e3 for t in client_ms], completion_tokens=len(client_ms))
    if timed:
        r.engine_times = [t / 1e3 for t in engine_ms]
        r.written_times = [(t - 0.5) / 1e3 for t in client_ms]  # written half a millisecond before
    return r


STREAMS = [
    record([0, 10, 20, 30, 40], [1, 11, 21, 31.5, 31.6]),  # the frontend held two tokens together
    record([0, 10, 20, 21], [2, 12, 22, 23]),  # the engine's own short step: no frontend burst
    record([0, 10, 20], [1, 11, 18]),  # smooth: a frame 3 ms early is no burst
]


def test_bursts_are_counted_against_half_the_engines_step():
    m = summarize(STREAMS, duration=1.0)
    # Engine gaps: 10 (x8) and 1: the step is 10 ms. Client gaps: 10, 10, 10.5, 0.1 | 10, 10, 1 | 10, 7.
    assert m["step_ms_p50"] == pytest.approx(10.0)
    assert m["burst_share_half_step"] == pytest.approx(2 / 9)  # 0.1 and 1 are under 5 ms
    assert m["burst_share_2ms"] == pytest.approx(2 / 9)
    assert m["frontend_burst_share"] == pytest.approx(1 / 9)  # 1 ms at the client was 1 ms at the engine
    assert m["server_burst_share"] == pytest.approx(1 / 9)  # written 0.5 ms before each arrival: same gaps
    assert m["ttft_server_ms_p50"] == pytest.approx(0.5)  # first chunks written at 0.5, 1.5 and 0.5 ms
    assert m["smooth_streams_share"] == pytest.approx(1 / 3)
    assert m["network_ms_p50"] == pytest.approx(0.5)
    assert m["frontend_ms_p50"] == pytest.approx(1.0)  # client time minus engine time, per token
    assert m["itl_ms_p50"] == pytest.approx(10.0)
    assert step_source(STREAMS) == "engine"


def test_a_client_that_falls_behind_is_told_from_a_server_that_bursts():
    """Written a step apart, read together: the burst is the client's (or the socket's), not the server's."""
    late = record([0, 10, 20, 30], [1, 11, 40, 40.1])
    late.written_times = [0.0005, 0.0105, 0.0205, 0.0305]
    m = summarize([late], duration=1.0)
    assert m["frontend_burst_share"] == pytest.approx(1 / 3)
    assert m["server_burst_share"] == 0.0
    assert m["ttft_server_ms_p50"] == pytest.approx(0.5) and m["ttft_ms_p50"] == pytest.approx(1.0)


def test_without_timing_the_step_is_the_median_tpot():
    streams = [record([], [0, 10, 20, 20.5, 40], timed=False), record([], [0, 10, 20], timed=False)]
    m = summarize(streams, duration=1.0)
    assert step_source(streams) == "tpot"
    assert m["step_ms_p50"] == pytest.approx(10.0)  # TPOTs 10 and 10
    assert m["burst_share_half_step"] == pytest.approx(1 / 6)  # 0.5 ms among 10, 10, 0.5, 19.5, 10, 10
    assert "frontend_ms_p50" not in m and "frontend_burst_share" not in m


def test_the_servers_part_splits_into_the_detokenizer_and_the_api():
    """engine at 0 and 10 ms, out of the detokenizer 0.2 ms later, written by the API 3 ms after that:
    detok_ms 0.2, api_ms 3, and together server_ms; a frame without the stamp leaves the split out."""
    r = record([0, 10], [5, 15])
    r.detokenized_times = [0.0002, 0.0102]
    r.written_times = [0.0032, 0.0132]
    m = summarize([r], duration=1.0)
    assert m["detok_ms_p50"] == pytest.approx(0.2)
    assert m["api_ms_p50"] == pytest.approx(3.0)
    assert m["server_ms_p50"] == pytest.approx(3.2)
    r.detokenized_times = [0.0, 0.0]  # a server that does not stamp it
    assert "detok_ms_p50" not in summarize([r], duration=1.0)


def test_a_first_token_splits_at_the_engines_door():
    """Sent at 0; the server sends it on to the engine at 2 ms (the `submitted` stamp), its first
    token is on the engine's host at 30 ms and at the client at 31: ingress 2, engine 28, frontend 1.
    A request whose first frame had no stamp is left out of the split, not counted as 0."""
    r = record([30, 40], [31, 41])
    r.submitted = 0.002
    unstamped = record([5, 15], [6, 16])
    m = summarize([r, unstamped], duration=1.0)
    assert m["ingress_ms_p50"] == pytest.approx(2.0)
    assert m["engine_ttft_ms_p50"] == pytest.approx(28.0)
    assert m["first_frontend_ms_p50"] == pytest.approx(1.0)
    assert "ingress_ms_p50" not in summarize([unstamped], duration=1.0)


def test_the_engines_own_short_gaps_are_counted_apart():
    """Engine gaps 10, 10, 1 (a step whose tokens reached the host late, the next on time): one in
    three under half the 10 ms step at the engine. The client read them 10, 10, 9 apart (a frontend
    that evened them out): no burst at the client, none made by the frontend."""
    r = record([0, 10, 20, 21], [1, 11, 21, 30])
    m = summarize([r], duration=1.0)
    assert m["step_ms_p50"] == pytest.approx(10.0)
    assert m["engine_burst_share"] == pytest.approx(1 / 3)
    assert m["burst_share_half_step"] == 0.0
    assert m["frontend_burst_share"] == 0.0


def test_bursts_against_the_decode_step_leave_a_short_step_after_a_mixed_one_alone():
    """Steps with a prefill chunk take 10 ms, decode steps 4 ms: engine gaps 10, 4, 10, 4, the
    decode steps' gaps ending at the 2nd and 4th. The median gap (7 ms) would call a 3 ms client gap
    a burst; half the decode step (2 ms) does not. A 0.5 ms gap is a burst either way."""
    r = record([0, 10, 14, 24, 28], [1, 11, 14, 24.5, 25])
    r.decode_steps = [False, False, True, False, True]
    m = summarize([r], duration=1.0)
    # Client gaps: 10, 3, 10.5, 0.5. Engine gaps: 10, 4, 10, 4.
    assert m["step_ms_p50"] == pytest.approx(7.0)
    assert m["burst_share_half_step"] == pytest.approx(2 / 4)  # 3 and 0.5 under 3.5
    assert m["decode_step_ms_p50"] == pytest.approx(4.0)
    assert m["burst_share_half_decode_step"] == pytest.approx(1 / 4)  # only 0.5 under 2
    assert m["engine_burst_share_decode_step"] == 0.0
    assert m["smooth_streams_share_decode_step"] == 0.0  # a quarter of its gaps, more than 5%
    r.decode_steps = [None] * 5  # a server whose timing does not say
    assert "decode_step_ms_p50" not in summarize([r], duration=1.0)


def ramp(steps_ms: list[float], streams: int, client_delay_ms: float = 1.0) -> list[Record]:
    """`streams` requests that each get a token at every engine step (times from `steps_ms`, the
    gaps between steps), each arriving `client_delay_ms` after its step; decode-only steps."""
    times = [0.0]
    for gap in steps_ms:
        times.append(times[-1] + gap)
    out = []
    for _ in range(streams):
        r = record(times, [t + client_delay_ms for t in times])
        r.decode_steps = [True] * len(times)
        out.append(r)
    return out


def test_a_batch_ramping_up_is_no_burst_against_the_local_step():
    """20 quick steps of a small batch, then 40 of a full one: against the load's one median the
    quick ones are bursts; against the step of their moment they are not."""
    m = summarize(ramp([2.0] * 20 + [6.0] * 40, streams=3), duration=1.0)
    assert m["burst_share_half_step"] == pytest.approx(20 / 60)
    assert m["burst_share_local_step"] == 0.0 and m["engine_burst_share_local_step"] == 0.0
    assert m["smooth_streams_share_local_step"] == 1.0


def test_tokens_held_and_sent_in_pairs_are_bursts_against_the_local_step():
    """A steady 6 ms engine; the client gets every second token 0.1 ms after the one before."""
    streams = ramp([6.0] * 40, streams=2)
    for r in streams:
        engine_ms = [t * 1e3 for t in r.engine_times]
        r.chunk_times = [(t + (6.0 if i % 2 == 0 else 0.1)) / 1e3 for i, t in enumerate(engine_ms)]
    m = summarize(streams, duration=1.0)
    assert m["burst_share_local_step"] == pytest.approx(20 / 40)
    assert m["engine_burst_share_local_step"] == 0.0  # the engine's steps were steady
    assert m["smooth_streams_share_local_step"] == 0.0


def test_the_steady_share_leaves_out_the_ramp_and_the_drain():
    """Ten requests sent 20 ms apart. The first and the last each get ten tokens 1 ms apart (a
    lone request's quick steps, before the others arrive and after they left); the eight between
    get theirs 6 ms apart. The median e2e is 59 ms, so the steady part runs from 59 to 180 ms:
    every gap ending there is 6 ms. Over the whole load 18 of 90 gaps are under half the 6 ms step."""
    records = []
    for i in range(10):
        gap = 1.0 if i in (0, 9) else 6.0
        client = [20 * i + 5 + gap * k for k in range(10)]
        r = record([t - 1 for t in client], client)
        r.sent, r.decode_steps = 20 * i / 1e3, [True] * 10
        records.append(r)
    m = summarize(records, duration=1.0)
    assert m["decode_step_ms_p50"] == pytest.approx(6.0)
    assert m["burst_share_half_decode_step"] == pytest.approx(18 / 90)
    assert m["burst_share_half_decode_step_steady"] == 0.0
    assert m["steady_window_s"] == pytest.approx(0.180 - 0.059)
