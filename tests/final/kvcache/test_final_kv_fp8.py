"""final/'s FP8 KV cache (`--kv-cache-dtype fp8_e4m3`, issue 32) on the CPU, through the torch
backend, which reads the pool back into the model's dtype with each layer's scales:

- the flag, the pool's dtype and size: the same memory holds twice the pages of bf16;
- the write: the pool holds x / scale rounded to e4m3 (saturated at 448), with the checkpoint's
  scales where it has them; bad scales are refused;
- the accuracy on tiny models: bounded |Δ logprob| against the float32 cache, with scales 1.0
  and with calibrated ones (scripts/kv_fp8_accuracy.py's metrics);
- chunked prefill, radix hits, decode graphs (the EagerGraph stand-in), overlap, the fused K/V
  write and TP=2 give what the plain FP8 engine gives;
- a backend that cannot read FP8 refuses, naming those that can, and `auto` passes over it.

tests/final/kvcache/test_final_gpu_kv_fp8.py checks FlashInfer's and TRT-LLM's FP8 kernels on a GPU.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

import final
from final.args import build_parser, parse_args
from final.attention import support
from final.attention.choose import resolve_attention
from final.attention.registry import BACKENDS
from final.attention.spec import Auto
from final.core.config import EngineConfig
from final.core.errors import UserError
from final.core.sampling_params import SamplingParams
from final.kernels import qk_norm_rope_kv
from final.models.kv_scales import read_kv_scales
from scripts.kv_fp8_accuracy import calibrate, compare, with_scales
from tests.fixtures.tiny_models import sample_prompts

FP8 = torch.float8_e4m3fn
E4M3_HALF_STEP = 2.0**-4  # round to nearest with 3 mantissa bits: at most half a step, relative
E4M3_SUBNORMAL_HALF_STEP = 2.0**-10  # below 2^-6 the steps are 2^-9 apart (times the scale)
# |Δ logprob| of the chosen tokens, FP8 against float32, on the tiny models (whose near-flat
# distributions over 512 tokens make greedy agreement a poor measure): a cache whose every element
# is off by at most 6.25% moved them by 0.045-0.063 on average, 0.25 at the 99th percentile, with
# scales 1.0 or calibrated. A cache read back with a wrong scale, or not quantized at all (Δ = 0),
# is caught by one bound or the other.
MEAN_BOUND, P99_BOUND = 0.1, 0.4


def engine(model_dir, kv_cache_dtype: str = "fp8_e4m3", **kwargs) -> final.LLM:
    kwargs = {"dtype": "float32", "page_size": 2, "num_pages": 400, **kwargs}
    return final.LLM(str(model_dir), device="cpu", kv_cache_dtype=kv_cache_dtype, **kwargs)


def greedy(n: int = 16) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, logprobs=5)


def calibrated_dir(model_dir, tmp_path, v_shrink: float = 1.0):
    """A copy of `model_dir` with k_scale/v_scale tensors measured on its own prompts (amax / 448);
    V's divided by `v_shrink` (> 1: V's largest values saturate)."""
    llm = engine(model_dir, "auto")
    llm.generate(sample_prompts(model_dir, n=6, seed=2), greedy(1), progress=False)
    tensors = calibrate(llm)
    tensors = {k: v / v_shrink if k.endswith("v_scale") else v for k, v in tensors.items()}
    return with_scales(model_dir, tensors, tmp_path / "calibrated"), tensors


# ---------------------------------------------------------------------------------------------
# The flag, the pool, the memory


def test_the_flag_is_parsed_documented_and_checked():
    assert parse_args(["--kv-cache-dtype", "fp8_e4m3"]).engine.kv_cache_dtype == "fp8_e4m3"
    text = " ".join(build_parser().format_help().split())
    assert "--kv-cache-dtype {auto,bf16,fp8_e4m3}" in text and "twice the tokens" in text
    with pytest.raises(UserError, match="--kv-cache-dtype must be one of auto, bf16, fp8_e4m3"):
        EngineConfig(kv_cache_dtype="fp8")


def test_an_fp8_pool_holds_twice_the_pages_of_bf16_in_the_same_memory(tiny_qwen3_dir, monkeypatch, caplog):
    with caplog.at_level(logging.INFO, logger="final.engine.executor"):
        bf16 = engine(tiny_qwen3_dir, "auto", dtype="bfloat16").core.executor.runner
        fp8 = engine(tiny_qwen3_dir, dtype="bfloat16").core.executor.runner
    assert bf16.pool.k.dtype == bf16.pool.v.dtype == torch.bfloat16
    assert fp8.pool.k.dtype == fp8.pool.v.dtype == FP8 and fp8.pool.compute_dtype == torch.bfloat16
    assert 2 * fp8.page_bytes() == bf16.page_bytes()
    assert f"KV cache: {400 * 2} tokens in 400 pages (page size 2) of fp8_e4m3 (scales 1.0)" in caplog.text
    assert "of bf16; attention: torch" in caplog.text
    # Sizing on a GPU, its memory stood in: the same free bytes give twice the pages (each count is
    # one page short of what fits: the padding page).
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 << 30, 80 << 30))
    for runner in (bf16, fp8):
        monkeypatch.setattr(runner, "device", torch.device("cuda"))
    pages16, pages8 = (runner.pages_that_fit(0.9, 1 << 30) for runner in (bf16, fp8))
    assert pages16 > 1000 and (pages8 + 1) - 2 * (pages16 + 1) in (0, 1)


# ---------------------------------------------------------------------------------------------
# The write and the scales


def test_the_pool_holds_x_over_its_scale_rounded_to_e4m3(tiny_qwen3_dir, tmp_path):
    folder, tensors = calibrated_dir(tiny_qwen3_dir, tmp_path, v_shrink=4.0)
    prompt = sample_prompts(tiny_qwen3_dir, n=2, seed=9)[1]  # 60 tokens
    ref, fp8 = engine(tiny_qwen3_dir, "auto"), engine(folder)
    for llm in (ref, fp8):
        llm.generate([prompt], greedy(1), progress=False)
    runner = fp8.core.executor.runner
    k_scales, v_scales = runner.kv_scales
    assert k_scales[1] == pytest.approx(float(tensors["model.layers.1.self_attn.k_scale"]))
    assert runner.pool.layer_kv(1).v_scale == v_scales[1] != 1.0
    # Layer 0's K and V depend on the prompt alone (later layers see FP8 attention): compare them.
    for stored, want, scale in ((fp8.core.executor.runner.pool.k[0], ref.core.executor.runner.pool.k[0],
                                 k_scales[0]),
                                (runner.pool.v[0], ref.core.executor.runner.pool.v[0], v_scales[0])):  # fmt: skip
        limit = 448 * scale
        expected = want.clamp(-limit, limit)
        got = stored.float() * scale
        bound = E4M3_HALF_STEP * expected.abs() + E4M3_SUBNORMAL_HALF_STEP * scale + 1e-7
        assert want.abs().max() > 0 and ((got - expected).abs() <= bound).all()
    assert (ref.core.executor.runner.pool.v[0].abs() > 448 * v_scales[0]).any(), "V should saturate"


def test_bad_checkpoint_scales_are_refused(tiny_qwen3_dir, tmp_path):
    layers = 2
    cases = {
        "partial": (
            {"model.layers.0.self_attn.k_scale": torch.tensor(0.5)},
            "lacks 3, e.g. k_scale of layer 1",
        ),
        "negative": ({"model.layers.0.self_attn.attn.v_scale": torch.tensor(-1.0)}, "positive finite"),
        "vector": ({"model.layers.1.self_attn.k_proj.output_scale": torch.ones(4)}, "one per tensor"),
    }
    for name, (tensors, needle) in cases.items():
        folder = with_scales(tiny_qwen3_dir, tensors, tmp_path / name)
        with pytest.raises(UserError, match=needle):
            read_kv_scales(folder, layers)
    assert read_kv_scales(tiny_qwen3_dir, layers) is None
    with pytest.raises(UserError, match="lacks"):  # through the engine, before anything is served
        engine(with_scales(tiny_qwen3_dir, cases["partial"][0], tmp_path / "engine"))


# ---------------------------------------------------------------------------------------------
# Accuracy


@pytest.mark.parametrize("scales", ["one", "calibrated"])
@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_fp8_cache_stays_close_to_the_float32_cache(request, tmp_path, arch, scales):
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    folder = calibrated_dir(model_dir, tmp_path)[0] if scales == "calibrated" else model_dir
    prompts = sample_prompts(model_dir, n=12, seed=11)
    want = engine(model_dir, "auto").generate(prompts, greedy(), progress=False)
    got = engine(folder).generate(prompts, greedy(), progress=False)
    metrics = compare(want, got, 16)
    assert metrics["compared_tokens"] >= 4 * len(prompts)
    assert 1e-4 < metrics["abs_dlogprob_mean"] < MEAN_BOUND, metrics
    assert metrics["abs_dlogprob_p99"] < P99_BOUND, metrics


# ---------------------------------------------------------------------------------------------
# The engine's features, with and without, all over FP8


def shared_prefix_prompts(model_dir) -> list[list[int]]:
    base = sample_prompts(model_dir, n=8, seed=5)
    head = base[1][:40]  # later prompts share a 40-token prefix: radix hits
    return base + [head + p[:6] for p in base[2:6]]


def serve_staggered(llm: final.LLM, prompts) -> list[final.RequestOutput]:
    """Prompt i arrives at step i // 2, so prefills and decodes mix (and graphs replay)."""
    rids, outputs, step = {}, {}, 0
    while len(outputs) < len(prompts):
        for i in range(len(prompts)):
            if i // 2 == step:
                rids[llm.add_request(prompts[i], greedy(10))] = i
        for rid, out in llm.step():
            outputs[rids[rid]] = out
        llm.core.check_integrity()
        step += 1
        assert step < 2000
    return [outputs[i] for i in range(len(prompts))]


def assert_same(got, want, atol: float = 1e-4) -> None:
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(got, want, strict=True):
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert x["top_ids"][:2] == y["top_ids"][:2]
            assert abs(x["token_logprob"] - y["token_logprob"]) < atol


@pytest.mark.parametrize("variant", ["chunked", "radix", "graphs", "overlap", "fused"])
def test_fp8_features_on_equal_off(tiny_qwen3_dir, tmp_path, monkeypatch, variant):
    from tests.final.engine.test_final_graphs import CountingGraph, with_graphs

    folder = calibrated_dir(tiny_qwen3_dir, tmp_path)[0]  # scales other than 1.0 on every path
    prompts = shared_prefix_prompts(tiny_qwen3_dir)
    plain = dict(max_prefill_length=4096, cache="naive", overlap="off", max_running_requests=16)
    want = serve_staggered(engine(folder, **plain), prompts)
    changed = {
        "chunked": {"max_prefill_length": 9},
        "radix": {"cache": "radix"},
        "overlap": {"overlap": "on"},
    }.get(variant, {})
    llm = engine(folder, **{**plain, **changed})
    if variant == "graphs":
        CountingGraph.replays.clear()
        with_graphs(llm, max_batch=16)
    if variant == "fused":  # the fused norm + RoPE + K/V write, its reference standing in for the kernel
        monkeypatch.setattr(qk_norm_rope_kv, "available", lambda qkv: True)
        monkeypatch.setattr(qk_norm_rope_kv, "triton_qk_norm_rope_kv", qk_norm_rope_kv.torch_qk_norm_rope_kv)
    got = serve_staggered(llm, prompts)
    assert_same(got, want)
    if variant == "radix":
        assert sum(o.cached_tokens for o in got) >= 4 * 40 - 8, "no radix hits"
    if variant == "graphs":
        assert sum(CountingGraph.replays.values()) >= 5, "the decode steps did not replay graphs"


def test_tp2_over_fp8_matches_tp1(tiny_qwen3_dir):
    from tests.final.distributed.test_final_tp import assert_same_outputs, prompts_for, serve_two_waves

    first, second = prompts_for(tiny_qwen3_dir, 10**6)
    kwargs = {"device": "cpu", "max_prefill_length": 16, "kv_cache_dtype": "fp8_e4m3"}
    want = serve_two_waves(final.LLM(str(tiny_qwen3_dir), **kwargs), first, second)
    with final.LLM(str(tiny_qwen3_dir), tp=2, **kwargs) as llm:
        assert llm.core.executor.runner.pool.k.dtype == FP8
        got = serve_two_waves(llm, first, second)
    assert_same_outputs(got, want)


# ---------------------------------------------------------------------------------------------
# Backends


def test_a_backend_that_cannot_read_fp8_refuses_and_auto_passes_over_it(monkeypatch):
    monkeypatch.setattr(support, "missing_modules", lambda library: [])  # every library installed
    monkeypatch.setattr(support, "device_capability", lambda device: (9, 0))  # a Hopper GPU
    bf16 = torch.bfloat16
    with pytest.raises(UserError) as refused:
        resolve_attention("fa", "cuda", bf16, 16, kv_dtype=FP8)
    assert str(refused.value) == (
        "--attn fa cannot prefill with --kv-cache-dtype fp8_e4m3; backends that can: torch, fi, trtllm (decode)"
    )
    with pytest.raises(UserError, match="--attn trtllm cannot prefill with --kv-cache-dtype fp8_e4m3"):
        support.check_kv_dtype(BACKENDS["trtllm"], "prefill", FP8, bf16)  # its prefill: Blackwell only
    assert resolve_attention("fi,trtllm", "cuda", bf16, 16, kv_dtype=FP8).names == ("fi", "trtllm")
    assert resolve_attention("fa", "cuda", bf16, 16, kv_dtype=bf16).names == ("fa", "fa")
    # Were fa ranked first for prefill, `auto` would take it for a bf16 cache and pass over it for FP8.
    monkeypatch.setitem(BACKENDS, "fi", dataclasses.replace(BACKENDS["fi"], auto=Auto(rank=5)))
    assert resolve_attention("auto", "cuda", bf16, 16, kv_dtype=bf16).prefill == "fa"
    assert resolve_attention("auto", "cuda", bf16, 16, kv_dtype=FP8).prefill == "fi"
