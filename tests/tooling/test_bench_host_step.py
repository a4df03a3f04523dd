"""scripts/bench_host_step.py: final/'s decode step on the CPU with the GPU's parts stood in.

The figures it prints are timings (not checked here); what is checked is that the steps it times
are the ones a GPU serves: decode steps of the whole batch through the graph runner, with the
FlashInfer backend's own planning code, and that the phases do not overlap.
"""

from __future__ import annotations

import json

from scripts import bench_host_step as bench


def test_times_decode_steps_through_the_graph_path_by_phase(tmp_path, capsys):
    out = tmp_path / "host.json"
    bench.main(["--batch", "3", "--steps", "4", "--warmup", "1", "--json", str(out)])
    (result,) = json.loads(out.read_text())["results"]
    phases = result["phases_ms"]
    assert result["batch"] == 3
    # The graph path ran (GraphRunner.run and stage_decode, not the eager prepare) and the
    # stand-in FlashInfer backend planned every step.
    for phase in ("schedule", "stage inputs", "graph replay", "attention plan", "sample", "collect"):
        assert phases[phase] > 0, phase
    # Phases are exclusive: what is left of the step for the frontend is never negative.
    assert phases["frontend (detokenize)"] >= 0
    # The engine's classes are themselves again: nothing timed outside the script's run.
    from final.engine.core import EngineCore

    assert EngineCore.step.__qualname__ == "EngineCore.step"
    table = capsys.readouterr().out
    assert "graph replay" in table and "batch 3" in table
