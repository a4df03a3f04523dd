"""final/'s FP8 KV cache (issue 32) on a CUDA GPU, with FlashInfer's and TRT-LLM's kernels.

Kernel level: over one FP8 pool with scales other than 1.0, FlashInfer's prefill and decode (the
tensor-core decode, which an FP8 pool always takes) and TRT-LLM's XQA decode against the torch
backend, which reads the same pool back into bf16 with the same scales.

Engine level: `--kv-cache-dtype fp8_e4m3` through final/ with fi and fi,trtllm, eager and with
CUDA graphs, against the torch backend over an FP8 pool (near-tie comparison); the Triton K/V
write and the fused norm + RoPE + write kernel are what fill the pool there. `fa` refuses, `auto`
picks a backend that reads FP8, and at a fixed --memory-ratio the FP8 pool holds twice the tokens.

Run them with `bash scripts/run_gpu_tests.sh tests/final/kvcache/test_final_gpu_kv_fp8.py` (FlashInfer from the
device kit); tests/final/kvcache/test_final_kv_fp8.py checks the same logic on the CPU.
"""

from __future__ import annotations

import pytest
import torch

import final
from final.attention.choose import resolve_attention
from final.attention.factory import create_backend
from final.attention.torch_backend import TorchBackend
from final.core.errors import UserError
from final.kvcache.page_table import PageTable
from final.kvcache.pool import KVPool
from tests.final.attention.test_final_gpu_attention import (
    DECODE,
    PAGES_FOR,
    PREFILL,
    rel_error,
    run,
    workload,
)
from tests.fixtures.gpu_compare import KERNEL_ATOL, assert_agree_until_near_tie, free_gpu_memory
from tests.fixtures.paged_batches import attention_config, make_batch, make_qkv, scattered_pages, write_pages
from tests.fixtures.tiny_models import make_tiny_checkpoint

pytestmark = pytest.mark.gpu

FP8 = torch.float8_e4m3fn
SCALES = ([0.05], [0.02])  # one layer: K's and V's, as a checkpoint would carry them


def fp8_setup(spec: str, page_size: int = 16, group: int = 2):
    config = attention_config(128, heads=2 * group, kv_heads=2, max_context=1024)
    num_pages = sum(-(-n // page_size) for n in PAGES_FOR) + 4
    pool = KVPool(config, num_pages, page_size, torch.device("cuda"), FP8, compute_dtype=torch.bfloat16,
                  scales=SCALES)  # fmt: skip
    generator = torch.Generator().manual_seed(3)
    pool.k.copy_((torch.randn(pool.k.shape, generator=generator) / SCALES[0][0]).clamp(-448, 448))
    pool.v.copy_((torch.randn(pool.v.shape, generator=generator) / SCALES[1][0]).clamp(-448, 448))
    table = PageTable(8, -(-1024 // page_size), torch.device("cuda"), pool.padding_page)
    write_pages(table, scattered_pages(page_size, PAGES_FOR, num_pages))
    choice = resolve_attention(spec, "cuda", torch.bfloat16, page_size, head_dim=128, kv_dtype=FP8)
    return config, pool, table, create_backend(choice, config, pool, table), TorchBackend(config, pool, table)


def attend(backend, batch, config, seed):
    """Attention over the pool alone (k and v None: the pool is not written, both read the same)."""
    q, _, _ = make_qkv(batch, config, torch.bfloat16, seed)
    backend.prepare(batch)
    return backend.forward(0, q, None, None, batch)


@pytest.mark.parametrize("spec", ["fi", "torch,trtllm"])
def test_fp8_kernels_match_the_torch_backend_over_the_same_pool(spec):
    config, pool, table, backend, reference = fp8_setup(spec)
    assert backend.pool.is_fp8
    for phase, (rows, lens) in (("prefill", (list(range(5)), PREFILL)), ("decode", ([4, 1, 2, 3], DECODE))):
        batch = make_batch(table, 16, rows, *lens)
        error = rel_error(attend(backend, batch, config, 5), attend(reference, batch, config, 5))
        assert error < 2e-2, f"{spec} {phase}: {error:.4f}"


def test_flashinfer_decodes_fp8_on_tensor_cores():
    backend = fp8_setup("fi", group=2)[3]
    # A group of 2 takes CUDA cores over bf16, tensor cores over FP8, at every batch size. (This
    # asserted the bound method itself, always true, until session 15.)
    assert all(
        backend.use_tensor_cores(size, context) is True for size in (1, 8, 256) for context in (1, 8192)
    )


# ---------------------------------------------------------------------------------------------
# Through the engine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gpu_kv_fp8_qwen3"), "qwen3", head_dim=128)


def engine(model_dir, attn: str, graphs: int, **kwargs) -> final.LLM:
    return final.LLM(str(model_dir), device="cuda", dtype="bfloat16", attn=attn, cuda_graph_max_bs=graphs,
                     page_size=16, num_pages=256, max_prefill_length=40, kv_cache_dtype="fp8_e4m3", **kwargs)  # fmt: skip


@pytest.fixture(scope="module")
def reference_outputs(model_dir):
    prompts, arrivals = workload(model_dir)
    llm = engine(model_dir, "torch", 0)
    outs = run(llm, prompts, arrivals)
    vocab = llm.config.vocab_size
    del llm
    free_gpu_memory()
    return outs, vocab


# TRT-LLM's XQA decode over an fp8 cache lands further from the float32 reference than FlashInfer's,
# and more so the larger the logprob: one logprob in 512 came out 0.110 away on the H200 and 0.170
# away on the H100 (at -4.65: 3.7% of it), past KERNEL_ATOL's 0.1, with the same dequantized K and V.
# Its own bound, named here, rather than a wider one for all: KERNEL_ATOL plus 5% of |logprob|.
XQA_FP8_RTOL = 0.05


@pytest.mark.parametrize("graphs", [0, 16])
@pytest.mark.parametrize("spec", ["fi", "fi,trtllm"])
def test_fp8_engine_matches_the_torch_backend(model_dir, reference_outputs, spec, graphs):
    want, vocab = reference_outputs
    prompts, arrivals = workload(model_dir)
    llm = engine(model_dir, spec, graphs)
    assert llm.core.executor.runner.pool.k.dtype == FP8
    assert (llm.core.executor.graphs is not None) == bool(graphs), "the backend refused graphs"
    got = run(llm, prompts, arrivals)
    del llm
    free_gpu_memory()
    assert sum(o.cached_tokens for o in got) > 0, "no radix hit"
    rtol = XQA_FP8_RTOL if spec.endswith("trtllm") else 0.0
    compared = assert_agree_until_near_tie(got, want, vocab, atol=KERNEL_ATOL, rtol=rtol)
    assert compared >= 4 * len(prompts)


def test_fa_refuses_fp8_and_auto_picks_a_reader(model_dir):
    with pytest.raises(UserError, match="--attn fa cannot prefill with --kv-cache-dtype fp8_e4m3"):
        engine(model_dir, "fa", 0)
    llm = engine(model_dir, "auto", 0)
    assert "fa" not in llm.core.executor.runner.backend.name.split(",")
    del llm
    free_gpu_memory()


def test_the_same_memory_holds_twice_the_tokens_in_fp8(model_dir):
    tokens = {}
    for kv in ("auto", "fp8_e4m3"):
        llm = final.LLM(str(model_dir), device="cuda", dtype="bfloat16", attn="fi", page_size=16,
                        memory_ratio=0.5, cuda_graph_max_bs=0, kv_cache_dtype=kv)  # fmt: skip
        tokens[kv] = llm.core.info().kv_capacity
        del llm
        free_gpu_memory()
    assert 1.95 < tokens["fp8_e4m3"] / tokens["auto"] < 2.05, tokens
