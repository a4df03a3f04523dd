"""Shutdown with requests in flight (issue 15, finding 2), asserted on the process tree.

SIGTERM or SIGINT to `python -m final` while streams run: every client gets a last error event
(`shutting_down`) and `[DONE]`, not a torn chunked read; the server exits 0; and no process of
its tree (the engine, multiprocessing's helper) is left behind. The same when the signal reaches
every process of the tree at once (a terminal's Ctrl-C, systemd's stop): the children wait for the
API process, which stops the engine with its Shutdown message. A hung engine (stopped with
SIGSTOP) is killed after the grace periods; a server killed outright takes its engine along.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

try:
    import httpx
except ImportError:  # the GPU host's offline kit ships httpx2 (what openai itself uses), not httpx
    import httpx2 as httpx  # type: ignore[no-redef]
import pytest

from tests.fixtures.live_server import Server, is_engine_process

psutil = pytest.importorskip("psutil", reason="the shutdown tests read the process tree with psutil")

# engine/process.py SHUTDOWN_GRACE_S (5 s) x 2 for a hung engine, the server's own graceful 5 s,
# and interpreter exits on a loaded 2-core machine; typically 2-5 s.
BOUND_S = 30


class Stream(threading.Thread):
    """One streamed completion read to its end: its data frames, or the error that cut it."""

    def __init__(self, url: str, prompt: str):
        super().__init__(daemon=True)
        self.url, self.prompt = url, prompt
        self.frames: list[str] = []
        self.error: Exception | None = None
        self.started = threading.Event()

    def run(self) -> None:
        body = {"prompt": self.prompt, "max_tokens": 4000, "ignore_eos": True, "stream": True}
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=120) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        self.frames.append(line[6:])
                        self.started.set()
        except Exception as err:
            self.error = err
        finally:
            self.started.set()


def start_streams(server: Server, n: int = 3) -> list[Stream]:
    streams = [Stream(server.url, f"Count to {i} thousand:") for i in range(n)]
    for s in streams:
        s.start()
    for s in streams:
        assert s.started.wait(120) and s.frames, f"no first frame: {s.error}"
    return streams


def process_tree(server: Server) -> list[psutil.Process]:
    main = psutil.Process(server.proc.pid)
    children = main.children(recursive=True)
    assert any(is_engine_process(c) for c in children), "no engine process"
    return [main, *children]


def assert_tree_gone(tree: list[psutil.Process], since: float) -> float:
    _, alive = psutil.wait_procs(tree, timeout=BOUND_S)
    elapsed = time.monotonic() - since
    assert not alive, f"left behind after {elapsed:.1f} s: {[(p.pid, p.cmdline()[:3]) for p in alive]}"
    return elapsed


def assert_ended_with_shutdown_error(streams: list[Stream]) -> None:
    for s in streams:
        s.join(BOUND_S)
        assert not s.is_alive() and s.error is None, f"torn stream: {s.error!r}"
        assert s.frames[-1] == "[DONE]", s.frames[-3:]
        error = json.loads(s.frames[-2])["error"]
        assert error["code"] == "shutting_down" and error["type"] == "server_error", error


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_with_streams_in_flight_ends_every_stream_and_process(default_model_dir, tmp_path, sig):
    server = Server(default_model_dir, tmp_path / "server.log", "--num-pages", "8192")
    try:
        tree = process_tree(server)
        streams = start_streams(server)
        since = time.monotonic()
        server.proc.send_signal(sig)
        assert_ended_with_shutdown_error(streams)
        elapsed = assert_tree_gone(tree, since)
        assert server.proc.wait(5) == 0, server.log()
        print(f"{sig.name}: every process gone after {elapsed:.1f} s")
    finally:
        server.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_whole_process_group_is_the_servers_to_act_on(default_model_dir, tmp_path, sig):
    """Red if the engine dies of the signal itself: then no Shutdown message stops it (its log line
    is missing), and a server that notices the loss first exits 3 as for a crash (an H200 did)."""
    server = Server(default_model_dir, tmp_path / "server.log", "--num-pages", "8192")
    try:
        tree = process_tree(server)
        streams = start_streams(server)
        since = time.monotonic()
        for process in tree:  # what killpg does, without a process group of the server's own
            process.send_signal(sig)
        assert_ended_with_shutdown_error(streams)
        assert_tree_gone(tree, since)
        assert server.proc.wait(5) == 0, server.log()
        log = server.log_path.read_text()
        assert "engine exiting: a Shutdown message arrived" in log, server.log()
        assert "the engine is lost" not in log, server.log()
    finally:
        server.stop()


def test_a_hung_engine_is_killed_within_the_bound(tiny_qwen3_dir, tmp_path):
    server = Server(tiny_qwen3_dir, tmp_path / "server.log")
    try:
        tree = process_tree(server)
        engine = next(p for p in tree[1:] if is_engine_process(p))
        engine.suspend()  # SIGSTOP: it reads nothing, answers nothing, cannot be terminated
        since = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert_tree_gone(tree, since)
        assert server.proc.wait(5) == 0, server.log()
        assert "did not stop within" in server.log()
    finally:
        server.stop()


def test_a_killed_server_takes_its_engine_along(tiny_qwen3_dir, tmp_path):
    server = Server(tiny_qwen3_dir, tmp_path / "server.log")
    try:
        tree = process_tree(server)
        since = time.monotonic()
        os.kill(server.proc.pid, signal.SIGKILL)  # no handler, no cleanup: only the kernel acts
        assert assert_tree_gone(tree, since) < 10
    finally:
        server.stop()
