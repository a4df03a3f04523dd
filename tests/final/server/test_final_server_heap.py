"""Every process of the server freezes its start-up heap once it is ready (core/heap.py): the API
process, the detokenizer process and the engine process each log it, with the pause a full
garbage collection cost before and what it costs after. The real start-up path over the stand-in
engine (tests/fixtures/ticking_server.py); the log lines read by scripts/bench_gc_freeze.py."""

from __future__ import annotations

from scripts.bench_gc_freeze import PROCESSES, parse_log
from tests.fixtures.live_server import Server


def test_each_server_process_freezes_its_startup_heap(tiny_qwen3_dir, tmp_path):
    log_path = tmp_path / "server.log"
    server = Server(tiny_qwen3_dir, log_path, "--log-level", "info", module="tests.fixtures.ticking_server")
    try:
        text = log_path.read_text()  # the server answers only after the API process froze its heap
    finally:
        server.stop()
    frozen = parse_log(text)
    assert set(frozen) == set(PROCESSES), text[-3000:]
    for process, heap in frozen.items():
        assert heap["objects"] > 50_000, process  # torch alone brings more than that
        assert heap["after_ms"] < heap["before_ms"], process
