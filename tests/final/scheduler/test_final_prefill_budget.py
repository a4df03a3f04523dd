"""A long prompt must not freeze the streams already running (issue 29, item 1): on the CPU the default
prefill budget cuts it into small chunks, and every step of its prefill still carries one token of
every running request. Counted in engine steps, not seconds: what a step costs is the device's
business, how many a stream waits is the scheduler's."""

from __future__ import annotations

from pathlib import Path

import pytest

import final
from final.core.config import CPU_PREFILL_BUDGET, GPU_PREFILL_BUDGET, EngineConfig
from final.core.sampling_params import SamplingParams
from final.engine.resolve import resolve_config
from tests.fixtures.tiny_models import make_tiny_checkpoint

LONG_PROMPT = 3000  # the issue's: 32.9 s of silence for every stream at the old default


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("long"), "qwen3", max_position_embeddings=4096)


def test_the_default_budget_is_per_device(long_context_model: Path) -> None:
    assert (
        resolve_config(EngineConfig(device="cpu"), long_context_model).max_prefill_length
        == CPU_PREFILL_BUDGET
    )
    assert CPU_PREFILL_BUDGET <= 512 < GPU_PREFILL_BUDGET  # seconds of CPU per step at most
    given = EngineConfig(device="cpu", max_prefill_length=1000)
    assert resolve_config(given, long_context_model).max_prefill_length == 1000


def test_streams_get_a_token_every_step_while_a_long_prompt_is_prefilled(long_context_model: Path) -> None:
    llm = final.LLM(str(long_context_model), device="cpu")
    streams = [llm.add_request([5 + i, 6, 7, 8], SamplingParams(temperature=0, ignore_eos=True, max_tokens=200)) for i in range(8)]  # fmt: skip
    while llm.core.scheduler.num_waiting or any(r.num_generated == 0 for r in llm.core.scheduler.running):
        llm.step()  # the streams are admitted and decoding
    long = llm.add_request(
        [3 + i % 400 for i in range(LONG_PROMPT)], SamplingParams(temperature=0, max_tokens=2)
    )
    before = {rid: llm.core.scheduler.by_rid[rid].num_generated for rid in streams}
    steps = 0
    while llm.core.scheduler.by_rid[long].num_generated == 0:
        llm.step()
        steps += 1
        for rid in streams:  # every step of the long prompt's prefill gave every stream a token
            assert llm.core.scheduler.by_rid[rid].num_generated == before[rid] + steps
    assert steps >= LONG_PROMPT // 512, "the long prompt was not cut into chunks of a few hundred tokens"
