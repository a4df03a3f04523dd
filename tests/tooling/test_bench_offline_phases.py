"""scripts/bench_offline_phases.py: an offline run's steps split into prefill, full-batch decode and
the draining tail (issue 31: where the offline gap to Mini-SGLang is)."""

from __future__ import annotations

import json

import pytest

from scripts.bench_offline_phases import StepRecord, main, phases
from stages.common.workloads import offline


def test_steps_fall_in_their_phase_and_sum_to_the_run():
    steps = [
        # prefill alone, the run's first step: 0.3 s of the run's start before its launch
        StepRecord(
            0.50, prompt_tokens=4000, decode_rows=0, output_tokens=8, launch_seconds=0.02, lead_in_seconds=0.3
        ),
        StepRecord(0.30, prompt_tokens=1000, decode_rows=8, output_tokens=10),  # a chunk beside decodes
        StepRecord(0.10, prompt_tokens=0, decode_rows=10, output_tokens=10),  # the full batch
        StepRecord(0.10, prompt_tokens=0, decode_rows=9, output_tokens=9),  # 90% of it: still full
        StepRecord(0.05, prompt_tokens=0, decode_rows=8, output_tokens=8),  # the tail
        StepRecord(0.05, prompt_tokens=0, decode_rows=1, output_tokens=1, launch_seconds=0.01),
    ]
    out = phases(steps, full_share=0.9)
    assert out["full_batch"] == 10 and out["steps"] == 6
    assert (out["prefill_steps"], out["decode_steps"], out["tail_steps"]) == (2, 2, 2)
    assert out["prefill_s"] == pytest.approx(0.8) and out["decode_s"] == pytest.approx(0.2)
    assert out["tail_s"] == pytest.approx(0.1) and out["total_s"] == pytest.approx(1.1)
    assert out["prefill_share"] + out["decode_share"] + out["tail_share"] == pytest.approx(1.0)
    assert out["decode_output_tokens"] == 19 and out["decode_tok_per_s"] == pytest.approx(95.0)
    assert out["prefill_prompt_tokens"] == 5000 and out["output_tok_per_s"] == pytest.approx(46 / 1.1)
    assert out["tail_step_ms_mean"] == pytest.approx(50.0)
    assert out["tail_launch_ms_mean"] == pytest.approx(5.0) and out["decode_launch_ms_mean"] == 0.0
    # The first step (the run's start in its interval) apart from the steady prefill steps.
    assert out["prefill_first_step_ms"] == pytest.approx(500.0)
    assert out["prefill_first_launch_ms"] == pytest.approx(20.0)  # its own launch, apart from the run's start
    assert out["lead_in_ms"] == pytest.approx(300.0)  # and the run's start before it
    assert out["prefill_rest_step_ms_mean"] == pytest.approx(300.0)
    assert "prefill_first_step_ms" not in phases(steps[2:], full_share=0.9)  # no prefill step at all


def test_a_cpu_run_accounts_for_every_token_of_the_workload(tiny_qwen3_dir, tmp_path):
    """The real engine on the CPU: every prompt token is computed in a prefill step, every output
    token is sampled in some step, and the phases cover the run."""
    scale = 0.03
    assert main(["--model", str(tiny_qwen3_dir), "--device", "cpu", "--scale", str(scale), "--warmup", "2",
                 "--out-dir", str(tmp_path), "--name", "phases"]) == 0  # fmt: skip
    result = json.loads((tmp_path / "phases.json").read_text())
    m = result["metrics"]
    vocab = json.loads((tiny_qwen3_dir / "config.json").read_text())["vocab_size"]
    items = offline(vocab, 0, scale).items
    assert m["prefill_prompt_tokens"] == sum(len(i.prompt_ids) for i in items)
    assert sum(m[f"{p}_output_tokens"] for p in ("prefill", "decode", "tail")) == sum(
        i.params.max_tokens for i in items
    )
    assert m["prefill_steps"] >= 1 and m["decode_steps"] >= 1
    assert m["prefill_s"] + m["decode_s"] + m["tail_s"] == pytest.approx(m["total_s"])
    assert (
        0 < m["prefill_launch_ms_mean"] <= m["prefill_step_ms_mean"] * 1.5
    )  # measured, and of the step's size
    assert result["workload"] == "offline-phases" and result["config"]["num_requests"] == len(items)
    detail = result["prefill_steps"]  # one entry per prefill step, in order
    assert len(detail) == m["prefill_steps"]
    assert sum(d["prompt_tokens"] for d in detail) == m["prefill_prompt_tokens"]
    assert sum(d["ms"] for d in detail) == pytest.approx(1e3 * m["prefill_s"])
    # The first step's lead-in (the API's preparation) is part of its interval, and only its own.
    assert 0 < m["lead_in_ms"] < result["prefill_steps"][0]["ms"]
