"""scripts/bench_api_cost.py: the server's CPU time per streamed frame and per request.

The figures are timings (not checked here); what is checked is what they are divided by: the
frames counted are every token of every stream (the stand-in engine gives each stream exactly
--tokens), each server process is found and measured, and the result follows the results schema
with the protocol and loop the server ran on.
"""

from __future__ import annotations

import json

from scripts import bench_api_cost as bench
from scripts.results_model import load_results


def test_counts_every_frame_of_every_stream_and_times_each_process(tmp_path, tiny_qwen3_dir):
    out = tmp_path / "results"
    argv = ["--model", str(tiny_qwen3_dir), "--streams", "3", "--tokens", "7", "--tick-ms", "5",
            "--arrivals", "4", "--prompt-tokens", "20", "--concurrency", "2", "--repeats", "2",
            "--out-dir", str(out), "--name", "final_api_cost_test", "--label", "test"]  # fmt: skip
    assert bench.main(argv) == 0
    result = json.loads((out / "final_api_cost_test.json").read_text())
    metrics = result["metrics"]
    assert metrics["streams_frames"] == 3 * 7 and metrics["arrivals_requests"] == 4
    for process in bench.PROCESSES:
        assert f"{process}_frame_us" in metrics and f"{process}_request_us" in metrics
    # A CPU time read from /proc in clock ticks (10 ms): four small requests may cost the API process
    # less than one tick, so zero is a valid reading here (it was, once in CI); negative is not.
    assert all(metrics[f"{p}_request_us"] >= 0 and metrics[f"{p}_frame_us"] >= 0 for p in bench.PROCESSES)
    assert len(result["runs"]) == 2 and result["label"] == "test"
    stack = bench.server_stack()
    assert result["config"]["http"] == stack["http"] and result["config"]["loop"] == stack["loop"]
    assert result["versions"]["uvicorn"] == stack["uvicorn"]
    (loaded,) = load_results(out)  # the schema the docs render from
    assert loaded.name == "final_api_cost_test"
