"""The engine's warm-up at start (final/engine/warmup.py), on the CPU with `--warmup on`: prefill
steps of the budget's size that write K/V only on the padding page, take no request's place, and
leave what the engine then answers unchanged; `auto` runs it on a GPU only."""

from __future__ import annotations

import pytest
import torch

import final
from final.core.config import EngineConfig
from final.core.sampling_params import SamplingParams
from final.engine import warmup
from final.engine.resolve import resolve_config
from tests.fixtures.tiny_models import sample_prompts

BUDGET, RUNNING = 256, 8


def test_the_shapes_are_one_prompt_of_the_budget_then_the_budget_shared():
    assert warmup.warmup_shapes(16384, 40960, 256) == [(1, 16384), (32, 512)]
    assert warmup.warmup_shapes(16384, 4096, 256) == [(1, 4096), (32, 512)]  # no row holds more
    assert warmup.warmup_shapes(256, 4096, 8) == [(1, 256), (8, 32)]
    assert warmup.warmup_shapes(256, 4096, 1) == [(1, 256)]


def engine(model_dir, mode: str) -> final.LLM:
    return final.LLM(str(model_dir), device="cpu", dtype="float32", warmup=mode, seed=0,
                     max_prefill_length=BUDGET, max_running_requests=RUNNING)  # fmt: skip


def test_the_warm_up_steps_write_only_the_padding_page(tiny_qwen3_dir, monkeypatch):
    seen: list[tuple[int, int, set[int]]] = []
    real = warmup.warm_up

    def watched(runner, budget, max_requests):
        forward = runner.forward

        def spy(step, between_layers=None):
            seen.append((step.size, step.num_tokens, set(step.rows)))
            return forward(step, between_layers)

        runner.forward = spy
        try:
            return real(runner, budget, max_requests)
        finally:
            del runner.forward

    monkeypatch.setattr(warmup, "warm_up", watched)
    llm = engine(tiny_qwen3_dir, "on")
    runner = llm.core.executor.runner
    padding_row, padding_page = runner.page_table.padding_row, runner.pool.padding_page
    assert [(n, t) for n, t, _ in seen] == [(1, BUDGET), (RUNNING, BUDGET)]
    assert all(rows == {padding_row} for _, _, rows in seen)
    pages = runner.pool.k.abs().sum(dim=(0, 2, 3, 4)) + runner.pool.v.abs().sum(dim=(0, 2, 3, 4))
    assert pages[padding_page] > 0, "the warm-up wrote no K/V at all"
    assert torch.count_nonzero(pages[:padding_page]) == 0, "a warm-up step wrote a request's page"
    llm.close()


def test_answers_are_the_same_with_and_without_it(tiny_qwen3_dir):
    prompts = sample_prompts(tiny_qwen3_dir, n=6, seed=3)
    params = [SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1)] * 3 + [
        SamplingParams(temperature=0.8, seed=7 + i, max_tokens=8, ignore_eos=True) for i in range(3)
    ]
    outputs = {}
    for mode in ("off", "on"):
        llm = engine(tiny_qwen3_dir, mode)
        got = llm.generate([{"prompt_token_ids": p} for p in prompts], params, progress=False)
        outputs[mode] = [(o.token_ids, o.logprobs) for o in got]
        llm.close()
    assert outputs["on"] == outputs["off"]


@pytest.mark.parametrize(("mode", "device", "expected"), [("auto", "cpu", False), ("on", "cpu", True)])
def test_auto_warms_up_on_a_gpu_only(tiny_qwen3_dir, mode, device, expected):
    assert (
        resolve_config(EngineConfig(model=str(tiny_qwen3_dir), device=device, warmup=mode)).warmup is expected
    )
    assert resolve_config(EngineConfig(model=str(tiny_qwen3_dir), device="cpu", warmup="off")).warmup is False


def test_a_budget_raised_to_turn_chunking_off_does_not_raise_the_warm_up(tiny_qwen3_dir, monkeypatch):
    """--max-prefill-length 10**6: the warm-up's steps stay at WARMUP_MAX_TOKENS prompt tokens."""
    monkeypatch.setattr(warmup, "WARMUP_MAX_TOKENS", 96)
    seen = []
    real = warmup.padding_step
    monkeypatch.setattr(warmup, "padding_step", lambda *a: seen.append(a[1:]) or real(*a))
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", warmup="on",
                    max_prefill_length=10**6, max_running_requests=RUNNING)  # fmt: skip
    assert seen == [(1, 96), (RUNNING, 12)]
    llm.close()
