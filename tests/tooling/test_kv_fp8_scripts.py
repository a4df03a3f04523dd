"""The FP8 KV cache's measuring scripts (issue 32) on the CPU with a tiny model: they run, write
result files the docs can render, and their numbers are the ones they say they are."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from scripts import kv_fp8_accuracy, kv_fp8_capacity, results_kv_fp8
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


def gpu_result(name: str, workload: str, metrics: dict, **extra) -> dict:
    return {
        "name": name, "stage": "final", "workload": workload, "metrics": metrics,
        "config": {"kv_cache_dtype": "fp8_e4m3" if "fp8" in name else "bf16"},
        "hardware": {"cpu": "x", "gpu": "NVIDIA H200"}, "versions": {}, "command": f"make {name}",
        "timestamp": "2026-01-01T00:00:00Z", **extra,
    }  # fmt: skip


def test_the_page_pairs_bf16_with_fp8_and_says_where_rows_come_from():
    results = [
        parse_result(r, r["name"])
        for r in (
            gpu_result("kv_offline_bf16_h200", "offline", {"output_tok_per_s": 1000.0}, run_id="a"),
            gpu_result("kv_offline_fp8_h200", "offline", {"output_tok_per_s": 1500.0, "preemptions": 0}, run_id="a"),
            gpu_result("kv_latency_bf16_h200", "latency", {"decode_step_ms": 2.0}, run_id="a"),
            gpu_result("kv_latency_fp8_h200", "latency", {"decode_step_ms": 2.5}, run_id="b"),
            gpu_result("peer_minisgl_offline_h200", "offline", {"output_tok_per_s": 1200.0}, run_id="a",
                       stage="mini-sglang"),
            gpu_result("peer_minisgl_latency_h200", "latency", {"decode_step_ms": 1.7}, run_id="c",
                       stage="mini-sglang"),
            gpu_result("kv_fp8_decode_kernel_issue32_h200", "kv-decode-kernel", {
                f"us_b{b}_c{c}_{k}": 100.0 + i for b, c in ((256, 1024), (64, 16384), (1, 512))
                for i, (k, _) in enumerate(results_kv_fp8.KERNELS)}, label="issue 32"),
        )
    ]  # fmt: skip
    text = results_kv_fp8.render(results)
    # Mini-SGLang's figure beside them only when it was measured in the bf16 run's call.
    assert (
        "| H200 | offline (Nano-vLLM's 256 requests), output tok/s | 1,000 | 1,500 | 1.50x | 1,200 |" in text
    )
    assert "| 1.50x | 1,200 | FP8: 0 preemptions |" in text
    # Lower is better for a step time, and two device calls are said to be two.
    assert "| 2 | 2.50 | 0.80x (not one call) | - | - |" in text
    assert "| issue 32, H200 | 64, 16,384 | 100 µs | 101 µs | 102 µs | 103 µs |" in text
    assert "| issue 32, H200 | 1, 512 | 100 µs | 101 µs | 102 µs | 103 µs |" in text  # any shape timed
    assert "No accuracy results yet" in text and "No capacity results yet" in text
    assert "`kv_fp8_decode_kernel_issue32_h200` (2026-01-01T00:00:00Z)" in text
