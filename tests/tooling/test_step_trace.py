"""The engine's step trace (final/runtime/step_trace.py) and what scripts/step_trace_report.py
makes of it: the trace of a real CPU engine has one launch and one collect per step, in the loop's
order; the report puts each burst down to the step before it."""

from __future__ import annotations

import json

import pytest

import final
from final.core.sampling_params import SamplingParams
from final.runtime import step_trace
from scripts.step_trace_report import report, segments
from tests.fixtures.tiny_models import sample_prompts


def test_a_cpu_engine_traces_every_launch_and_collect(tiny_qwen3_dir, monkeypatch, tmp_path):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", overlap="on")
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv(step_trace.ENV, str(path))
    out = step_trace.install_from_env(llm.core)
    assert out is not None
    prompts = sample_prompts(tiny_qwen3_dir, n=4, seed=3)
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), progress=False)
    steps = llm.core.stats.num_steps
    out.close()
    llm.close()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    launches = [e for e in events if e["ev"] == "launch"]
    collects = [e for e in events if e["ev"] == "collect"]
    assert len(launches) == len(collects) == steps
    # Overlap: step N+1's launch is written before step N's collect, every time after the first.
    assert [e["ev"] for e in events[:3]] == ["launch", "launch", "collect"]
    assert sum(e["prompt"] for e in launches) == sum(len(p) for p in prompts)
    assert all(e["t0"] <= e["t1"] for e in launches)
    assert sum(e["sampled"] for e in collects) == 6 * len(prompts)
    assert not any(e["early"] for e in launches)  # the offline LLM publishes nothing early


def test_no_trace_without_the_variable(tiny_qwen3_dir, monkeypatch):
    monkeypatch.delenv(step_trace.ENV, raising=False)
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    assert step_trace.install_from_env(llm.core) is None
    assert "launch" not in vars(llm.core)  # the methods themselves: nothing wrapped
    llm.close()


def events(*steps: tuple[str, float, float, dict]) -> list[dict]:
    return [{"ev": ev, "t0": t0, "t1": t1, **fields} for ev, t0, t1, fields in steps]


def launch(t0, t1, prompt=0, early=False):
    return ("launch", t0, t1, {"prompt": prompt, "decodes": 8, "early": early})


def collect(t0, t1, ready, decode_only=True):
    return ("collect", t0, t1, {"ready": ready, "sampled": 8, "decode_only": decode_only})


def test_the_report_puts_each_burst_down_to_the_launch_before_it():
    ms = 1e-3
    trace = events(
        # Steady decode steps of 10 ms: graph launches, collects waiting for their step.
        launch(0, 1 * ms), collect(1 * ms, 10 * ms, False),
        launch(10 * ms, 11 * ms), collect(11 * ms, 20 * ms, False),
        launch(20 * ms, 21 * ms), collect(21 * ms, 30 * ms, False),
        # An eager launch of 25 ms: the step in flight (done at 40) is collected late, at 55; the
        # eager step itself (done at 57) 2 ms later: a burst, late after an eager launch.
        launch(30 * ms, 55 * ms, prompt=4000), collect(55 * ms, 55 * ms, True),
        launch(55 * ms, 56 * ms), collect(56 * ms, 57 * ms, False, decode_only=False),
        launch(57 * ms, 58 * ms), collect(58 * ms, 67 * ms, False),
        # With early delivery the step in flight goes out during the launch: no burst.
        launch(67 * ms, 92 * ms, prompt=4000, early=True), collect(77 * ms, 77 * ms, True),
        launch(92 * ms, 93 * ms), collect(93 * ms, 95 * ms, False, decode_only=False),
        launch(95 * ms, 96 * ms), collect(96 * ms, 105 * ms, False),
    )  # fmt: skip
    out = report(trace)
    assert out["decode_step_ms_p50"] == pytest.approx(10.0)
    assert out["causes"]["late after an eager launch"] == 1
    assert out["bursts"] == 1 and out["delivered_during_a_launch"] == 1
    assert out["eager_launches"] == 2 and out["eager_launch_ms_p50"] == pytest.approx(25.0)
    assert out["late_collect_share"] == pytest.approx(2 / 9)
    # Per stream against the local step (10 ms, the decode-only gaps' median): only the burst's 2 ms
    # gap falls under 5 ms; 8 streams got a token across each of the 8 gaps.
    assert out["stream_burst_share_local"] == pytest.approx(1 / 8)


def test_a_batch_ramping_up_is_no_burst_against_the_local_step():
    ms, trace, t = 1e-3, [], 0.0
    for step in [2.0] * 20 + [6.0] * 40:  # a small batch's quick steps, then a full batch's
        trace += events(launch(t * ms, (t + 0.5) * ms), collect((t + 0.5) * ms, (t + step) * ms, False))
        t += step
    out = report(trace)
    assert out["burst_share"] > 0.3  # against the load's one median (6 ms) the quick steps are "bursts"
    assert out["stream_burst_share_local"] == 0.0


def test_the_trace_is_cut_where_the_engine_idled():
    one = events(
        launch(0, 0.001), collect(0.001, 0.01, False), launch(0.01, 0.011), collect(0.011, 0.02, False)
    )
    two = [dict(e, t0=e["t0"] + 5, t1=e["t1"] + 5) for e in one]
    pieces = segments(two + one)  # in any order
    assert [len(p) for p in pieces] == [4, 4] and pieces[1][0]["t0"] == 5
