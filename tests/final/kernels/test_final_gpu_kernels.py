"""final/ on a CUDA GPU: the fused kernels (FlashInfer's, final/kernels' Triton kernels, FlashInfer
sampling) against their torch references on fresh random inputs; the engine with final/kernels
against without; decode CUDA graphs against eager decode through the whole engine (fi and torch
backends, every captured size with padding, radix hits, chunked prompts, preemption and aborts),
and the graphs' memory inside the --memory-ratio budget."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import final
from final.core.model_config import load_model_config
from final.core.sampling_params import SamplingParams
from final.engine.graph import capture_sizes
from final.engine.sampler import Sampler, min_p_mask, top_k_mask, top_p_mask
from final.kernels import gemv, kv_write, qk_norm_rope_kv, step_metadata
from final.kernels import sampling as sampling_kernels
from final.models import fused
from final.models.rope import RotaryEmbedding
from tests.fixtures.gpu_compare import assert_agree_until_near_tie, free_gpu_memory
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts

pytestmark = pytest.mark.gpu


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory):
    # FlashInfer's kernels are compiled for head_dim 64, 128 and 256: use 128 (Qwen3's).
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gpu_graphs_qwen3"), "qwen3", head_dim=128)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_fused_norms_and_activation_match_torch(dtype, tokens):
    torch.manual_seed(tokens)
    x = torch.randn(tokens, 1024, device="cuda", dtype=dtype) * 3
    assert fused.use_kernels(x), "FlashInfer must be installed for this test to mean anything"
    w = torch.randn(1024, device="cuda", dtype=dtype)
    assert rel_error(fused.rms_norm(x, w, 1e-6), fused.torch_rms_norm(x, w, 1e-6)) < 1e-2
    heads = torch.randn(tokens, 16, 128, device="cuda", dtype=dtype)
    hw = torch.randn(128, device="cuda", dtype=dtype)
    assert rel_error(fused.rms_norm(heads, hw, 1e-6), fused.torch_rms_norm(heads, hw, 1e-6)) < 1e-2
    r = torch.randn_like(x)
    want_norm, want_sum = fused.torch_add_rms_norm(x.clone(), r.clone(), w, 1e-6)
    got_norm, got_sum = fused.add_rms_norm(x.clone(), r.clone(), w, 1e-6)
    assert rel_error(got_sum, want_sum) < 1e-2 and rel_error(got_norm, want_norm) < 1e-2
    gate_up = torch.randn(tokens, 2 * 3072, device="cuda", dtype=dtype)
    assert rel_error(fused.silu_and_mul(gate_up), fused.torch_silu_and_mul(gate_up)) < 1e-2


@pytest.mark.parametrize("positions_dtype", [torch.int32, torch.int64])
def test_fused_rope_matches_torch_on_strided_q_and_k(gpu_model_dir, positions_dtype):
    config = load_model_config(gpu_model_dir)
    rope = RotaryEmbedding(config, "cuda")
    torch.manual_seed(3)
    t, heads, kv_heads, dim = 37, 4, 2, config.head_dim
    qkv = torch.randn(t, (heads + 2 * kv_heads) * dim, device="cuda", dtype=torch.bfloat16)
    q, k, _ = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)  # strided, as in the model
    q, k = q.view(t, heads, dim), k.view(t, kv_heads, dim)
    positions = torch.randint(0, config.max_context, (t,), device="cuda", dtype=positions_dtype)
    want_q, want_k = fused.torch_apply_rope(q.clone(), k.clone(), positions, rope.cos_sin)
    got_q, got_k = rope(q, k, positions)
    assert rel_error(got_q, want_q) < 1e-2 and rel_error(got_k, want_k) < 1e-2


def engine(model_dir, attn: str, graphs: int, **kwargs) -> final.LLM:
    return final.LLM(str(model_dir), device="cuda", dtype="bfloat16", attn=attn, cuda_graph_max_bs=graphs,
                     **{"page_size": 16, "num_pages": 512, **kwargs})  # fmt: skip


def count_replays(llm: final.LLM, by_kernel: bool = False) -> Counter:
    """Count each captured size's replays from now on (by_kernel: each (size, kernel) graph's)."""
    counts: Counter = Counter()
    for (size, kernel), graph in llm.core.executor.graphs.graphs.items():
        original = graph.replay

        def replay(key=(size, kernel) if by_kernel else size, original=original):
            counts[key] += 1
            original()

        graph.replay = replay
    return counts


def run(llm: final.LLM, prompts, params, arrivals, aborts) -> list:
    rids, outputs, step = {}, {}, 0
    while len(outputs) + len(aborts) < len(prompts):
        for i, at in enumerate(arrivals):
            if at == step:
                rids[i] = llm.add_request(prompts[i], params)
        for i, at in aborts.items():
            if at == step and i in rids:
                llm.core.abort(rids[i])
                llm.requests.pop(rids[i], None)
        by_rid = {rid: i for i, rid in rids.items()}
        for rid, out in llm.step():
            outputs[by_rid[rid]] = out
        llm.core.check_integrity()
        step += 1
        assert step < 5000
    return [outputs.get(i) for i in range(len(prompts))]


@pytest.fixture
def tensor_cores_on_long_steps(tensor_core_bounds):
    """FlashInfer's tensor-core decode from batch 4 where the rows hold 48 tokens on average, so
    that this test's steps of 4 to 16 rows cross the line as they decode: the sizes get a graph
    per kernel, as a served Qwen3-0.6B's do from batch 64 and 1,024 tokens."""
    tensor_core_bounds("4", "48")


@pytest.mark.parametrize("attn", ["fi", "fi-tensor-cores", "torch", "torch,fi"])
def test_graph_replay_equals_eager(gpu_model_dir, request, attn):
    """Every captured size up to 16 replays (batches of 1..16 requests, so 3 replays as 4, 9 as
    16, ...), with radix hits, chunked prompts, preemption and aborts; with FlashInfer's two decode
    kernels, each size's graph of each kernel replays where the step's context picks it."""
    by_kernel = attn == "fi-tensor-cores"
    if by_kernel:
        request.getfixturevalue("tensor_cores_on_long_steps")
        attn = "fi"
    base = sample_prompts(gpu_model_dir, n=16, seed=21)
    head = base[1][:48]
    prompts = base + [head + p[:5] for p in base[2:6]]
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True, logprobs=10**6)
    # Requests arrive one by one at first (batch sizes 1, 2, 3, ...), then in bursts.
    arrivals = list(range(0, 32, 2)) + [33, 33, 34, 34]
    aborts = {5: 14, 17: 40}
    outs, replays = {}, None
    for graphs in (0, 16):
        llm = engine(gpu_model_dir, attn, graphs, max_prefill_length=40, num_pages=40)
        if graphs:
            replays = count_replays(llm, by_kernel)
            if by_kernel:
                assert llm.core.executor.runner.backend.graph_variants(16) == (False, True)
        outs[graphs] = run(llm, prompts, params, arrivals, aborts)
        assert llm.core.scheduler.num_preemptions > 0, "the pool is meant to run dry"
        vocab = llm.config.vocab_size
        del llm
        free_gpu_memory()
    if by_kernel:
        kernels = {kernel for _, kernel in replays}
        assert kernels == {False, True}, f"replayed only {kernels}: the steps never crossed the line"
        replays = Counter(size for size, _ in replays)
    assert set(replays) == set(capture_sizes(16)), f"replayed sizes {sorted(replays)}"
    pairs = [(g, e) for g, e in zip(outs[16], outs[0], strict=True) if e is not None]
    assert all(g is not None for g, _ in pairs)
    # bf16: a padded graph step sums in another order than eager (stage 05 measured 0.0502)
    compared = assert_agree_until_near_tie([g for g, _ in pairs], [e for _, e in pairs], vocab, atol=0.1)
    assert compared >= 4 * len(pairs)


def test_graphs_fit_inside_the_memory_ratio(gpu_model_dir):
    ratio = 0.5
    total = torch.cuda.mem_get_info()[1]
    sizes = {}
    for graphs in (0, 256):
        llm = final.LLM(str(gpu_model_dir), device="cuda", dtype="bfloat16", attn="fi",
                        cuda_graph_max_bs=graphs, memory_ratio=ratio, page_size=16)  # fmt: skip
        torch.cuda.synchronize()
        free = torch.cuda.mem_get_info()[0]
        sizes[graphs] = llm.core.executor.runner.num_pages
        if graphs:
            assert llm.core.executor.graphs is not None
            # The graphs were counted before the KV cache was sized: what is left is still about
            # (1 - ratio) of the card (the caching allocator's slack aside).
            assert free >= (1 - ratio) * total - (512 << 20), f"{free >> 20} MiB free of {total >> 20}"
        del llm
        free_gpu_memory()
    assert sizes[256] < sizes[0], "the graphs' memory was not subtracted from the KV cache"


@pytest.mark.parametrize("attn", ["fi", "torch"])
def test_overlap_equals_no_overlap_on_gpu(gpu_model_dir, attn):
    """Overlap on (with graphs) against overlap off, through radix hits, chunks, stop tokens,
    aborts and preemption; the pool is checked after every step."""
    base = sample_prompts(gpu_model_dir, n=12, seed=31)
    prompts = base + [base[1][:40] + p[:6] for p in base[2:5]]
    params = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[7, 11], logprobs=10**6)
    arrivals = [0, 0, 1, 1, 2, 3, 5, 8, 8, 9, 10, 14, 15, 15, 16]
    aborts = {3: 9, 9: 13}
    outs = {}
    for overlap in ("off", "on"):
        llm = engine(gpu_model_dir, attn, 16, overlap=overlap, max_prefill_length=40, num_pages=40)
        outs[overlap] = run(llm, prompts, params, arrivals, aborts)
        while llm.core.has_work():
            llm.step()
        llm.core.check_integrity()
        assert not llm.core.scheduler.retiring
        vocab = llm.config.vocab_size
        del llm
        free_gpu_memory()
    pairs = [
        (on, off)
        for on, off in zip(outs["on"], outs["off"], strict=True)
        if off is not None and on is not None
    ]
    assert len(pairs) >= len(prompts) - len(aborts)
    assert_agree_until_near_tie([a for a, _ in pairs], [b for _, b in pairs], vocab, atol=0.05)


# ------------------------------------------------------------------ final/kernels (issue 31)

FP8 = torch.float8_e4m3fn


def poisoned_pool(pages: int, page_size: int, heads: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """One layer's pool as slots (the last page the padding page), NaN everywhere: a slot the
    kernel must not touch stays NaN."""
    return torch.full(((pages + 1) * page_size, heads, dim), float("nan"), device="cuda").to(dtype)


def slots_with_padding(tokens: int, pages: int, page_size: int, padding_rows: int) -> torch.Tensor:
    live = torch.randperm(pages * page_size, device="cuda")[: tokens - padding_rows]
    padding = torch.full((padding_rows,), pages * page_size, device="cuda")  # a graph's padding rows
    return torch.cat([live, padding]).to(torch.int32)


def live_part(cache: torch.Tensor, page_size: int) -> torch.Tensor:
    return cache[: cache.shape[0] - page_size].float()  # the padding page holds garbage


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float16, FP8])
@pytest.mark.parametrize("tokens", [1, 37, 2048])
def test_kv_write_kernel_matches_index_put(page_size, cache_dtype, tokens):
    torch.manual_seed(tokens + page_size)
    act = torch.float16 if cache_dtype == torch.float16 else torch.bfloat16
    heads, kv_heads, dim, pages = 16, 8, 128, -(-tokens // page_size) + 3
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, device="cuda", dtype=act) * 200  # past fp8's 448
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)  # strided, as in the model
    v = qkv[:, (heads + kv_heads) * dim :].view(tokens, kv_heads, dim)
    slots = slots_with_padding(tokens, pages, page_size, padding_rows=min(3, tokens - 1))
    got_k, got_v = (poisoned_pool(pages, page_size, kv_heads, dim, cache_dtype) for _ in range(2))
    want_k, want_v = got_k.clone(), got_v.clone()
    assert kv_write.use_triton(k)
    kv_write.store_kv(got_k, got_v, slots, k, v, 0.37, 1.9)  # the dispatch: Triton here
    kv_write.torch_store_kv(want_k, want_v, slots, k, v, 0.37, 1.9)
    for got, want in ((got_k, want_k), (got_v, want_v)):
        torch.testing.assert_close(live_part(got, page_size), live_part(want, page_size), rtol=0, atol=0, equal_nan=True)  # fmt: skip


def rope_cache(dim: int, positions: int = 4096) -> torch.Tensor:
    inv = 1e6 ** -(torch.arange(0, dim, 2, device="cuda", dtype=torch.float32) / dim)
    angles = torch.outer(torch.arange(positions, device="cuda", dtype=torch.float32), inv)
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("tokens", [1, 7, 300])
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, FP8])
def test_fused_qk_norm_rope_kv_kernel_matches_its_reference(page_size, norm, tokens, cache_dtype):
    torch.manual_seed(tokens * 3 + norm)
    heads, kv_heads, dim = 16, 8, 128
    pages = -(-tokens // page_size) + 3
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, device="cuda", dtype=torch.bfloat16) * 4
    positions = torch.randint(0, 4096, (tokens,), device="cuda", dtype=torch.int32)
    padding = min(2, tokens - 1)
    positions[tokens - padding :] = 0  # padding rows: position 0, slot in the padding page
    slots = slots_with_padding(tokens, pages, page_size, padding)
    weights = (
        [torch.randn(dim, device="cuda", dtype=torch.bfloat16) for _ in range(2)] if norm else [None, None]
    )
    got_k, got_v = (poisoned_pool(pages, page_size, kv_heads, dim, cache_dtype) for _ in range(2))
    want_k, want_v = got_k.clone(), got_v.clone()
    args = (qkv, heads, kv_heads, positions, rope_cache(dim))
    q = qk_norm_rope_kv.qk_norm_rope_kv(*args, got_k, got_v, slots, *weights, 1e-6, 0.5, 2.0)
    want_q = qk_norm_rope_kv.torch_qk_norm_rope_kv(*args, want_k, want_v, slots, *weights, 1e-6, 0.5, 2.0)
    assert qk_norm_rope_kv.available(qkv) and q.shape == want_q.shape and q.is_contiguous()
    assert rel_error(q, want_q) < 1e-2
    got, want = live_part(got_k, page_size), live_part(want_k, page_size)
    assert torch.equal(got.isnan(), want.isnan())  # written exactly where the reference writes
    written = ~want.isnan()
    # the norm's rsqrt may differ in its last bit: a bf16 step, which fp8 rounding may widen to one of its steps
    step = 0.13 if cache_dtype == FP8 else 0.01
    assert ((got[written] - want[written]).abs() <= step * want[written].abs() + 1e-2).all()
    torch.testing.assert_close(live_part(got_v, page_size), live_part(want_v, page_size), rtol=0, atol=0, equal_nan=True)  # fmt: skip


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("batch", [1, 9, 256])
def test_step_metadata_kernels_match_their_references(page_size, batch):
    """A decode step's inputs and the attention plan's page list, one kernel each, against the torch
    ops they replace: random distinct pages, padding rows on the padding row."""
    torch.manual_seed(batch + page_size)
    width, padding, rows_total = 64, min(3, batch - 1), batch + 1
    table = torch.randperm(rows_total * width, device="cuda").view(rows_total, width).to(torch.int32)
    table[-1] = 7  # the padding row: every entry the padding page
    tokens = torch.randint(0, 150_000, (rows_total,), device="cuda", dtype=torch.int32)
    live = torch.randperm(rows_total - 1, device="cuda")[: batch - padding].to(torch.int32)
    rows = torch.cat([live, torch.full((padding,), rows_total - 1, device="cuda", dtype=torch.int32)])
    lens = torch.randint(1, width * page_size + 1, (batch - padding,), device="cuda", dtype=torch.int32)
    seq_lens = torch.cat([lens, torch.ones(padding, device="cuda", dtype=torch.int32)])
    got = [torch.full((batch,), -7, device="cuda", dtype=torch.int32) for _ in range(3)]
    want = [torch.empty(batch, device="cuda", dtype=torch.int32) for _ in range(3)]
    step_metadata.decode_inputs(tokens, table, rows, seq_lens, page_size, *got)
    step_metadata.torch_decode_inputs(tokens, table, rows, seq_lens, page_size, *want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    counts = (seq_lens + page_size - 1) // page_size
    total, most = int(counts.sum()), int(counts.max())
    out = torch.full((total + 5,), -7, device="cuda", dtype=torch.int32)
    step_metadata.kv_indices(table, rows, seq_lens, page_size, total, most, out)
    assert torch.equal(out[:total], step_metadata.torch_kv_indices(table, rows, seq_lens, page_size, total))
    assert (out[total:] == -7).all()


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("batch", [1, 9, 256])
def test_step_inputs_kernel_matches_its_reference(page_size, batch):
    """An eager step's positions, slots and table tokens (a prefill's or a mixed step's), one kernel
    against torch_step_inputs: requests of 1 to 3,000 tokens (decoding ones among them, half of
    those reading their token from the table), random distinct pages, outputs poisoned."""
    torch.manual_seed(batch * 7 + page_size)
    width, rows_total = 4096 // page_size + 1, batch + 1
    table = torch.randperm(rows_total * width, device="cuda").view(rows_total, width).to(torch.int32)
    tokens = torch.randint(0, 150_000, (rows_total,), device="cuda", dtype=torch.int32)
    rows = torch.randperm(rows_total - 1, device="cuda")[:batch].to(torch.int32)
    query_lens = torch.randint(1, 3001, (batch,), device="cuda", dtype=torch.int32)
    query_lens[torch.rand(batch, device="cuda") < 0.5] = 1
    seq_lens = query_lens + torch.randint(0, 1000, (batch,), device="cuda", dtype=torch.int32)
    from_table = ((query_lens == 1) & (torch.rand(batch, device="cuda") < 0.5)).to(torch.int32)
    total = int(query_lens.sum())
    host_ids = torch.randint(0, 150_000, (total,), device="cuda", dtype=torch.int32)
    got = [host_ids.clone(), *(torch.full((total,), -7, device="cuda", dtype=torch.int32) for _ in range(2))]
    want = [host_ids.clone(), *(torch.empty(total, device="cuda", dtype=torch.int32) for _ in range(2))]
    args = (tokens, table, rows, query_lens, seq_lens, from_table, page_size)
    step_metadata.step_inputs(*args, *got, int(query_lens.max()))
    step_metadata.torch_step_inputs(*args, *want)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


@pytest.mark.parametrize("shape", [(1024, 2048), (1024, 3072), (4096, 1024), (6144, 1024), (151936, 1024)])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8])
def test_gemv_matches_f_linear(shape, m):
    n, k = shape
    torch.manual_seed(m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) if m == 3 else None
    got = gemv.triton_linear(x, w, bias)
    want = torch.nn.functional.linear(x.float(), w.float(), None if bias is None else bias.float())
    assert got.dtype == torch.bfloat16 and rel_error(got, want) < 1e-2


@pytest.mark.parametrize("m", [1, 4, 64, 256])
def test_linear_writes_into_out_whichever_kernel_runs(m):
    """gemv.linear's `out` (the LM head into a decode graph's logits): the GEMV below its bound,
    cuBLAS above, the same numbers as without `out`, in the given rows and nowhere else."""
    n, k = 151936, 1024
    torch.manual_seed(m)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    buffer = torch.full((m + 3, n), 7.0, device="cuda", dtype=torch.bfloat16)
    got = gemv.linear(x, w, out=buffer[:m])
    assert got.data_ptr() == buffer.data_ptr() and (buffer[m:] == 7).all()
    assert rel_error(got, torch.nn.functional.linear(x.float(), w.float())) < 1e-2


def test_gemv_uses_pdl_on_hopper_and_matches_f_linear_either_way():
    """Programmatic dependent launch changes when the kernel starts, never what it computes."""
    assert gemv.use_pdl(torch.zeros(1, device="cuda")) == (torch.cuda.get_device_capability()[0] >= 9)
    x = torch.randn(2, 3072, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1024, 3072, device="cuda", dtype=torch.bfloat16) / 3072**0.5
    want = torch.nn.functional.linear(x.float(), w.float())
    for pdl in (False, gemv.use_pdl(x)):
        assert rel_error(gemv.triton_linear(x, w, pdl=pdl), want) < 1e-2


def test_a_graph_of_dependent_pdl_gemvs_replays_what_eager_computes():
    """A layer's four GEMVs, each reading the one before (kernel after kernel, nothing between), 28
    times, captured in a CUDA graph (where PDL launches become programmatic edges) and replayed on
    fresh inputs: each GEMV must wait for its predecessor's output, or the replay reads stale
    activations and differs from eager."""
    torch.manual_seed(5)
    shapes = [(4096, 1024), (1024, 2048), (6144, 1024), (1024, 3072)]  # qkv, o, gate_up, down
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for n, k in shapes] * 28

    def chain(x: torch.Tensor, pdl: bool | None = None) -> torch.Tensor:
        for w in weights:  # W scaled by 1/sqrt(K): activations stay near unit size over 112 steps
            x = gemv.triton_linear(x[:, : w.shape[1]], w, pdl=pdl)  # a prefix view of the last output
        return x

    static_x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    chain(static_x)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = chain(static_x)
    for seed in (6, 7):
        torch.manual_seed(seed)
        static_x.copy_(torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_y, chain(static_x)), f"replay differs from eager (seed {seed})"
        assert torch.equal(static_y, chain(static_x, pdl=False)), f"PDL changed the result (seed {seed})"


def sampler_for(params: list[SamplingParams], vocab_size: int = 151936) -> Sampler:
    sampler = Sampler(len(params), torch.device("cuda"), vocab_size)
    for row, p in enumerate(params):
        sampler.admit(row, p)
    return sampler


def draw_many(sampler: Sampler, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    rows = torch.arange(len(params), device="cuda", dtype=torch.int32)
    return sampler.sample(logits, rows, params, [None] * len(params)).tokens


def test_flashinfer_greedy_and_top_k_1_rows_are_argmax_exactly():
    torch.manual_seed(0)
    logits = torch.randn(256, 151936, device="cuda", dtype=torch.bfloat16) * 3
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.6, top_k=1),
        SamplingParams(temperature=0.6),
    ]
    params = [params[i % 3] for i in range(256)]
    assert sampling_kernels.available(logits)
    tokens = draw_many(sampler_for(params), logits, params)
    greedy = torch.tensor([i % 3 != 2 for i in range(256)], device="cuda")
    assert torch.equal(tokens[greedy], logits.argmax(-1)[greedy])
    assert tokens.dtype == torch.int64


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"top_k": 5},
        {"top_p": 0.7},
        {"min_p": 0.1},
        {"top_k": 8, "top_p": 0.8},
        {"top_k": 10, "top_p": 0.9, "min_p": 0.05},
    ],
)
@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_flashinfer_sampling_draws_the_reference_distribution(monkeypatch, kwargs, temperature):
    """Many draws of one row (its copies fill a batch) through FlashInfer's kernels (with a filter)
    or the Gumbel-max kernel (the temperature alone): the frequencies must be the reference's
    masked softmax, token by token."""
    calls = []
    path = "flashinfer_sample" if kwargs else "triton_sample"  # the sampler's table kernel
    real = getattr(sampling_kernels, path)
    monkeypatch.setattr(sampling_kernels, path, lambda *a, **k: calls.append(1) or real(*a, **k))
    torch.manual_seed(1)
    vocab, n = 40, 4096
    # distinct logits even in bf16 (0.15 apart): a tie at the top-k boundary would be a coin toss
    row = torch.linspace(-3, 3, vocab, device="cuda")[torch.randperm(vocab, device="cuda")]
    p = SamplingParams(temperature=temperature, **kwargs)
    params = [p] * n
    sampler = sampler_for(params, vocab)
    counts = torch.zeros(vocab, device="cuda")
    for _ in range(50):  # 204,800 draws
        tokens = draw_many(sampler, row.to(torch.bfloat16).expand(n, vocab), params)
        counts += torch.bincount(tokens, minlength=vocab)
    assert calls, f"the {path} path did not run"
    scaled = row.to(torch.bfloat16).float().unsqueeze(0) / temperature
    scaled = top_k_mask(scaled, torch.tensor([p.top_k if p.top_k > 0 else vocab], device="cuda"))
    scaled = top_p_mask(scaled, torch.tensor([p.top_p], device="cuda"))
    want = min_p_mask(scaled, torch.tensor([p.min_p], device="cuda")).softmax(-1)[0]
    freq = counts / counts.sum()
    assert (freq[want == 0] == 0).all(), "a filtered token was drawn"
    torch.testing.assert_close(freq, want, atol=0.006, rtol=0)  # ~5 standard errors at p = 0.5


@pytest.mark.parametrize("rows", [1, 4, 300])
def test_gumbel_max_draws_the_softmax_at_the_real_vocabulary(rows):
    """Qwen3's 151,936 logits, a batch of 1 and 4 (75 chunks a row) and 300 (one chunk): 40,000 draws
    and more against softmax(logits / 0.6) on the tokens that hold nearly all the mass."""
    torch.manual_seed(rows)
    vocab = 151936
    row = torch.full((vocab,), -30.0, device="cuda")
    top = torch.randperm(vocab, device="cuda")[:12]  # a dozen likely tokens anywhere in the vocabulary
    row[top] = torch.linspace(-1.5, 1.5, 12, device="cuda")
    logits = row.to(torch.bfloat16).expand(rows, vocab).contiguous()
    temperature = torch.full((rows,), 0.6, device="cuda")
    counts = torch.zeros(vocab, device="cuda")
    for _ in range(-(-40_000 // rows)):
        seed = sampling_kernels.draw_seed(logits.device)
        counts += torch.bincount(
            sampling_kernels.triton_gumbel_sample(logits, temperature, seed), minlength=vocab
        )
    want = (row.to(torch.bfloat16).float() / 0.6).softmax(-1)
    freq = counts / counts.sum()
    assert freq[top].sum() > 0.999
    torch.testing.assert_close(freq[top], want[top], atol=0.012, rtol=0)  # ~5 standard errors at 0.3


@pytest.fixture(scope="module")
def gpu_llama_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gpu_kernels_llama"), "llama", head_dim=128)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
@pytest.mark.parametrize("attn", ["fi", "torch"])
def test_engine_kernels_on_equal_kernels_off(request, monkeypatch, arch, attn):
    """The engine with final/kernels (fused norm + RoPE + K/V write, the GEMV forced on, bf16
    logits into FlashInfer's sampler) against the op-by-op path with torch's K/V store and
    F.linear, greedy, graphs on: the same tokens until a near tie."""
    model_dir = request.getfixturevalue("gpu_model_dir" if arch == "qwen3" else "gpu_llama_dir")
    prompts = sample_prompts(model_dir, n=12, seed=41)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=10**6)
    outs = {}
    for kernels in (False, True):
        with monkeypatch.context() as patch:
            if kernels:
                patch.setattr(gemv, "GEMV_MAX_M_BY_WIDTH", ((1 << 30, 8),))
            else:
                patch.setattr(qk_norm_rope_kv, "available", lambda qkv: False)
                patch.setattr(kv_write, "use_triton", lambda x: False)
            llm = engine(model_dir, attn, 16, max_prefill_length=64)
            outs[kernels] = llm.generate(prompts, params)
            vocab = llm.config.vocab_size
            del llm
            free_gpu_memory()
    compared = assert_agree_until_near_tie(outs[True], outs[False], vocab, atol=0.1)
    assert compared >= 4 * len(prompts)


@pytest.mark.parametrize("rows", [1, 4, 256])
def test_the_argmax_kernel_is_torchs_argmax_at_the_real_vocabulary(rows):
    """Qwen3's 151,936 bf16 logits, ties planted across chunks (the maximum twice, far apart):
    the greedy batch's kernel picks what torch's argmax picks, the first of equals."""
    torch.manual_seed(rows)
    vocab = 151936
    logits = torch.randn(rows, vocab, device="cuda").to(torch.bfloat16)
    top = logits.float().max(dim=-1).values + 1
    at = torch.randint(0, vocab // 2, (rows,), device="cuda")
    logits[torch.arange(rows), at] = top.to(torch.bfloat16)
    logits[torch.arange(rows), at + vocab // 2] = top.to(torch.bfloat16)  # the same value, later
    assert torch.equal(sampling_kernels.triton_argmax(logits), logits.argmax(dim=-1))


def test_the_sampling_kernel_keeps_greedy_rows_exact_beside_draws():
    """A batch of 64 whose even rows are greedy by the sampler's table: those are their argmax for
    every seed; the odd rows, flat logits at temperature 1, are draws that move with the seed."""
    torch.manual_seed(5)
    vocab, n = 151936, 64
    logits = torch.randn(n, vocab, device="cuda").to(torch.bfloat16)
    logits[1::2] = 0
    rows = torch.arange(n, dtype=torch.int32, device="cuda").flip(0)  # table rows in another order
    greedy = torch.arange(n, device="cuda") % 2 == 1  # table row r is greedy when r is odd
    temperature = torch.ones(n, device="cuda")
    greedy_rows = greedy[rows.long()]
    draws = [
        sampling_kernels.triton_sample(
            logits, rows, temperature, greedy, sampling_kernels.draw_seed(logits.device)
        )
        for _ in range(2)
    ]
    for got in draws:
        assert torch.equal(got[greedy_rows], logits.argmax(dim=-1)[greedy_rows])
    assert not torch.equal(draws[0][~greedy_rows], draws[1][~greedy_rows])
