"""Stage 01 on a GPU: logits against HF transformers on the same GPU, fp32 and bf16."""

from __future__ import annotations

import pytest
import torch

from stages.common.sampling import SamplingParams
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts
from tests.stage_list import load

pytestmark = pytest.mark.gpu

stage01 = load("stages.01_naive_generate")
kv_mod = load("stages.01_naive_generate.kv_cache")

# atol for logits: fp32 kernels differ only in summation order; bf16 rounds every activation.
TOLERANCE = {"float32": 2e-3, "bfloat16": 0.15}


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory):
    """A tiny Qwen3 with head_dim 128, the head size the real models (and fast kernels) use."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gpu_qwen3"), "qwen3", head_dim=128)


def hf_model(folder, dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype)).to("cuda").eval()


def hf_greedy_no_cache(hf, prompt: list[int], steps: int) -> list[int]:
    """Argmax decoding that ignores EOS (like ignore_eos), recomputing the sequence each step."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            ids.append(int(hf(torch.tensor([ids], device="cuda")).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prefill_logits_match_hf_on_gpu(gpu_model_dir, dtype):
    llm = stage01.LLM(str(gpu_model_dir), device="cuda", dtype=dtype)
    hf = hf_model(gpu_model_dir, dtype)
    for prompt in sample_prompts(gpu_model_dir, n=4, seed=11):
        cache = kv_mod.ContiguousKVCache(llm.config, len(prompt), llm.device, llm.dtype)
        ids = torch.tensor(prompt, device="cuda")
        ours = llm.model(ids, torch.arange(len(prompt), device="cuda"), cache, all_logits=True)
        with torch.inference_mode():
            ref = hf(ids.unsqueeze(0)).logits[0].float()
        torch.testing.assert_close(ours, ref, atol=TOLERANCE[dtype], rtol=0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_tokens_match_hf_on_gpu(gpu_model_dir, dtype):
    llm = stage01.LLM(str(gpu_model_dir), device="cuda", dtype=dtype)
    hf = hf_model(gpu_model_dir, dtype)
    steps = 16 if dtype == "float32" else 4  # bf16 rounding may flip a near-tie later on
    for prompt in sample_prompts(gpu_model_dir, n=4, seed=12):
        ref = hf_greedy_no_cache(hf, prompt, steps)
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True))[0]
        assert out.token_ids == ref
