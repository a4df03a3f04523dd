"""scripts/bench_versus.py: final/ and Mini-SGLang measured by the same code in one call, one JSON
with both figures and ratios that read "above 1: final/ is ahead". On the CPU, final/ runs for real
on a tiny checkpoint and Mini-SGLang is the stand-in of tests/tooling/test_bench_peer.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import bench_versus
from scripts.results_model import parse_result
from tests.fixtures.tiny_models import make_tiny_checkpoint
from tests.stage_list import ROOT
from tests.tooling.test_bench_peer import stand_in_peer


def test_ratios_say_final_is_ahead_above_one() -> None:
    runs = {
        "final": {"offline": [{"metrics": {"output_tok_per_s": 300.0}}, {"metrics": {"output_tok_per_s": 100.0}},
                              {"metrics": {"output_tok_per_s": 200.0}}],
                  "latency": [{"metrics": {"decode_step_ms": 2.0}}, {"metrics": {"decode_step_ms": 2.5}},
                              {"metrics": {"decode_step_ms": 1.5}}]},
        "mini-sglang": {"offline": [{"metrics": {"output_tok_per_s": 100.0}}],
                        "latency": [{"metrics": {"decode_step_ms": 3.0}}]},
        "final-base": {"offline": [{"metrics": {"output_tok_per_s": 160.0}}],
                       "latency": [{"metrics": {"decode_step_ms": 2.5}}]},
    }  # fmt: skip
    kernels = {
        "final": [{"batch": 1, "temperature": 0.0, "gpu_us_per_step": 1500.0}],
        "mini-sglang": [{"batch": 1, "temperature": 0.0, "gpu_us_per_step": 1800.0}],
        "final-base": [{"batch": 1, "temperature": 0.0, "gpu_us_per_step": 2000.0}],
    }
    out = bench_versus.assemble(runs, kernels)
    assert out["offline"]["final"] == 200.0 and out["offline"]["ratio"] == 2.0  # the median, over theirs
    assert out["latency"]["ratio"] == 1.5  # a shorter step is ahead: theirs over ours
    assert out["offline"]["vs_base"] == 1.25 and out["latency"]["vs_base"] == 1.25  # what the change bought
    assert out["kernels"][0]["gpu_us_ratio"] == pytest.approx(1.2)
    metrics = bench_versus.flat_metrics(out)
    assert metrics["offline_ratio"] == 2.0 and metrics["latency_vs_base"] == 1.25
    # Each engine's best and worst run: the fastest throughput, the shortest step.
    assert (metrics["offline_final_best"], metrics["offline_final_worst"]) == (300.0, 100.0)
    assert (metrics["latency_final_best"], metrics["latency_final_worst"]) == (1.5, 2.5)
    assert metrics["latency_minisgl_best"] == metrics["latency_minisgl_worst"] == 3.0
    assert (
        metrics["kernels_b1_t00_base_us"] == 2000.0
        and out["kernels"][0]["final-base"]["gpu_us_per_step"] == 2000.0
    )
    assert metrics["kernels_b1_t00_final_us"] == 1500.0 and metrics["kernels_b1_t00_ratio"] == pytest.approx(
        1.2
    )
    assert "kernels_b1_t00_final_busy_us" not in metrics  # an older table: no busy time
    # Tables with the busy time (overlaps once): the ratio and the metrics read it.
    kernels["final"][0]["busy_us_per_step"] = 1200.0
    kernels["mini-sglang"][0]["busy_us_per_step"] = 1800.0
    out = bench_versus.assemble(runs, kernels)
    metrics = bench_versus.flat_metrics(out)
    assert out["kernels"][0]["gpu_us_ratio"] == pytest.approx(1.5)
    assert (
        metrics["kernels_b1_t00_final_busy_us"] == 1200.0
        and metrics["kernels_b1_t00_minisgl_busy_us"] == 1800.0
    )


@pytest.mark.slow
def test_a_cpu_run_gives_one_json_with_both_engines(tmp_path: Path) -> None:
    peer, _ = stand_in_peer(tmp_path)
    model = make_tiny_checkpoint(tmp_path / "tiny", "qwen3", max_position_embeddings=2048)
    log, out = tmp_path / "seen.jsonl", tmp_path / "out"
    base = tmp_path / "base"
    shutil.copytree(ROOT / "final", base / "final", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": f"{peer}:{ROOT}", "STAND_IN_LOG": str(log), "BENCH_RUN_ID": "call-9",
           "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "scripts.bench_versus", "--model", str(model), "--out", str(out), "--gpu", "cpu",
           "--repeats", "1", "--scale", "0.01", "--attn", "torch", "--kernel-batches", "--base", str(base)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    data = json.loads((out / "versus_minisgl_cpu.json").read_text())
    parse_result(data, "versus_minisgl_cpu.json")  # a result the docs can render
    assert data["run_id"] == "call-9" and data["config"]["repeats"] == 1
    assert (data["config"]["attn"], data["config"]["final_attn"]) == ("torch", "auto")
    assert data["config"]["final_attn_resolved"] == "torch"  # what auto became on the CPU
    offline, latency = data["offline"], data["latency"]
    assert offline["ratio"] == pytest.approx(offline["final"] / offline["mini-sglang"])
    assert latency["ratio"] == pytest.approx(latency["mini-sglang"] / latency["final"])
    assert offline["final"] > 0 and latency["final"] > 0  # final/ really ran: the stand-in is not it
    assert "kernels" not in data  # --kernel-batches with no value: no profile
    # the base ran from its own folder (bench_peer.py asserts where final/ came from)
    assert offline["vs_base"] == pytest.approx(offline["final"] / offline["base"])
    assert "--final-path" in done.stderr


def test_each_run_keeps_the_machine_state_it_started_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow repeat must be tellable from a slow engine: the GPU's clocks, temperature, throttle
    reasons and the processes on it are read (from nvidia-smi, here a stand-in) before each run
    and kept beside it, in the order of `runs`."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$*" in *compute-apps*) printf "101\\n202\\n" ;; '
        '*) printf "1980, 3201, 41, 310.5, 0x0000000000000004\\n" ;; esac\n'
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    state = bench_versus.machine_state()
    assert state["clocks.sm"] == "1980" and state["temperature.gpu"] == "41"
    assert state["clocks_throttle_reasons.active"] == "0x0000000000000004"
    assert state["gpu_processes"] == 2 and state["loadavg_1m"] >= 0
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no nvidia-smi: the load average alone
    assert set(bench_versus.machine_state()) == {"loadavg_1m"}
    slow, fast = {"clocks.sm": "1200"}, {"clocks.sm": "1980"}
    runs = {
        "final": {"latency": [{"metrics": {"decode_step_ms": 1.0}, "machine": fast},
                              {"metrics": {"decode_step_ms": 1.4}, "machine": slow}]},
        "mini-sglang": {"latency": [{"metrics": {"decode_step_ms": 1.6}}]},
    }  # fmt: skip
    out = bench_versus.assemble(runs, {})
    assert out["latency"]["machine"] == {"final": [fast, slow], "mini-sglang": [{}]}
