"""scripts/bench_graph_launch.py's meter, on a fake replay and a fake stream (the script itself needs
a CUDA GPU)."""

from __future__ import annotations

import pytest

from scripts.bench_graph_launch import LaunchMeter


def test_the_meter_counts_launches_that_find_the_gpu_drained():
    idle = iter([True, False, False, True])
    meter = LaunchMeter(lambda: next(idle))
    calls = []
    replay = meter.wrap(lambda graph: calls.append(graph))
    for graph in "abcd":
        replay(graph)
    assert calls == list("abcd"), "every replay still runs, in order"
    summary = meter.summary()
    assert summary["launches"] == 4
    assert summary["drained_share"] == pytest.approx(0.5)
    assert summary["launch_us_p50"] >= 0.0
    meter.reset()
    assert meter.summary() == {"launches": 0}


def test_the_rows_become_one_result_with_a_metric_per_figure_and_batch(monkeypatch):
    """The docs quote the launch figures by macro, so they live in a result file of the schema:
    one metric per (figure, batch size), the run id of the call."""
    from scripts.bench_graph_launch import as_result
    from scripts.results_model import parse_result
    from stages.common import hardware

    monkeypatch.setattr(hardware, "device_tag", lambda device="auto": "h100")
    monkeypatch.setenv("BENCH_RUN_ID", "call-7")
    rows = [{"batch": 1, "launches": 127, "launch_us_p50": 11.7, "drained_share": 0.0079},
            {"batch": 64, "launches": 127, "launch_us_p50": 21.3, "drained_share": 0.0}]  # fmt: skip
    result = as_result(rows, "checkpoints/qwen3-0.6b-random", "fi", 128)
    assert result["name"] == "final_graph_launch_h100" and result["run_id"] == "call-7"
    assert result["metrics"] == {
        "launches_b1": 127, "launch_us_p50_b1": 11.7, "drained_share_b1": 0.0079,
        "launches_b64": 127, "launch_us_p50_b64": 21.3, "drained_share_b64": 0.0,
    }  # fmt: skip
    assert result["config"]["model"] == "qwen3-0.6b-random"
    assert parse_result(result, result["name"]).metrics["launch_us_p50_b64"] == 21.3
