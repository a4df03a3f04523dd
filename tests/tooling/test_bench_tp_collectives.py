"""scripts/bench_tp_collectives.py, chapter 07's CPU experiment: a decode step's collectives at
each degree, counted on rank 0, into a result file of the benchmarks' schema."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.results_model import parse_result
from tests import ROOT


@pytest.mark.slow
def test_a_step_makes_two_all_reduces_a_layer_plus_one_and_none_at_tp1(tmp_path, tiny_qwen3_dir):
    layers = json.loads((tiny_qwen3_dir / "config.json").read_text())["num_hidden_layers"]
    cmd = [sys.executable, "-m", "scripts.bench_tp_collectives", "--tp", "1", "--tp", "2", "--repeats", "1",
           "--steps", "2", "--warmup", "1", "--batch", "2", "--prompt-len", "8",
           "--model", str(tiny_qwen3_dir), "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    tp1, tp2 = (
        parse_result(json.loads((tmp_path / f"stage07_collectives_tp{n}_cpu.json").read_text()), f"tp{n}")
        for n in (1, 2)
    )
    assert tp1.workload == tp2.workload == "tp-collectives" and tp2.config["tp"] == 2
    assert (
        tp2.metrics["all_reduce_per_step"] == 2 * layers + 1
    )  # o_proj and down_proj per layer, the embedding
    assert (tp2.metrics["all_gather_per_step"], tp2.metrics["broadcast_per_step"]) == (1, 1)
    assert tp2.metrics["step_message_per_step"] == 1
    assert tp2.metrics["collective_ms_per_step"] > 0
    assert all(
        tp1.metrics[k] == 0 for k in ("all_reduce_per_step", "all_gather_per_step", "collective_ms_per_step")
    )
