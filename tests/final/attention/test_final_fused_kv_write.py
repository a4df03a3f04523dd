"""The seam between the model and the attention backends for K and V: where the fused norm +
RoPE + K/V write kernel serves, the model writes K and V into the pool itself and hands the
backend k = v = None; the backend must then not write them again.

On the CPU the kernel never serves, so these tests force the fused path with the kernel's torch
reference standing in for it: the engine must give what the op-by-op path gives, for a model
with the q/k norm (Qwen3) and one without (Llama), and no backend may call the pool's store.
"""

from __future__ import annotations

import pytest
import torch

import final
from final.core.sampling_params import SamplingParams
from final.kernels import qk_norm_rope_kv
from final.kvcache.pool import KVPool
from tests.fixtures.tiny_models import sample_prompts


def generate(model_dir, prompts, **kwargs):
    llm = final.LLM(str(model_dir), device="cpu", dtype="float32", page_size=4, num_pages=256, **kwargs)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)
    return llm.generate(prompts, params)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("attn", ["torch"])
def test_model_written_kv_equals_the_backend_written_kv(request, monkeypatch, arch, attn):
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    prompts = sample_prompts(model_dir, n=3, seed=4)
    prompts += [prompts[1][:40] + prompts[2][:5]]  # shares a 40-token prefix with prompt 1
    want = generate(model_dir, prompts, attn=attn)

    fused_calls, stores = [], []
    reference = qk_norm_rope_kv.torch_qk_norm_rope_kv

    def fused_stand_in(*args, **kwargs):
        fused_calls.append(1)
        return reference(*args, **kwargs)

    real_store = KVPool.store

    def counting_store(self, *args, **kwargs):
        stores.append(1)
        return real_store(self, *args, **kwargs)

    monkeypatch.setattr(qk_norm_rope_kv, "available", lambda qkv: True)
    monkeypatch.setattr(qk_norm_rope_kv, "triton_qk_norm_rope_kv", fused_stand_in)
    monkeypatch.setattr(KVPool, "store", counting_store)
    got = generate(model_dir, prompts, attn=attn, max_prefill_length=16)  # chunked prompts too
    assert fused_calls, "the fused path did not run"
    assert not stores, "a backend wrote K and V the model had already written"
    for ours, theirs in zip(got, want, strict=True):
        assert ours.token_ids == theirs.token_ids
        for a, b in zip(ours.logprobs, theirs.logprobs, strict=True):
            assert a["top_ids"] == b["top_ids"]
            torch.testing.assert_close(torch.tensor(a["top_logprobs"]), torch.tensor(b["top_logprobs"]))
