"""scripts/latency_trees.py: gpu_run.sh latency-trees' run files into one result per call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts import latency_trees


def run(folder: Path, tree: str, round_: int, step_ms: float, stamp: str = "2026-11-29T02:37:18Z") -> None:
    (folder / f"{tree}_r{round_}.json").write_text(json.dumps({
        "name": f"{tree}_r{round_}", "metrics": {"decode_step_ms": step_ms},
        "config": {"model": "qwen3-0.6b-random", "attn": "auto", "dtype": "bfloat16", "seed": 0},
        "hardware": {"gpu": "NVIDIA H200"}, "versions": {"torch": "2.11.0"},
        "timestamp": stamp, "run_id": "gpu-call-6",
    }))  # fmt: skip


def test_each_tree_gets_its_median_and_its_runs_extremes(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    for r, ms in enumerate([1.10, 1.02, 1.04], start=1):
        run(runs, "857cfb0", r, ms)
    for r, ms in enumerate([1.30, 1.20, 1.25], start=1):
        run(runs, "c399415", r, ms, stamp=f"2026-11-29T03:0{r}:00Z")
    (runs / "notes.json").write_text("{}")  # not a run: ignored
    assert latency_trees.main([str(runs), "--out", str(tmp_path / "out"), "--gpu", "h200"]) == 0
    result = json.loads((tmp_path / "out" / "final_latency_trees_h200.json").read_text())
    m = result["metrics"]
    assert m["step_ms_857cfb0"] == 1.04 and m["step_ms_c399415"] == 1.25  # medians, not means
    assert (m["step_ms_857cfb0_best"], m["step_ms_857cfb0_worst"]) == (1.02, 1.10)
    assert (m["lowest_median_ms"], m["highest_median_ms"]) == (1.04, 1.25)
    assert m["medians_spread_pct"] == pytest.approx(100 * 0.21 / 1.04)
    # The runs' machine and call, not the summarizing process's.
    assert result["hardware"] == {"gpu": "NVIDIA H200"} and result["run_id"] == "gpu-call-6"
    assert result["timestamp"] == "2026-11-29T03:03:00Z"
    assert result["config"]["trees"] == ["857cfb0", "c399415"] and result["config"]["rounds"] == 3


def test_a_folder_without_runs_is_an_error_not_an_empty_result(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no run files"):
        latency_trees.main([str(tmp_path), "--out", str(tmp_path / "out"), "--gpu", "h200"])
    assert not (tmp_path / "out").exists()
