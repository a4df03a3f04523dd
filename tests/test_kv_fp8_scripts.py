"""The FP8 KV cache's measuring scripts (issue 32) on the CPU with a tiny model: they run, write
result files the docs can render, and their numbers are the ones they say they are."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from scripts import kv_fp8_accuracy, kv_fp8_capacity
from scripts.results_model import parse_result


def test_capacity_reads_each_pool_in_a_fresh_process(tmp_path, tiny_qwen3_dir):
    argv = ["--model", str(tiny_qwen3_dir), "--device", "cpu", "--context", "64", "--page-size", "4"]
    assert kv_fp8_capacity.main([*argv, "--out", str(tmp_path)]) == 0
    full, fp8 = (
        json.loads((tmp_path / f"kv_fp8_capacity_{d}_cpu.json").read_text()) for d in ("float32", "fp8_e4m3")
    )
    for data in (full, fp8):
        parse_result(data, "capacity")
        m = data["metrics"]
        assert m["kv_tokens"] == 32768 and m["kv_pages"] == 32768 // 4  # the CPU's fixed pool
        assert m["requests_at_ctx"] == 32768 // 64 and m["batch_at_ctx"] == 256
    assert full["metrics"]["bytes_per_token"] == 4 * fp8["metrics"]["bytes_per_token"]  # float32 / fp8
    assert fp8["config"]["kv_cache_dtype"] == "fp8_e4m3" and fp8["config"]["memory_ratio"] == 0.9


def test_accuracy_script_compares_two_caches_and_writes_a_result(tmp_path, tiny_qwen3_dir):
    argv = ["--model", str(tiny_qwen3_dir), "--model-tag", "tiny", "--prompts", "6", "--tokens", "8",
            "--min-len", "4", "--max-len", "60", "--out", str(tmp_path), "--no-progress"]  # fmt: skip
    assert kv_fp8_accuracy.main(argv) == 0
    data = json.loads((tmp_path / "kv_fp8_accuracy_tiny_cpu.json").read_text())
    parse_result(data, "accuracy")
    m = data["metrics"]
    assert m["prompts"] == 6 and 6 <= m["compared_tokens"] + m["left_out_tokens"] <= 6 * 8
    assert 0 <= m["greedy_agreement"] <= m["agreed_token_share"] <= 1
    assert 0 < m["abs_dlogprob_mean"] <= m["abs_dlogprob_p99"] <= m["abs_dlogprob_max"] < 1
    assert data["config"]["scales"] == "one" and data["config"]["dtype"] == "float32"


def out(tokens, top):
    """A RequestOutput's fields that `compare` reads: per step the chosen token's logprob and the top."""
    return SimpleNamespace(
        token_ids=tokens,
        logprobs=[
            {
                "token_logprob": dict(step)[t],
                "top_ids": [i for i, _ in step],
                "top_logprobs": [p for _, p in step],
            }
            for t, step in zip(tokens, top, strict=True)
        ],
    )


def test_compare_stops_at_the_first_difference_and_reads_the_reference_token_there():
    ref = out([1, 2, 3], [[(1, -0.1), (9, -2.0)], [(2, -0.5), (7, -1.0)], [(3, -0.2), (4, -1.9)]])
    # FP8 agrees on step 0, then prefers 7 over the reference's 2 (which it gives -0.9); step 2 is
    # past the difference, where contexts differ: not compared.
    fp8 = out([1, 7, 5], [[(1, -0.3), (9, -1.8)], [(7, -0.6), (2, -0.9)], [(5, -0.1), (3, -9.0)]])
    same = out([1, 2, 3], [[(1, -0.1), (9, -2.0)], [(2, -0.5), (7, -1.0)], [(3, -0.2), (4, -1.9)]])
    m = kv_fp8_accuracy.compare([ref, ref], [fp8, same], tokens=3)
    assert m["greedy_agreement"] == 0.5 and m["agreed_token_share"] == pytest.approx((1 / 3 + 1) / 2)
    # |Δ|: 0.2 and 0.4 for the first prompt (steps 0 and 1), 0, 0, 0 for the second.
    assert m["compared_tokens"] == 5 and m["abs_dlogprob_mean"] == pytest.approx(0.6 / 5)
    assert m["abs_dlogprob_max"] == pytest.approx(0.4) and m["left_out_tokens"] == 0
    gone = out([1, 7, 5], [[(1, -0.3)], [(7, -0.6)], [(5, -0.1)]])  # the reference's 2 not in its top
    assert kv_fp8_accuracy.compare([ref], [gone], tokens=3)["left_out_tokens"] == 1
