"""scripts/kernel_table.py's arithmetic (profiling itself needs a CUDA GPU): a decode step as the
difference of two calls, and a prefill as one whole call of fresh prompts."""

from __future__ import annotations

import random

import pytest

from scripts.kernel_table import PROMPT_TOKENS, fresh_prompts, prefill_table, step_table

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
