"""final/'s FP8 KV cache against an independent implementation of the same arithmetic: HF
transformers in float32, its keys (after the q/k norm and RoPE) and values rounded to E4M3 and back
as they enter its cache (a patched `apply_rotary_pos_emb` and a hook on `v_proj`), the way the pool
stores them with scales of 1.0. Same greedy tokens, the same log-probabilities to a rounding; and
the same HF model without the rounding is measurably elsewhere, so the comparison can tell.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager

import pytest
import torch

import final
from final.core.sampling_params import SamplingParams
from tests.fixtures.tiny_models import _greedy_steps, load_hf_model, sample_prompts

E4M3 = torch.float8_e4m3fn
MODULES = {
    "qwen3": "transformers.models.qwen3.modeling_qwen3",
    "llama": "transformers.models.llama.modeling_llama",
}
TOKENS = 12


def to_e4m3_and_back(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448, 448).to(E4M3).to(x.dtype)


@contextmanager
def e4m3_kv(model, arch: str):
    """HF's keys and values rounded to E4M3 where they enter its cache."""
    module = importlib.import_module(MODULES[arch])
    rope = module.apply_rotary_pos_emb

    def rope_then_round(q, k, *args, **kwargs):
        q, k = rope(q, k, *args, **kwargs)
        return q, to_e4m3_and_back(k)

    module.apply_rotary_pos_emb = rope_then_round
    hooks = [
        layer.self_attn.v_proj.register_forward_hook(lambda _m, _i, out: to_e4m3_and_back(out))
        for layer in model.model.layers
    ]
    try:
        yield
    finally:
        module.apply_rotary_pos_emb = rope
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_fp8_engine_is_hf_with_its_kv_rounded_to_e4m3(request, arch):
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    prompts = sample_prompts(model_dir, n=6, seed=21)
    model = load_hf_model(model_dir)
    with e4m3_kv(model, arch):
        rounded = [_greedy_steps(model, p, TOKENS) for p in prompts]
    exact = [_greedy_steps(model, p, TOKENS) for p in prompts]
    params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True, logprobs=1)
    llm = final.LLM(str(model_dir), device="cpu", dtype="float32", kv_cache_dtype="fp8_e4m3")
    got = llm.generate(prompts, params, progress=False)
    far = 0.0
    for ours, (ids, logits), (_, exact_logits) in zip(got, rounded, exact, strict=True):
        assert ours.token_ids == ids
        for step, entry in enumerate(ours.logprobs):
            want = torch.log_softmax(logits[step], -1)[ids[step]].item()
            assert abs(entry["token_logprob"] - want) < 2e-3
            far = max(
                far, abs(entry["token_logprob"] - torch.log_softmax(exact_logits[step], -1)[ids[step]].item())
            )
    assert far > 1e-2, "HF without the rounding should be farther from the FP8 engine than the tolerance"
