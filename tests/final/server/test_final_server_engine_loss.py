"""A hung or dead engine (issue 29, items 2 and 3), against a live server.

- the engine stopped with SIGSTOP (a frozen process: its heartbeat falls silent) is noticed
  within --engine-silence-timeout: every request in flight ends with 503 `engine_dead` (a stream
  with that error event and [DONE]), with no internals in the message; the engine is killed, and
  the server drains and exits with status 3 for a supervisor to restart it, leaving no process;
- a step longer than the silence limit is no hang: the heartbeat beats beside it;
- the heartbeat logic itself, against a fake clock.
A killed engine is the `engine_dead` row of test_final_server_error_table.py; a lost
tensor-parallel rank is in test_final_tp.py.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
import time

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]
import pytest
import torch

from final.frontend import options as cli_args
from final.frontend.detokenizer_process import PROCESS_NAME as DETOKENIZER_NAME
from final.runtime.heartbeat import (
    BEAT_S,
    DEFAULT_SILENCE_S,
    DEFAULT_STEP_TIMEOUT_S,
    Heartbeat,
    Pulse,
    StallWatch,
)
from final.server.launch import ENGINE_LOST_EXIT
from final.server.timeouts import DEFAULT_READ_TIMEOUT_S
from tests.fixtures.live_server import Server, is_engine_process

psutil = pytest.importorskip("psutil", reason="the engine tests read the process tree with psutil")

BOUND_S = 30  # the silence limit, the drain (5 s at most) and interpreter exits on a loaded machine
INTERNALS = ("pid", "SIG", "Traceback", "RankFailure", "killed", "exit code")


def engine_process(server: Server) -> psutil.Process:
    children = psutil.Process(server.proc.pid).children(recursive=True)
    return next(p for p in children if is_engine_process(p))


class Request(threading.Thread):
    """One request read to its end: its status and body, or for a stream its data frames."""

    def __init__(self, url: str, path: str, body: dict):
        super().__init__(daemon=True)
        self.url, self.path, self.body = url, path, body
        self.status, self.frames, self.error = 0, [], None

    def run(self) -> None:
        try:
            with httpx.stream("POST", f"{self.url}{self.path}", json=self.body, timeout=120) as response:
                self.status = response.status_code
                for line in response.iter_lines():
                    if self.body.get("stream") and line.startswith("data: "):
                        self.frames.append(line[6:])
                    elif line:
                        self.frames.append(line)
        except Exception as err:
            self.error = err


def assert_engine_dead(request: Request) -> None:
    """A 503 engine_dead, or a stream that ends with that error event: no internals either way."""
    request.join(BOUND_S)
    assert not request.is_alive() and request.error is None, request.error
    if request.body.get("stream"):
        assert request.status == 200 and request.frames[-1] == "[DONE]", request.frames[-3:]
        error = json.loads(request.frames[-2])["error"]
    else:
        assert request.status == 503, request.frames
        error = json.loads(request.frames[-1])["error"]
    assert error["code"] == "engine_dead" and error["type"] == "server_error", error
    assert not any(word in error["message"] for word in INTERNALS), error


def test_a_stopped_engine_is_noticed_and_the_server_exits_for_its_supervisor(tiny_qwen3_dir, tmp_path):
    server = Server(tiny_qwen3_dir, tmp_path / "server.log", "--engine-silence-timeout", "2")
    try:
        tree = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
        engine = engine_process(server)
        engine.suspend()  # SIGSTOP: a frozen process, alive to the kernel, silent to us
        stopped = time.monotonic()
        user = [{"role": "user", "content": "Hello"}]
        requests = [
            Request(server.url, "/v1/chat/completions", {"messages": user, "max_tokens": 50, "stream": True}),
            Request(server.url, "/v1/completions", {"prompt": "The", "max_tokens": 50, "stream": True}),
            Request(server.url, "/v1/completions", {"prompt": "The", "max_tokens": 50}),
        ]
        for r in requests:
            r.start()
        for r in requests:
            assert_engine_dead(r)
        assert time.monotonic() - stopped < BOUND_S
        assert server.proc.wait(BOUND_S) == ENGINE_LOST_EXIT, server.log()
        _, alive = psutil.wait_procs(tree, timeout=BOUND_S)
        assert not alive, f"left behind: {[(p.pid, p.cmdline()[:3]) for p in alive]}"
        log = server.log()
        assert "no sign of life" in log and f"exiting with status {ENGINE_LOST_EXIT}" in log, log
    finally:
        server.stop()


def test_a_lost_detokenizer_is_a_lost_engine(tiny_qwen3_dir, tmp_path):
    """The server's text comes through its detokenizer process (issue 27): killed, every request
    in flight ends 503 engine_dead, the engine is stopped, and the server exits with status 3."""
    server = Server(tiny_qwen3_dir, tmp_path / "server.log")
    try:
        tree = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
        detok = next(p for p in tree if p.name() == DETOKENIZER_NAME)
        body = {"prompt": "The", "max_tokens": 100_000, "ignore_eos": True, "stream": True}
        streaming = Request(server.url, "/v1/completions", body)
        streaming.start()
        deadline = time.monotonic() + BOUND_S
        while len(streaming.frames) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling for the stream's first tokens
        assert streaming.frames, streaming.error
        detok.kill()
        assert_engine_dead(streaming)
        assert server.proc.wait(BOUND_S) == ENGINE_LOST_EXIT, server.log()
        _, alive = psutil.wait_procs(tree, timeout=BOUND_S)
        assert not alive, f"left behind: {[(p.pid, p.cmdline()[:3]) for p in alive]}"
        assert "detokenizer process stopped" in server.log()
    finally:
        server.stop()


def test_a_step_longer_than_the_silence_limit_is_no_hang(default_model_dir, tmp_path):
    """A prefill of thousands of tokens on a CPU takes seconds: the heartbeat beats beside it."""
    silence = 1.0
    server = Server(default_model_dir, tmp_path / "server.log", "--engine-silence-timeout", str(silence),
                    "--num-pages", "8192", "--log-level", "warning")  # fmt: skip
    try:
        for tokens in (1000, 3000, 7000):  # until one prefill outlasts the limit a few times over
            start = time.monotonic()
            body = {"prompt": [100 + i % 1000 for i in range(tokens)], "max_tokens": 1}
            response = httpx.post(f"{server.url}/v1/completions", json=body, timeout=600)
            assert response.status_code == 200, response.text
            if time.monotonic() - start > 3 * silence:
                break
        else:
            pytest.fail("no prefill outlasted the silence limit: the test proves nothing here")
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
        assert "engine is lost" not in server.log()
    finally:
        server.stop()
    assert server.proc.returncode == 0, server.log()


# ---------------------------------------------------------------------------------------------
# The heartbeat, without a server


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_watch_tells_a_silent_engine_and_a_hung_step_from_a_long_one():
    pulse, clock = Pulse.create(mp.get_context("spawn")), FakeClock()
    watch = StallWatch(pulse, silence_s=10, step_timeout_s=600, clock=clock)
    pulse.step_begins()  # a long step: the beats go on, the step does not end
    for _ in range(580):
        clock.now += 1
        pulse.beat()
        assert watch.check() is None, clock.now
    clock.now += 11  # the step still runs, and for this long nothing beat either
    assert "no sign of life for 11 s" in (watch.check() or "")
    for _ in range(11):  # it beats again, up to 600 s into the step (first seen at 1 s)
        pulse.beat()
        assert watch.check() is None, clock.now
        clock.now += 1
    pulse.beat()
    assert "one engine step has run for 601 s" in (watch.check() or "")
    pulse.step_ends()
    for _ in range(700):  # idle: no step, beats going on
        clock.now += 1
        pulse.beat()
        assert watch.check() is None
    pulse.step_begins()
    pulse.step_ends()
    pulse.step_begins()  # a new step: its own 600 s
    for _ in range(600):
        clock.now += 1
        pulse.beat()
        assert watch.check() is None
    unlimited = StallWatch(pulse, silence_s=10, step_timeout_s=0, clock=clock)
    clock.now += 10_000
    pulse.beat()
    assert unlimited.check() is None  # 0: no step limit


def test_the_heartbeat_beats_while_the_main_thread_computes():
    pulse = Pulse.create(mp.get_context("spawn"))
    heart = Heartbeat(pulse)
    heart.start()
    try:
        a = torch.randn(512, 512)
        start, beats = time.monotonic(), pulse.read()[0]
        while time.monotonic() - start < 8 * BEAT_S:  # a "step" of matmuls, no sleeps
            a = (a @ a).tanh()
        assert pulse.read()[0] - beats >= 3
    finally:
        heart.stop()


def test_the_command_line_defaults_are_the_modules():
    """args.py writes them out (so that --help imports neither torch nor uvicorn)."""
    assert cli_args.DEFAULT_SILENCE_S == DEFAULT_SILENCE_S
    assert cli_args.DEFAULT_STEP_TIMEOUT_S == DEFAULT_STEP_TIMEOUT_S
    assert cli_args.DEFAULT_READ_TIMEOUT_S == DEFAULT_READ_TIMEOUT_S
