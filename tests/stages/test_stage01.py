"""Stage 01 invariants: every prompt position's logits equal HF's, for each architecture and
RoPE scaling; the default model answers; the CLI streams and reports speed."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from stages.common.sampling import SamplingParams
from tests.fixtures.tiny_models import hf_greedy, hf_logits, make_tiny_checkpoint, sample_prompts
from tests.stage_list import ROOT, load

stage01 = load("stages.01_naive_generate")
model_mod = load("stages.01_naive_generate.model")
kv_mod = load("stages.01_naive_generate.kv_cache")


def prefill_logits(llm, prompt: list[int]) -> torch.Tensor:
    cache = kv_mod.ContiguousKVCache(llm.config, len(prompt), llm.device, llm.dtype)
    ids = torch.tensor(prompt)
    return llm.model(ids, torch.arange(len(prompt)), cache, all_logits=True)


@pytest.mark.parametrize("arch", ["qwen3", "llama", "qwen2", "mistral"])
def test_prefill_logits_at_every_position_match_hf(arch, request):
    folder = request.getfixturevalue(f"tiny_{arch}_dir")
    llm = stage01.LLM(str(folder), device="cpu", dtype="float32")
    for prompt in sample_prompts(folder, n=3, seed=4):
        torch.testing.assert_close(
            prefill_logits(llm, prompt), hf_logits(folder, prompt), atol=1e-4, rtol=1e-4
        )


ROPE_SCALINGS = {
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
}  # fmt: skip


@pytest.mark.parametrize("kind", ROPE_SCALINGS)
def test_rope_scaling_matches_hf(kind, tmp_path):
    folder = make_tiny_checkpoint(tmp_path, "llama", rope_scaling=dict(ROPE_SCALINGS[kind]))
    llm = stage01.LLM(str(folder), device="cpu", dtype="float32")
    prompts = sample_prompts(folder, n=2, seed=5)
    long_prompt = [t for p in sample_prompts(folder, n=12, seed=6) for t in p][:120]  # past 32/64
    for prompt in [*prompts, long_prompt]:
        torch.testing.assert_close(
            prefill_logits(llm, prompt), hf_logits(folder, prompt), atol=1e-4, rtol=1e-4
        )
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    assert [o.token_ids for o in outs] == hf_greedy(folder, prompts, 16)


@pytest.mark.slow
def test_default_model_knows_the_capital_of_france(default_model_dir):
    llm = stage01.LLM(str(default_model_dir), device="cpu")
    ids = llm.tokenizer.encode_prompt("What is the capital of France?", chat=True)
    out = llm.generate_one(ids, SamplingParams(temperature=0, max_tokens=24))
    assert "Paris" in out.text
    assert out.finish_reason == "stop"  # it ends its answer by itself (EOS)


@pytest.mark.slow
def test_cli_streams_an_answer_and_reports_speed(default_model_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "stages.01_naive_generate", "--model", str(default_model_dir), "--chat",
         "--prompt", "What is the capital of France?", "--max-tokens", "24"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout
    assert "prefill:" in proc.stderr and "decode:" in proc.stderr and "tok/s" in proc.stderr
