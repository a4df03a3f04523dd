"""The API process behind the engine: the steps already waiting delivered at once, and each stream's
frames in hand written in one send (frontend/client.py, server/generation.py, server/streaming.py).

Past saturation (session 20's long load on the H200) a token waited about a second in the API
process: it still woke each stream once per step and wrote each frame with its own send. On time,
nothing changes: one step per turn of the event loop, each stream's frames a step apart."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from types import SimpleNamespace

import zmq

from final.core.sampling_params import SamplingParams
from final.engine.wire import FINISH_CODE, StepColumns, encode
from final.frontend import client as client_module
from final.frontend.client import AsyncEngineClient
from final.frontend.mailbox import Mailbox, TokenUpdate
from final.server import streaming
from final.server.generation import Job, submit
from final.server.metrics import Metrics

# ---------------------------------------------------------------------------------------------
# The receiving task


class Receiver:
    """The three calls the receiving task makes on its PULL socket, over a list of messages that
    are all already there (what a process that ran late finds)."""

    def __init__(self, messages: list[list]):
        self.messages = deque(messages)

    async def poll(self, timeout: int) -> bool:
        if not self.messages:
            await asyncio.Event().wait()  # nothing more will come: the test closes the client
        return True

    def recv_multipart(self, flags: int = 0, copy: bool = True) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        if self.messages:
            future.set_result(self.messages.popleft())
        else:
            future.set_exception(zmq.Again())
        return future

    def close(self, linger: int = 0) -> None:
        pass


def step(rid: int, token: int, tokens_at: float, last: bool = False) -> list:
    finish = FINISH_CODE["length"] if last else FINISH_CODE[None]
    return encode(StepColumns([rid], [1], [token], [finish], [0], tokens_at=tokens_at, texts=[f"t{token}"]))


def updates_per_wakeup(tokens_at: float, steps: int = 5, **client_args) -> list[list[str]]:
    """A request's mailbox read by its own task while the receiving task delivers `steps` steps
    that are all waiting, stamped `tokens_at`: the texts each wake-up of the request found."""

    async def scenario() -> list[list[str]]:
        engine = SimpleNamespace(info=SimpleNamespace(num_pages=8), is_alive=lambda: True)
        detok = SimpleNamespace(
            request_addr="inproc://catch-up-requests",
            output_addr="inproc://catch-up-out",
            is_alive=lambda: True,
        )
        client = AsyncEngineClient(engine, detok, **client_args)  # type: ignore[arg-type]
        rid, mailbox = client.submit([1, 2, 3], SamplingParams(max_tokens=steps))
        client.receiver.close(linger=0)
        client.receiver = Receiver([step(rid, t, tokens_at, t == steps - 1) for t in range(steps)])
        seen: list[list[str]] = []

        async def request() -> None:
            while sum(map(len, seen)) < steps:
                seen.append([u.text for u in await mailbox.get()])

        reader = asyncio.create_task(request())
        await asyncio.sleep(0)  # the request waits on its mailbox
        client.start()
        await reader
        await client.close()
        return seen

    return asyncio.run(scenario())


def test_on_time_each_step_wakes_the_request_apart():
    # Stamped in the future: never late, however slow this machine is.
    assert updates_per_wakeup(time.monotonic() + 60) == [["t0"], ["t1"], ["t2"], ["t3"], ["t4"]]


def test_behind_the_waiting_steps_reach_the_request_in_one_wakeup():
    assert updates_per_wakeup(time.monotonic() - 60, catch_up_s=0.05) == [["t0", "t1", "t2", "t3", "t4"]]


def test_the_bound_is_the_servers_and_off_by_default():
    # --stream-catch-up-ms: a step a minute old is not behind under a two-minute bound, nor with
    # the catching up off (0 on the command line, the default: None here).
    late = time.monotonic() - 60
    assert updates_per_wakeup(late) == [["t0"], ["t1"], ["t2"], ["t3"], ["t4"]]
    assert updates_per_wakeup(late, catch_up_s=120.0) == [["t0"], ["t1"], ["t2"], ["t3"], ["t4"]]
    assert updates_per_wakeup(late, catch_up_s=None) == [["t0"], ["t1"], ["t2"], ["t3"], ["t4"]]
    assert updates_per_wakeup(late, catch_up_s=30.0) == [["t0", "t1", "t2", "t3", "t4"]]


def test_a_turn_delivers_at_most_catch_up_steps(monkeypatch):
    monkeypatch.setattr(client_module, "CATCH_UP_STEPS", 2)
    late = time.monotonic() - 60
    assert updates_per_wakeup(late, catch_up_s=0.05) == [["t0", "t1"], ["t2", "t3"], ["t4"]]


# ---------------------------------------------------------------------------------------------
# A stream's writes


class Client:
    def __init__(self):
        self.next_rid = 0
        self.released: list[int] = []

    def submit(self, prompt_ids, params):
        self.next_rid += 1
        return self.next_rid, Mailbox()

    def release(self, rid, abort):
        self.released.append(rid)


def event(text: str) -> str | None:
    """An SSE event's text field, "DONE" for the end, None for a chunk without text."""
    data = text.removeprefix("data: ")
    return "DONE" if data == "[DONE]" else json.loads(data).get("text")


def writes_of(jobs: int, steps_in_hand: int, total: int) -> list[list[str]]:
    """The writes of a stream of `jobs` choices of `total` steps each, `steps_in_hand` of each
    choice's steps delivered before the stream reads, the rest one at a time: each write's events."""

    async def scenario() -> list[list[str]]:
        state = SimpleNamespace(client=Client(), metrics=Metrics())
        started = submit(state, [Job(i, [1, 2], SamplingParams(max_tokens=total)) for i in range(jobs)])

        def put(n: int) -> None:
            for one in started:
                finish = "length" if n == total - 1 else None
                one.mailbox.put(TokenUpdate([n], f"{one.job.index}:{n}", finish))

        for n in range(steps_in_hand):
            put(n)
        http = SimpleNamespace(is_disconnected=lambda: asyncio.sleep(0, result=False))
        frames = streaming.stream_sse(
            state, started, http, lambda i, out: [{"text": out.text}], [{"role": "assistant"}], None
        )
        writes, n = [], steps_in_hand
        async for write in frames:
            writes.append([event(e) for e in write.split("\n\n") if e])
            if len(writes) > 1 and n < total:  # after a write of tokens, the next step comes
                put(n)
                n += 1
        return writes

    return asyncio.run(scenario())


def test_frames_in_hand_leave_in_one_write_and_frames_that_come_apart_leave_apart():
    done = "DONE"
    behind = writes_of(jobs=1, steps_in_hand=3, total=4)
    assert behind == [[None], ["0:0", "0:1", "0:2"], ["0:3"], [done]]
    on_time = writes_of(jobs=1, steps_in_hand=1, total=3)
    assert on_time == [[None], ["0:0"], ["0:1"], ["0:2"], [done]]


def test_several_choices_in_hand_leave_in_one_write():
    writes = writes_of(jobs=2, steps_in_hand=2, total=3)
    assert sorted(writes[1]) == ["0:0", "0:1", "1:0", "1:1"]
    assert writes[0] == [None] and writes[-1] == ["DONE"]
