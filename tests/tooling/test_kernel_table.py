"""scripts/kernel_table.py's arithmetic (profiling itself needs a CUDA GPU): a decode step as the
difference of two calls, and a prefill as one whole call of fresh prompts."""

from __future__ import annotations

import random

import pytest

from scripts.kernel_table import (
    BUSY,
    PROMPT_TOKENS,
    exclusive_times,
    fresh_prompts,
    prefill_table,
    step_table,
)

KERNELS = {
    "void gemv_kernel<128>(float*)": (10, 100.0),
    "BatchPrefillWithPagedKVCacheKernel": (2, 50.0),
    "act_and_mul_kernel": (4, 8.0),
}


def test_a_decode_step_is_the_difference_of_two_calls_per_step():
    one = {"void gemv_kernel<128>(float*)": (2, 20.0), "BatchPrefillWithPagedKVCacheKernel": (2, 50.0)}
    table = step_table(one, KERNELS, steps=4)
    assert table["kernels_per_step"] == pytest.approx((8 + 0 + 4) / 4)
    assert table["gpu_us_per_step"] == pytest.approx((80 + 0 + 8) / 4)


def test_a_prefill_table_is_the_whole_call():
    table = prefill_table(KERNELS, prompts=32)
    assert table["phase"] == "prefill" and table["prompt_tokens"] == 32 * PROMPT_TOKENS
    assert table["kernels_per_step"] == 16 and table["gpu_us_per_step"] == pytest.approx(158.0)
    assert sum(table["by_category_us"].values()) == pytest.approx(158.0)


def test_each_call_gets_fresh_prompts():
    rng = random.Random(0)
    first, second = fresh_prompts(rng, 3, 1000), fresh_prompts(rng, 3, 1000)
    assert all(len(p) == PROMPT_TOKENS for p in first + second)
    assert not {tuple(p) for p in first} & {tuple(p) for p in second}


def test_overlapping_kernels_count_each_stretch_once():
    # A GEMV from 0 to 10 µs; with dependent launch the activation starts at 6 and runs to 12,
    # waiting for the GEMV meanwhile; then a gap of 3 µs; a norm from 15 to 17.
    table = exclusive_times([("act", 6.0, 12.0), ("gemv", 0.0, 10.0), ("norm", 15.0, 17.0)])
    assert table["gemv"] == (1, 10.0, 10.0)
    assert table["act"] == (1, 6.0, 2.0)  # 10 to 12 only: 6 to 10 was the GEMV's
    assert table[BUSY][1] == pytest.approx(14.0)  # 17 µs less the idle 3
    # A kernel wholly inside an earlier one owns nothing.
    assert exclusive_times([("a", 0.0, 10.0), ("b", 2.0, 5.0)])["b"] == (1, 3.0, 0.0)


def test_a_step_sums_categories_by_exclusive_time_and_reports_the_busy_time():
    one = exclusive_times([("gemv_kernel", 0.0, 10.0)])
    many = exclusive_times([
        ("gemv_kernel", 0.0, 10.0),
        ("gemv_kernel", 20.0, 30.0), ("act_and_mul_kernel", 26.0, 32.0),
        ("gemv_kernel", 40.0, 50.0), ("act_and_mul_kernel", 46.0, 52.0),
    ])  # fmt: skip
    table = step_table(one, many, steps=2)
    assert table["gpu_us_per_step"] == pytest.approx(16.0)  # durations summed: overlap twice
    assert table["busy_us_per_step"] == pytest.approx(12.0)
    assert table["by_category_us"] == {"gemm": 10.0, "activation": 2.0}
    assert table["top"][0][:2] == ["gemv_kernel", 1.0] and table["top"][1][3] == pytest.approx(2.0)
