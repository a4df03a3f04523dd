"""Stage 04 on a GPU: peak memory of a long prefill follows the budget, not the prompt; chunked
equals unchunked with FlashInfer."""

from __future__ import annotations

import pytest
import torch

from stages.common.sampling import SamplingParams
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts
from tests.stage_list import load

pytestmark = pytest.mark.gpu

stage04 = load("stages.04_chunked_prefill")
POOL_TOKENS = 65536


def peak_prefill_gb(llm, prompt_len: int) -> float:
    """Extra memory (beyond weights and pool) at the peak of one long prompt's prefill."""
    prompt = [(i * 7919) % 30000 for i in range(prompt_len)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**30


def test_peak_memory_follows_budget_not_prompt(qwen3_06b_dir):
    peaks = {}
    for budget in (1024, 4096, 40000):
        llm = stage04.LLM(str(qwen3_06b_dir), device="cuda", dtype="bfloat16", attn="fi", page_size=16,
                          num_pages=POOL_TOKENS // 16, max_prefill_length=budget, cache="naive")  # fmt: skip
        for prompt_len in (8192, 32768):
            peaks[budget, prompt_len] = peak_prefill_gb(llm, prompt_len)
        del llm
        torch.cuda.empty_cache()
    print({k: round(v, 3) for k, v in peaks.items()})
    # Under a budget, a 4x longer prompt costs about the same peak...
    for budget in (1024, 4096):
        assert peaks[budget, 32768] < 1.5 * peaks[budget, 8192] + 0.05
    # ...a 4x larger budget costs more...
    assert peaks[4096, 32768] > 2 * peaks[1024, 32768]
    # ...and without chunking the peak grows with the prompt.
    assert peaks[40000, 32768] > 3 * peaks[40000, 8192]
    assert peaks[40000, 32768] > 4 * peaks[4096, 32768]


@pytest.mark.parametrize("budget", [1, 16, 100])
def test_chunked_equals_unchunked_with_flashinfer(tmp_path, budget):
    folder = make_tiny_checkpoint(tmp_path, "qwen3", head_dim=128)
    prompts = sample_prompts(folder, n=6, seed=31)
    prompts[0] = [t for p in sample_prompts(folder, n=10, seed=32) for t in p][:200]
    outs = {}
    for name, b in (("chunked", budget), ("whole", 4096)):
        llm = stage04.LLM(str(folder), device="cuda", dtype="bfloat16", attn="fi", page_size=16,
                          num_pages=POOL_TOKENS // 16, max_prefill_length=b)  # fmt: skip
        outs[name] = llm.generate(
            prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=20)
        )
    for a, b in zip(outs["chunked"], outs["whole"], strict=True):
        assert a.token_ids[:3] == b.token_ids[:3]
        torch.testing.assert_close(torch.tensor(a.logprobs[0]["top_logprobs"]),
                                   torch.tensor(b.logprobs[0]["top_logprobs"]), atol=0.1, rtol=0)  # fmt: skip
