"""scripts/bench_gc_freeze.py: one server start on the CPU gives a result the docs can render, with
each process's heap and its full collection before and after the freeze."""

from __future__ import annotations

import json

from scripts import bench_gc_freeze
from scripts.results_model import parse_result


def test_one_start_gives_a_result_per_process(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_RUN_ID", "call-3")
    assert bench_gc_freeze.main(["--repeats", "1", "--out-dir", str(tmp_path), "--name", "gc"]) == 0
    data = json.loads((tmp_path / "gc.json").read_text())
    parse_result(data, "gc.json")
    assert data["run_id"] == "call-3"
    for process in bench_gc_freeze.PROCESSES:
        metrics = {k: data["metrics"][f"{process}_{k}"] for k in ("objects", "before_ms", "after_ms")}
        assert metrics["objects"] > 50_000 and metrics["after_ms"] < metrics["before_ms"], (process, metrics)


def test_a_server_that_froze_nothing_is_an_error_not_a_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_gc_freeze, "parse_log", lambda text: {"api": {}})
    try:
        bench_gc_freeze.main(["--repeats", "1"])
    except SystemExit as err:
        assert "detokenizer" in str(err) and "engine" in str(err)
    else:
        raise AssertionError("a missing line must stop the benchmark")
