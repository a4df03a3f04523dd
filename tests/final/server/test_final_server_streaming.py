"""Smooth streams under load, without a GPU (issue 27): the real server, detokenizer process and
engine process loop on a stand-in engine that gives each of 64 concurrent requests one token every
10 ms, read as real HTTP streams. Tokens sampled 10 ms apart must reach their client about 10 ms
apart: the test fails if more than 5% of the gaps between a stream's frames are under 2 ms
(tokens that waited in the server, then left in a burst).

The client is a process of this loaded machine too: when it is descheduled, frames wait in its
socket and it reads them together, a burst the server never sent. So each frame also carries when
the server wrote it (stream_options.include_timing); a run whose bursts the server's own clock does
not show is the client's, and is measured again (three times at most). A server without that
timing (the code before issue 27) gets no second chance.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.fixtures.live_server import Server
from tests.fixtures.sse_reader import StreamRecord, gaps_ms, stream
from tests.fixtures.ticking_engine import TICK_S

STREAMS = 64
TOKENS = 100
BURST_MS = 2.0
MAX_BURST_SHARE = 0.05
ATTEMPTS = 3


@pytest.fixture(scope="module")
def server(tiny_qwen3_dir, tmp_path_factory):
    s = Server(tiny_qwen3_dir, tmp_path_factory.mktemp("ticking") / "server.log", "--served-model-name", "tiny",
               "--log-level", "warning", "--max-running-requests", "256", module="tests.fixtures.ticking_server")  # fmt: skip
    yield s
    s.stop()


def run_streams(server: Server, n: int, tokens: int) -> list[StreamRecord]:
    body = {"model": "tiny", "prompt": "one two three four five six seven eight", "max_tokens": tokens,
            "stream": True, "stream_options": {"include_timing": True}}  # fmt: skip

    async def all_of_them() -> list[StreamRecord]:
        return await asyncio.gather(
            *(stream("127.0.0.1", server.port, "/v1/completions", body) for _ in range(n))
        )

    return asyncio.run(all_of_them())


def server_gaps_ms(records: list[StreamRecord], clock: str) -> list[float] | None:
    """Gaps between a stream's frames by the server's `clock` ("engine", "sent"); None when the
    frames carry no timing."""
    out = []
    for record in records:
        times = [f.data["timing"][clock] for f in record.frames if "timing" in f.data]
        if len(times) != len(record.text_times()):
            return None
        out += [(b - a) * 1e3 for a, b in zip(times, times[1:], strict=False)]
    return out


def burst_share(gaps: list[float]) -> float:
    return sum(g < BURST_MS for g in gaps) / len(gaps)


def test_64_streams_arrive_a_step_apart_not_in_bursts(server):
    for _ in range(ATTEMPTS):
        records = run_streams(server, STREAMS, TOKENS)
        assert all(r.status == 200 and r.done for r in records)
        # Nothing lost: every token of every stream came, each step's in a frame of its own.
        assert [len(r.text_times()) for r in records] == [TOKENS] * STREAMS
        client = burst_share(gaps_ms(records))
        if client <= MAX_BURST_SHARE:
            return
        sent = server_gaps_ms(records, "sent")
        median = sorted(gaps_ms(records))[len(gaps_ms(records)) // 2]
        message = (
            f"{client:.1%} of the gaps between frames under {BURST_MS} ms at the client (median "
            f"{median:.2f} ms; the engine's step {TICK_S * 1e3:.0f} ms)"
        )
        assert sent is not None, f"{message}; the server says nothing of when it wrote them"
        assert burst_share(sent) <= MAX_BURST_SHARE, (
            f"{message}: {burst_share(sent):.1%} as the server wrote them"
        )
        # The server wrote them a step apart: this client was late (a loaded machine). Again.
    pytest.fail(f"the client read bursts in {ATTEMPTS} runs, though the server wrote the frames a step apart")


SATURATION_STREAMS, SATURATION_TICK_S = 256, 0.020  # 12,800 tokens a second: the saturation


@pytest.fixture(scope="module")
def saturated(tiny_qwen3_dir, tmp_path_factory):
    s = Server(tiny_qwen3_dir, tmp_path_factory.mktemp("saturated") / "server.log", "--served-model-name", "tiny",
               "--log-level", "warning", "--max-running-requests", "512", module="tests.fixtures.ticking_server",
               env={"TICK_S": str(SATURATION_TICK_S)})  # fmt: skip
    yield s
    s.stop()


def test_at_saturation_the_server_writes_each_stream_a_step_apart(saturated):
    """The issue's saturation (256 streams, a token each every 20 ms), more than the API process of
    this CPU can serve in time: its frames fall behind, and they must stay a step apart as it
    writes them (the steps wait in the socket, in order), never several of one stream at once.
    Judged by the server's own clock: on a 2-core machine the client reading 256 streams falls
    behind too, and its reading times say more about it than about the server."""
    records = run_streams(saturated, SATURATION_STREAMS, 40)
    assert all(r.status == 200 and r.done for r in records)
    assert [len(r.text_times()) for r in records] == [40] * SATURATION_STREAMS
    sent = server_gaps_ms(records, "sent")
    assert sent is not None, "the server says nothing of when it wrote its frames"
    assert burst_share(sent) <= MAX_BURST_SHARE, f"{burst_share(sent):.1%} of the frames written in bursts"


def test_timing_splits_a_tokens_latency(server):
    """The timing a frame carries is the engine's clock, then the detokenizer's, then the API's,
    in that order, and the engine's are a step apart (the stand-in's 10 ms clock)."""
    before = time.monotonic()
    records = run_streams(server, 4, 20)
    for record in records:
        timings = [f.data["timing"] for f in record.frames if "timing" in f.data]
        assert len(timings) == 20
        assert all(t["engine"] <= t["detokenized"] <= t["sent"] for t in timings)
        assert all(t["sent"] <= f.at for t, f in zip(timings, record.frames, strict=False))
        # The first frame also says when the server sent the request on to the engine: before
        # the engine had its token, after the client sent it; no later frame repeats it.
        assert [("submitted" in t) for t in timings] == [True] + [False] * 19
        assert before <= timings[0]["submitted"] <= timings[0]["engine"]
        # Whether the step was a decode step reaches the frame (the stand-in's ticks all are).
        assert all(t["decode_step"] is True for t in timings)
    engine = sorted(server_gaps_ms(records, "engine") or [])
    assert abs(engine[len(engine) // 2] - TICK_S * 1e3) < 1.0


CATCH_UP_TICK_S = 0.002  # 256 streams: 128,000 tokens a second, past what any one core writes alone


@pytest.fixture(scope="module")
def catching_up(tiny_qwen3_dir, tmp_path_factory):
    s = Server(tiny_qwen3_dir, tmp_path_factory.mktemp("catching-up") / "server.log", "--served-model-name", "tiny",
               "--log-level", "warning", "--max-running-requests", "512", "--stream-catch-up-ms", "1",
               module="tests.fixtures.ticking_server", env={"TICK_S": str(CATCH_UP_TICK_S)})  # fmt: skip
    yield s
    s.stop()


def test_with_catch_up_a_late_server_writes_steps_together_and_loses_none(catching_up):
    """--stream-catch-up-ms (off by default, above): far behind the engine, the API process hands
    each stream the steps waiting and the stream writes them together, which its own clock shows
    as frames written at once; every step still arrives once, in order, in a frame of its own."""
    records = run_streams(catching_up, SATURATION_STREAMS, 40)
    assert all(r.status == 200 and r.done for r in records)
    assert [len(r.text_times()) for r in records] == [40] * SATURATION_STREAMS
    engine = [[f.data["timing"]["engine"] for f in r.frames if "timing" in f.data] for r in records]
    assert all(
        all(a < b for a, b in zip(times, times[1:], strict=False)) for times in engine
    )  # one step a frame
    # Frames written in one send carry stamps microseconds apart; written a turn of the loop apart
    # (the default), a millisecond or more at this load (0% under 0.1 ms on the CPU box, where
    # catching up put about nine gaps in ten under it).
    sent = server_gaps_ms(records, "sent")
    assert sent is not None
    together = sum(g < 0.1 for g in sent) / len(sent)
    assert together > 0.25, f"{together:.1%} of a stream's frames written together: it hardly caught up"


def test_skip_special_tokens_false_writes_them_into_the_text(server):
    """vLLM's request field reaches the detokenizer process: the stand-in engine answers with its
    prompt's tokens, a special token among them, which the text leaves out by default and writes
    out with skip_special_tokens false, streamed and whole alike."""
    client = server.client()
    prompt = "one two<|im_end|> three"
    texts = {}
    for skip in (True, False):
        for streamed in (False, True):
            body = {"ignore_eos": True, "skip_special_tokens": skip}
            kwargs = {"model": "tiny", "prompt": prompt, "max_tokens": 6, "extra_body": body}
            if streamed:
                chunks = client.completions.create(stream=True, **kwargs)
                texts[skip, streamed] = "".join(c.choices[0].text for c in chunks if c.choices)
            else:
                texts[skip, streamed] = client.completions.create(**kwargs).choices[0].text
    assert "<|im_end|>" in texts[False, False] and "<|im_end|>" not in texts[True, False]
    assert texts[False, True] == texts[False, False] and texts[True, True] == texts[True, False]
    assert texts[False, False].replace("<|im_end|>", "") == texts[True, False]
