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
