"""scripts/profile_decode_step.py and scripts/render_profile.py: a trace in, a small JSON out, and
the chapter's figure and fragment from the JSON."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts import profile_decode_step as profiler  # noqa: E402
from scripts import render_profile  # noqa: E402


def event(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_a_gpu_trace_keeps_the_steps_cuda_calls_and_the_gpu_work_after_its_start():
    trace = {
        "traceEvents": [
            event("cuda_runtime", "cudaLaunchKernel", 90, 3),  # before the step: left out
            event("user_annotation", "decode step", 100, 50),
            event("cuda_runtime", "cudaLaunchKernel", 105, 4),
            event("cuda_driver", "cuLaunchKernelEx", 112, 2),
            event("cuda_runtime", "cudaGraphLaunch", 120, 6),
            event("cuda_runtime", "cudaStreamSynchronize", 130, 15),
            event("cpu_op", "aten::mm", 104, 8),  # a GPU trace draws the CUDA calls, not operators
            event("kernel", "gemm", 110, 5, tid=7),
            event("kernel", "attention", 112, 6, tid=7),  # overlaps the first: busy 110..118
            event("gpu_memcpy", "Memcpy DtoH", 140, 2, tid=7),
            event("kernel", "earlier", 95, 2, tid=7),  # before the step: left out
            {"ph": "i", "cat": "kernel", "name": "instant", "ts": 120},  # not a complete event
        ]
    }
    s = profiler.summarise_trace(trace)
    assert s["step_ms"] == pytest.approx(0.05)
    assert [kind for _, _, kind in s["host"]] == ["launch", "launch", "graph", "copy/sync"]
    assert s["host"][0] == [5.0, 4.0, "launch"]
    assert s["launches"] == 3 and s["gpu_kernels"] == 2
    assert s["gpu"] == [[10.0, 5.0], [12.0, 6.0], [40.0, 2.0]]
    assert s["gpu_busy_ms"] == pytest.approx(0.010)  # 8 + 2 microseconds


def test_a_cpu_trace_draws_the_top_level_operators():
    trace = {
        "traceEvents": [
            event("user_annotation", "decode step", 0, 100),
            event("cpu_op", "aten::linear", 10, 30),
            event("cpu_op", "aten::addmm", 12, 20),  # inside aten::linear
            event("cpu_op", "aten::softmax", 50, 10),
        ]
    }
    s = profiler.summarise_trace(trace)
    assert s["host"] == [[10.0, 30.0, "operator"], [50.0, 10.0, "operator"]]
    assert s["gpu"] == [] and s["launches"] == 0


def test_a_trace_without_the_step_annotation_is_refused():
    with pytest.raises(ValueError, match="one 'decode step' annotation"):
        profiler.summarise_trace({"traceEvents": [event("cpu_op", "aten::mm", 0, 1)]})


def test_the_script_profiles_a_tiny_model_on_the_cpu(tmp_path, tiny_qwen3_dir):
    args = ["--model", str(tiny_qwen3_dir), "--device", "cpu", "--dtype", "float32", "--attn", "torch",
            "--batch", "3", "--prompt-len", "12", "--warmup-steps", "1", "--out", str(tmp_path), "--name", "p"]  # fmt: skip
    assert profiler.main(args) == 0
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["kind"] == "decode-step-profile" and data["stand_in"] and data["batch"] == 3
    for mode in ("eager", "graph"):
        m = data["modes"][mode]
        assert m["step_ms"] > 0 and m["host"] and m["gpu"] == []

    # ... and the renderer turns it into the chapter's fragment and figure.
    root = tmp_path / "repo"
    (root / "benchmarks/profiles/cpu").mkdir(parents=True)
    (tmp_path / "p.json").rename(root / "benchmarks/profiles/cpu/p.json")
    render_profile.write_all(root)
    text = (root / render_profile.FRAGMENT).read_text()
    assert "(../assets/profiles/cpu_p.png)" in text and "CPU stand-in" in text
    assert f"step {data['modes']['eager']['step_ms']:.2f} ms" in text
    assert (root / "docs/assets/profiles/cpu_p.png").stat().st_size > 10_000
    assert render_profile.stale_files(root) == []


def test_without_profiles_the_fragment_says_when_they_come(tmp_path):
    render_profile.write_all(tmp_path)
    assert "comes with the next GPU run" in (tmp_path / render_profile.FRAGMENT).read_text()


def test_the_committed_fragment_is_up_to_date():
    assert render_profile.stale_files() == [], "run make docs-gen"


def test_gpu_idle_is_the_windows_gaps_up_to_the_last_gpu_work():
    trace = {
        "traceEvents": [
            event("user_annotation", "decode step", 100, 20),  # the host is done at 120 ...
            event("kernel", "running at the start", 95, 10, tid=7),  # counts from 100: 5 us
            event("kernel", "gemm", 110, 10, tid=7),
            event("gpu_memcpy", "Memcpy DtoH", 125, 5, tid=7),  # ... the GPU at 130
        ]
    }
    s = profiler.summarise_trace(trace)
    assert s["gpu"] == [[0.0, 5.0], [10.0, 10.0], [25.0, 5.0]]
    assert s["gpu_busy_ms"] == pytest.approx(0.020) and s["gpu_idle_ms"] == pytest.approx(0.010)


def test_the_script_profiles_stage06_steps_with_overlap_off_and_on(tmp_path, tiny_qwen3_dir):
    args = ["--stage", "06_overlap", "--steps", "3", "--model", str(tiny_qwen3_dir), "--device", "cpu",
            "--dtype", "float32", "--attn", "torch", "--batch", "2", "--prompt-len", "8", "--warmup-steps", "1",
            "--out", str(tmp_path), "--name", "p"]  # fmt: skip
    assert profiler.main(args) == 0
    data = json.loads((tmp_path / "p.json").read_text())
    assert (
        data["stage"] == "06_overlap" and data["steps"] == 3 and set(data["modes"]) == {"serial", "overlap"}
    )
    root = tmp_path / "repo"
    (root / "benchmarks/profiles/cpu").mkdir(parents=True)
    (tmp_path / "p.json").rename(root / "benchmarks/profiles/cpu/p.json")
    render_profile.write_all(root)
    text = (root / render_profile.FRAGMENTS["06_overlap"]).read_text()
    assert "(../assets/profiles/cpu_p.png)" in text and "overlap on: 3 steps in" in text
    assert "No decode-step profile yet" in (root / render_profile.FRAGMENT).read_text()
    assert render_profile.stale_files(root) == []
