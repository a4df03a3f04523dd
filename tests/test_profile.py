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


def test_the_script_profiles_final_as_served_and_with_graphs_and_overlap_off(
    tmp_path, tiny_qwen3_dir, monkeypatch
):
    """final/ end to end on the CPU. The engine is watched from outside the script: every launch
    and collect of a step, every replay of a decode graph (the EagerGraph stand-in), and the two
    profiled windows, in one log."""
    from final.engine.core import EngineCore
    from final.engine.graph import EagerGraph

    log: list[str] = []
    uncollected_at_launch: list[tuple[int, int]] = []  # (window, steps launched and not collected)
    window = {"now": 0, "opened": 0, "uncollected": 0}  # now: the window open (0: none)

    def watch(name: str, real):
        def wrapped(self, *args, **kwargs):
            if name == "launch":
                uncollected_at_launch.append((window["now"], window["uncollected"]))
            window["uncollected"] += {"launch": 1, "collect": -1}.get(name, 0)
            log.append(name)
            return real(self, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(EngineCore, "launch", watch("launch", EngineCore.launch))
    monkeypatch.setattr(EngineCore, "collect", watch("collect", EngineCore.collect))
    monkeypatch.setattr(EagerGraph, "replay", watch("replay", EagerGraph.replay))
    real_profile_step = profiler.profile_step

    def profile_step(*args, **kwargs):
        window["opened"] += 1
        window["now"] = window["opened"]
        log.append(f"open {window['now']}")
        try:
            return real_profile_step(*args, **kwargs)
        finally:
            log.append("close")
            window["now"] = 0

    monkeypatch.setattr(profiler, "profile_step", profile_step)
    args = ["--stage", "final", "--steps", "3", "--model", str(tiny_qwen3_dir), "--device", "cpu",
            "--dtype", "float32", "--attn", "torch", "--batch", "2", "--prompt-len", "8", "--warmup-steps", "1",
            "--out", str(tmp_path), "--name", "p"]  # fmt: skip
    assert profiler.main(args) == 0

    data = json.loads((tmp_path / "p.json").read_text())
    assert data["stage"] == "final" and data["steps"] == 3 and data["stand_in"] and data["batch"] == 2
    assert list(data["modes"]) == ["eager_serial", "served"]  # the order they ran and are drawn in
    for mode in data["modes"].values():
        assert mode["step_ms"] > 0 and mode["gpu"] == [] and mode["launches"] == 0
        assert mode["host"] and all(0 <= t <= 1000 * mode["step_ms"] for t, _, _ in mode["host"])

    # What ran in each window: the eager, serial one first, then final/ as it serves.
    first, second = log.index("open 1"), log.index("open 2")
    eager, served = log[first : log.index("close", first)], log[second : log.index("close", second)]
    assert eager.count("launch") == served.count("launch") == 3, "both modes run --steps steps"
    assert eager.count("collect") == served.count("collect") == 3
    assert eager.count("replay") == 0 and served.count("replay") == 3, "served: every decode step replays"
    # Served: each step is launched while the previous one is still uncollected. Serial: never,
    # so the step the overlapped loop left in flight was collected before the switch.
    assert [n for w, n in uncollected_at_launch if w == 2] == [1, 1, 1]
    assert [n for w, n in uncollected_at_launch if w == 1] == [0, 0, 0]

    root = tmp_path / "repo"
    (root / "benchmarks/profiles/cpu").mkdir(parents=True)
    (tmp_path / "p.json").rename(root / "benchmarks/profiles/cpu/p.json")
    render_profile.write_all(root)
    text = (root / render_profile.FRAGMENTS["final"]).read_text()
    assert "(../assets/profiles/cpu_p.png)" in text
    served_ms = data["modes"]["served"]["step_ms"]
    assert f"- as served, CUDA graphs and overlap on: 3 steps in {served_ms:.2f} ms" in text
    assert "No overlap profile yet" in (root / render_profile.FRAGMENTS["06_overlap"]).read_text()
    assert (root / "docs/assets/profiles/cpu_p.png").stat().st_size > 10_000
    assert render_profile.stale_files(root) == []


def test_without_a_final_profile_its_fragment_names_the_gpu_step(tmp_path):
    render_profile.write_all(tmp_path)
    text = (tmp_path / render_profile.FRAGMENTS["final"]).read_text()
    assert "No final/ profile yet" in text and "gpu_run.sh ckpt profile-final" in text
