"""The `prefill` workload of the bench harness: batch-1 prompts of a few lengths, served one after
another, one token each; its metrics per length (the attention backends' prefill comparison)."""

from __future__ import annotations

import statistics

import pytest

from stages.common import bench
from stages.common import workloads as wl
from stages.common.outputs import RequestOutput
from tests.stages.common.test_bench import VOCAB, run_bench


def test_prefill_is_one_prompt_at_a_time_of_each_length_with_one_token():
    w = wl.prefill(VOCAB, lengths="512,2048,8192", per_length=3)
    assert [len(it.prompt_ids) for it in w.items] == [512, 2048, 8192] * 3  # interleaved
    assert all(it.params.max_tokens == 1 and it.params.greedy and it.params.ignore_eos for it in w.items)
    # One session: each prompt is sent when the previous one has finished (batch 1).
    assert [it.turn for it in w.items] == list(range(9)) and {it.session for it in w.items} == {0}
    assert all(it.follows_previous_turn for it in w.items[1:])
    # No two prompts share a first token: no radix hit at any page size.
    assert len({it.prompt_ids[0] for it in w.items}) == len(w.items)
    assert w.settings == {"lengths": "512,2048,8192", "per_length": 3}


def test_prefill_scales_its_lengths_and_takes_one_length_as_an_int():
    assert [len(it.prompt_ids) for it in wl.prefill(VOCAB, scale=0.05).items[:3]] == [26, 102, 410]
    assert {len(it.prompt_ids) for it in wl.make_workload("prefill", VOCAB, lengths=300).items} == {300}
    with pytest.raises(ValueError, match="prefill wants"):
        wl.prefill(VOCAB, per_length=0)
    with pytest.raises(ValueError):
        wl.prefill(VOCAB, lengths="512,lots")


def record(n: int, submitted: float, ttft: float) -> bench.Record:
    item = wl.WorkItem(0.0, list(range(n)), wl.SamplingParams(max_tokens=1))
    out = RequestOutput(list(range(n)), [1], ttft_s=ttft, latency_s=ttft, token_times=[ttft])
    return bench.Record(item, submitted, submitted, out)


def test_prefill_metrics_per_length_median_and_first():
    # Two lengths, three requests each, finishing out of order; the first 100-token request
    # compiled a kernel (2 s).
    ttfts = {100: [2.0, 0.010, 0.012], 400: [0.030, 0.020, 0.040]}
    records = [record(n, 10.0 * i + (n == 400), t) for n, times in ttfts.items() for i, t in enumerate(times)]
    metrics = bench.prefill_metrics(list(reversed(records)))
    assert metrics["ttft_ms_100"] == pytest.approx(12) and metrics["ttft_ms_400"] == pytest.approx(30)
    assert metrics["prefill_tok_per_s_100"] == pytest.approx(100 / 0.012)
    assert metrics["prefill_tok_per_s_400"] == pytest.approx(400 / statistics.median(ttfts[400]))
    assert metrics["first_ttft_ms_100"] == pytest.approx(2000) and metrics[
        "first_ttft_ms_400"
    ] == pytest.approx(30)
    assert list(metrics)[:2] == ["prefill_tok_per_s_100", "prefill_tok_per_s_400"]  # what the docs plot first
    assert metrics["requests"] == 6 and metrics["prompt_tokens"] == 1500


def test_prefill_end_to_end_with_final(tmp_path, tiny_qwen3_dir):
    data = run_bench(tmp_path, tiny_qwen3_dir, "--engine", "final", "--workload", "prefill", "--scale", "0.05",
                     "--workload-arg", "lengths=512,2048", "--workload-arg", "per_length=2")  # fmt: skip
    assert data["workload"] == "prefill" and data["config"]["lengths"] == "512,2048"
    assert data["config"]["per_length"] == 2 and data["config"]["repeats"] == 1  # prompts, not processes
    metrics = data["metrics"]
    assert metrics["requests"] == 4 and metrics["prompt_tokens"] == 2 * (26 + 102)
    for n in (26, 102):
        assert metrics[f"prefill_tok_per_s_{n}"] == pytest.approx(n / metrics[f"ttft_ms_{n}"] * 1000)
        assert metrics[f"first_ttft_ms_{n}"] > 0
