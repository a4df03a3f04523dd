"""final/'s attention backends on a CUDA GPU, with their real kernels.

Kernel level: each backend against the torch backend on fresh random pages (bf16): page sizes 1,
16, 64 and 256 where the backend takes them (where it does not, the refusal is checked instead),
GQA groups 1 to 8, head sizes 64 and 128, a ragged prefill batch (a fresh prompt, a radix hit
plus a chunk, a later chunk of a long prompt, a decoding request) and a decode batch; then decode
captured in a CUDA graph and replayed over new rows and lengths.

Engine level: each backend and hybrid through final/ against the torch backend (near-tie
comparison), eagerly and with decode graphs, with radix hits and chunked prompts; `auto`.

Compilation: FlashAttention 4 compiles one kernel per compile key; prompts of any length after a
short warm-up must find theirs compiled (issue 26: a 512-token prompt compiled a second one).
Its compiled call replayed without its Python interface (fa4_replay.py) gives the official
call's output bit for bit, over lengths, batch sizes and page sizes.

Run them with `bash scripts/gpu_run.sh test-attn` (the device kit brings flash-attn-4 and
FlashInfer). tests/final/attention/test_final_attention_backends.py checks the same logic on the CPU.
"""

from __future__ import annotations

import importlib
import random
from itertools import product

import pytest
import torch

import final
from final.attention.choose import resolve_attention
from final.attention.fa_backend import FlashAttention4
from final.attention.factory import create_backend
from final.attention.registry import auto_candidates
from final.attention.torch_backend import TorchBackend
from final.core.errors import UserError
from final.core.sampling_params import SamplingParams
from tests.fixtures.gpu_compare import KERNEL_ATOL, assert_agree_until_near_tie, free_gpu_memory
from tests.fixtures.paged_batches import (
    attention_config,
    make_batch,
    make_pool_and_table,
    make_qkv,
    scattered_pages,
    write_pages,
)
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts

pytestmark = pytest.mark.gpu

KV_HEADS = 2
# (page size, GQA group, head size). FlashAttention 4 compiles in seconds: every combination.
# FlashInfer and XQA compile each kernel for about a minute: a covering subset.
CASES = {
    "fa": list(product([1, 16, 64, 256], [1, 2, 4, 8], [64, 128])),
    "fi": [(1, 1, 64), (16, 2, 128), (64, 4, 64), (256, 8, 128), (16, 8, 64), (1, 4, 128)],
    "trtllm": [
        (16, 1, 64),
        (16, 2, 128),
        (32, 4, 128),
        (64, 8, 64),
        (64, 2, 128),
        (1, 2, 128),
        (256, 2, 128),
    ],
}
# A fresh prompt, a radix hit (120 cached) plus a chunk of 90, the third chunk of a long prompt,
# a decoding request, a one-token prompt.
PREFILL = ([37, 90, 64, 1, 1], [37, 210, 700, 333, 1])
DECODE = ([1, 1, 1, 1], [1, 210, 701, 64])  # rows 4, 1, 2, 3
PAGES_FOR = [37, 210, 701, 333, 1]  # the tokens each row's pages must hold


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


@pytest.fixture(scope="module")
def capability():
    return torch.cuda.get_device_capability()


def spec_for(name: str, capability) -> str:
    """The backend alone; TRT-LLM prefills only on 10.x, so elsewhere torch prefills for it."""
    return "torch,trtllm" if name == "trtllm" and capability[0] != 10 else name


def build_backend(spec: str, config, pool, table):
    """What the engine does: resolve `--attn spec` for this pool and model, then build it."""
    choice = resolve_attention(spec, pool.k.device, pool.k.dtype, pool.page_size, head_dim=config.head_dim)
    return create_backend(choice, config, pool, table)


def setup(name, capability, page_size, group, head_dim, seq_lens):
    context = max(1024, *seq_lens)
    config = attention_config(head_dim, heads=KV_HEADS * group, kv_heads=KV_HEADS, max_context=context)
    num_pages = sum(-(-n // page_size) for n in seq_lens) + 4
    pool, table = make_pool_and_table(
        config, page_size, num_pages, rows=8, device="cuda", dtype=torch.bfloat16
    )
    write_pages(table, scattered_pages(page_size, seq_lens, num_pages))
    backend = build_backend(spec_for(name, capability), config, pool, table)
    return config, pool, table, backend, TorchBackend(config, pool, table)


def compare(backend, reference, batch, config, seed):
    q, k, v = make_qkv(batch, config, torch.bfloat16, seed)
    reference.prepare(batch)
    want = reference.forward(0, q, k, v, batch)
    backend.prepare(batch)
    got = backend.forward(0, q, k, v, batch)
    torch.cuda.synchronize()
    return rel_error(got, want)


@pytest.mark.parametrize(
    ("name", "page_size", "group", "head_dim"),
    [(name, *case) for name, cases in CASES.items() for case in cases],
)
def test_kernels_match_the_torch_backend(capability, name, page_size, group, head_dim):
    if name == "trtllm" and page_size not in (16, 32, 64):
        with pytest.raises(UserError, match="16, 32 or 64"):
            setup(name, capability, page_size, group, head_dim, PAGES_FOR)
        return
    config, pool, table, backend, reference = setup(name, capability, page_size, group, head_dim, PAGES_FOR)
    prefill = make_batch(table, page_size, list(range(5)), *PREFILL)
    assert compare(backend, reference, prefill, config, seed=1) < 2e-2
    decode = make_batch(table, page_size, [4, 1, 2, 3], *DECODE)
    assert compare(backend, reference, decode, config, seed=2) < 2e-2


def test_fi_plans_from_pinned_host_memory(capability, monkeypatch):
    """plan() copies its host inputs to the device without blocking; from pageable memory such a
    copy may first wait for the stream, which under overlap still runs the step in flight (stage 06
    pins them for that reason): every host tensor final/ hands plan() is pinned."""
    config, pool, table, backend, _ = setup("fi", capability, 16, 2, 128, PAGES_FOR)
    seen: list[torch.Tensor] = []
    for wrapper in {id(w): w for w in (backend.prefill_wrapper, backend.decode_wrapper)}.values():

        def spy(*args, _plan=wrapper.plan, **kwargs):
            seen.extend(
                t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor) and t.device.type == "cpu"
            )
            return _plan(*args, **kwargs)

        monkeypatch.setattr(wrapper, "plan", spy)
    backend.prepare(make_batch(table, 16, list(range(5)), *PREFILL))
    backend.prepare(make_batch(table, 16, [4, 1, 2, 3], *DECODE))
    # prefill: qo_indptr, kv_indptr, last_page_len, seq_lens; decode: kv_indptr, last_page_len
    assert len(seen) == 6
    assert all(t.is_pinned() for t in seen), [t.is_pinned() for t in seen]


# The refusal names both hybrids that decode with TRT-LLM, in the attention registry's order (which
# is not the lesson): both must be there, whichever comes first.
BOTH_HYBRIDS = r"(?s)(?=.*--attn fa,trtllm)(?=.*--attn fi,trtllm)"


def test_trtllm_prefill_outside_blackwell_is_refused_not_run(capability):
    config = attention_config(128, heads=8, kv_heads=KV_HEADS, max_context=1024)
    pool, table = make_pool_and_table(config, 16, 8, device="cuda", dtype=torch.bfloat16)
    if capability[0] == 10:
        assert build_backend("trtllm", config, pool, table).name == "trtllm"
        return
    with pytest.raises(UserError, match=BOTH_HYBRIDS):
        build_backend("trtllm", config, pool, table)


@pytest.fixture
def tensor_cores_from_batch_1(tensor_core_bounds):
    """FlashInfer's tensor-core decode for a group of 2 at every batch and context: the kernel a
    Qwen3-0.6B decode step of TENSOR_CORE_MIN_BATCH rows and long contexts runs, at these tests'
    small batches."""
    tensor_core_bounds("1", "0")


@pytest.mark.parametrize("page_size", [1, 16])
def test_a_group_of_two_on_tensor_cores_matches_torch(capability, tensor_cores_from_batch_1, page_size):
    config, pool, table, backend, reference = setup("fi", capability, page_size, 2, 128, PAGES_FOR)
    decode = make_batch(table, page_size, [4, 1, 2, 3], *DECODE)
    assert backend.graph_variant(decode) is True
    assert compare(backend, reference, decode, config, seed=3) < 2e-2
    assert backend.current is backend.decode_wrappers[True]


@pytest.mark.parametrize(
    ("name", "tensor_cores"),
    [("fa", False), ("fi", False), ("fi", True), ("trtllm", False)],
    ids=["fa", "fi", "fi-tensor-cores", "trtllm"],
)
def test_decode_replayed_in_a_cuda_graph_matches_eager_torch(capability, request, name, tensor_cores):
    page_size, group, head_dim, size = 16, 2, 128, 4
    lens = [[700, 1, 333, 64], [64, 210], [1, 1, 1]]
    if tensor_cores:
        request.getfixturevalue("tensor_cores_from_batch_1")
    config, pool, table, backend, reference = setup(
        name, capability, page_size, group, head_dim, [700, 210, 333, 64]
    )
    if name == "fi":
        assert backend.graph_variants(size) == (tensor_cores,)
    pad = table.padding_row
    static = make_batch(table, page_size, [pad] * size, [1] * size, [1] * size)  # GraphRunner's capture batch
    q_static = torch.zeros(size, config.num_heads, head_dim, device="cuda", dtype=torch.bfloat16)
    kv_static = torch.zeros(size, KV_HEADS, head_dim, device="cuda", dtype=torch.bfloat16)
    out_static = torch.zeros(size, config.num_heads * head_dim, device="cuda", dtype=torch.bfloat16)
    backend.prepare_for_capture(static)

    def step():
        out_static.copy_(backend.forward(0, q_static, kv_static, kv_static, static))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: kernels compile and allocate outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed, seq_lens in enumerate(lens):
        rows = list(range(len(seq_lens)))
        n, fill = len(rows), size - len(rows)
        real = make_batch(table, page_size, rows, [1] * n, seq_lens)
        padded = make_batch(table, page_size, rows + [pad] * fill, [1] * size, seq_lens + [1] * fill)
        static.rows.copy_(padded.rows)
        static.seq_lens_t.copy_(padded.seq_lens_t)
        static.out_slots.copy_(padded.out_slots)
        q, k, _ = make_qkv(padded, config, torch.bfloat16, seed)
        q_static.copy_(q)
        kv_static.copy_(k)
        backend.prepare_for_replay(type(static)(**{**vars(static), "seq_lens": padded.seq_lens}))
        graph.replay()
        reference.prepare(real)
        want = reference.forward(0, q[:n], k[:n], k[:n], real)
        torch.cuda.synchronize()
        assert rel_error(out_static[:n], want) < 2e-2, f"replay {seed}"


def fa4_kernels() -> set:
    """The keys of FlashAttention 4's forward kernels compiled in this process: interface.py keeps
    them in `_flash_attn_fwd.compile_cache`, a JITCache whose dict `cache` maps key -> kernel."""
    from flash_attn.cute import interface

    cache = getattr(getattr(interface._flash_attn_fwd, "compile_cache", None), "cache", None)
    assert isinstance(cache, dict), "flash-attn-4 moved its compile cache: find it in interface.py"
    return set(cache)


def new_kernels(before: set, after: set) -> str:
    """How many kernels were compiled, and where their keys differ from an older one's."""
    added, old = after - before, next(iter(before), None)
    spots = (
        [[i for i, (a, b) in enumerate(zip(key, old, strict=True)) if a != b] for key in added] if old else []
    )
    return f"{len(added)} more kernel(s); key positions that differ from an earlier key: {spots}"


@pytest.mark.parametrize(("page_size", "group"), [(16, 2), (1, 8), (128, 1)])
def test_fa4_compiles_one_kernel_per_phase_whatever_the_lengths(capability, page_size, group):
    lengths = [1, 2, 16, 17, 63, 64, 65, 127, 129, 512, 1000, 2048, 4100]
    rows = [4100, 2100, 700, 130]  # the tokens each row's pages hold
    config, pool, table, backend, _ = setup("fa", capability, page_size, group, 128, rows)
    start = fa4_kernels()
    # The bench harness's warm-up: two 16-token prompts, then their decode.
    for query_lens, seq_lens in (([16, 16], [16, 16]), ([1, 1], [17, 17])):
        batch = make_batch(table, page_size, [0, 1], query_lens, seq_lens)
        compare_shapes_only(backend, batch, config)
    warm = fa4_kernels()
    assert len(warm - start) <= 2, new_kernels(start, warm)  # one prefill, one decode (or found)
    for n in lengths:  # a fresh prompt, a chunk after a cached prefix, a decode, at each length
        for query_lens, seq_lens in (([n], [n]), ([max(2, n // 2)], [max(2, n)]), ([1], [n])):
            compare_shapes_only(backend, make_batch(table, page_size, [0], query_lens, seq_lens), config)
    ragged = make_batch(table, page_size, [0, 1, 2, 3], [300, 2100, 1, 65], [4100, 2100, 700, 130])
    compare_shapes_only(backend, ragged, config)
    assert fa4_kernels() == warm, new_kernels(warm, fa4_kernels())


@pytest.mark.parametrize("page_size", [1, 16])
def test_fa4_replay_matches_the_official_call_bit_for_bit(capability, page_size):
    """fa4_replay.py against FlashAttention 4's official call, on the same fresh random q: prefill
    batches of 1 to 8 requests of 1 to 2,000 new tokens over cached prefixes, one of 300 requests
    (past the interface's batch-lookup threshold), decode batches of 1 to 300; q contiguous and
    as the model's strided view. Bit for bit equal. On Hopper each kind of call but a prefill of
    more requests than the threshold (the interface computes a lookup aid for it) is replayed
    after its first; the interface is entered once per kind, and again only for that one."""
    module = importlib.import_module("flash_attn.cute")
    threshold = module.interface.BIN_BATCH_SEARCH_THRESH
    rng = random.Random(page_size)
    rows = 300
    row_lens = [rng.randint(1, 2100) for _ in range(8)] + [rng.randint(1, 300) for _ in range(rows - 8)]
    config = attention_config(128, heads=KV_HEADS * 2, kv_heads=KV_HEADS, max_context=2100)
    num_pages = sum(-(-n // page_size) for n in row_lens) + 4
    pool, table = make_pool_and_table(
        config, page_size, num_pages, rows=rows, device="cuda", dtype=torch.bfloat16
    )
    write_pages(table, scattered_pages(page_size, row_lens, num_pages))
    backend = build_backend("fa", config, pool, table)
    official, replayed = FlashAttention4(module, replay=False), FlashAttention4(module, replay=True)
    entered = 0

    def counted(*args, **kwargs):
        nonlocal entered
        entered += 1
        return module.flash_attn_varlen_func(*args, **kwargs)

    replayed.attention = counted
    steps = []  # (rows, query lens, seq lens)
    for _ in range(8):
        picked = rng.sample(range(8), rng.randint(1, 8))
        seq_lens = [rng.randint(1, row_lens[r]) for r in picked]
        steps.append((picked, [rng.randint(1, min(s, 2000)) for s in seq_lens], seq_lens))
    for _ in range(2):  # more requests than the threshold, short chunks
        seq_lens = [rng.randint(1, n) for n in row_lens]
        steps.append((list(range(rows)), [rng.randint(1, min(s, 4)) for s in seq_lens], seq_lens))
    for size in (1, 2, 7, 64, 255, 257, 300, 3, 300):
        picked = rng.sample(range(rows), size)
        steps.append((picked, [1] * size, [rng.randint(1, row_lens[r]) for r in picked]))
    big_prefills = 0
    for seed, (picked, query_lens, seq_lens) in enumerate(steps):
        batch = make_batch(table, page_size, picked, query_lens, seq_lens)
        q, _, _ = make_qkv(batch, config, torch.bfloat16, seed)
        q = q.contiguous() if seed % 2 else q  # the fused kernel's q, or the model's strided view
        backend.prepare(batch)
        phase = "prefill" if batch.is_prefill else "decode"
        args = (q, pool.k[0], pool.v[0], backend.metadata, backend.scale)
        want, got = getattr(official, phase)(*args), getattr(replayed, phase)(*args)
        torch.cuda.synchronize()
        assert torch.equal(got, want), (phase, len(picked), page_size, seed)
        big_prefills += batch.is_prefill and len(picked) > threshold
    kinds = replayed.replay.kinds
    if capability[0] != 9:  # the interface every time
        assert kinds == {} and entered == len(steps)
        return
    # A kind is (phase, ..., more requests than the threshold): fa4_replay.FA4Replay.__call__.
    refused = [kind for kind, r in kinds.items() if r is None and not (kind[0] == "prefill" and kind[-1])]
    assert not refused, refused
    assert entered <= len(kinds) + big_prefills, (entered, len(kinds), big_prefills)


def compare_shapes_only(backend, batch, config) -> None:
    q, k, v = make_qkv(batch, config, torch.bfloat16, seed=0)
    backend.prepare(batch)
    out = backend.forward(0, q, k, v, batch)
    torch.cuda.synchronize()
    assert out.shape == (batch.num_tokens, config.num_heads * config.head_dim) and out.isfinite().all()


# ---------------------------------------------------------------------------------------------
# Through the engine


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("gpu_attention_qwen3"), "qwen3", head_dim=128)


def workload(model_dir):
    base = sample_prompts(model_dir, n=12, seed=17)
    head = base[1] + base[2][:20]  # 80 tokens: later prompts hit the radix cache
    prompts = base + [head] + [head + p[:5] for p in base[3:7]]
    arrivals = [0, 0, 1, 1, 2, 3, 5, 5, 6, 8, 8, 9, 1, 12, 12, 13, 13]
    return prompts, arrivals


def run(llm: final.LLM, prompts, arrivals) -> list[final.RequestOutput]:
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=10**6)
    rids, outputs, step = {}, {}, 0
    while len(outputs) < len(prompts):
        for i, at in enumerate(arrivals):
            if at == step:
                rids[i] = llm.add_request(prompts[i], params)
        by_rid = {rid: i for i, rid in rids.items()}
        for rid, out in llm.step():
            outputs[by_rid[rid]] = out
        llm.core.check_integrity()
        step += 1
        assert step < 5000
    return [outputs[i] for i in range(len(prompts))]


POOL_TOKENS = 4096  # the workload's 17 requests of at most 92 tokens, all at once, with room to spare


def engine(model_dir, attn: str, graphs: int, page_size: int | None = 16) -> final.LLM:
    """`page_size` None: the one `attn` resolves to (auto: the table's pick), and the pool holds
    POOL_TOKENS in pages of that size."""
    size = page_size or resolve_attention(attn, "cuda", torch.bfloat16).page_size
    return final.LLM(str(model_dir), device="cuda", dtype="bfloat16", attn=attn, cuda_graph_max_bs=graphs,
                     page_size=page_size, num_pages=POOL_TOKENS // size, max_prefill_length=40)  # fmt: skip


@pytest.fixture(scope="module")
def reference_outputs(gpu_model_dir):
    prompts, arrivals = workload(gpu_model_dir)
    llm = engine(gpu_model_dir, "torch", 0)
    outs = run(llm, prompts, arrivals)
    vocab = llm.config.vocab_size
    del llm
    free_gpu_memory()
    return outs, vocab


@pytest.mark.parametrize("graphs", [0, 16])
@pytest.mark.parametrize("spec", ["fa", "fa,fi", "fi,fa", "fa,trtllm", "fi,trtllm", "torch,trtllm", "trtllm"])
def test_engine_matches_the_torch_backend(gpu_model_dir, reference_outputs, capability, spec, graphs):
    if spec == "trtllm" and capability[0] != 10:
        with pytest.raises(UserError, match=BOTH_HYBRIDS):
            engine(gpu_model_dir, spec, graphs)
        return
    want, vocab = reference_outputs
    prompts, arrivals = workload(gpu_model_dir)
    llm = engine(gpu_model_dir, spec, graphs)
    assert llm.core.executor.runner.backend.name == spec
    assert (llm.core.executor.graphs is not None) == bool(graphs), "the backend refused graphs"
    got = run(llm, prompts, arrivals)
    del llm
    free_gpu_memory()
    assert sum(o.cached_tokens for o in got) > 0, "no radix hit"
    compared = assert_agree_until_near_tie(got, want, vocab, atol=KERNEL_ATOL)
    assert compared >= 4 * len(prompts)


def test_auto_picks_the_table_entry_and_its_page_size(gpu_model_dir, capability):
    expected = resolve_attention("auto", "cuda", torch.bfloat16)
    llm = engine(gpu_model_dir, "auto", 16, page_size=None)
    assert llm.core.executor.runner.backend.name in (
        expected.prefill,
        f"{expected.prefill},{expected.decode}",
    )
    assert llm.core.executor.runner.page_size == expected.page_size == llm.core.config.page_size
    if capability[0] == 9:  # the first candidates, whatever the benchmarks have put first
        prefill, decode = (auto_candidates(phase, 9)[0].name for phase in ("prefill", "decode"))
        assert (expected.prefill, expected.decode) == (prefill, decode), (
            "the device kit brings flash-attn-4 and FlashInfer: auto should pick the table's Hopper entry"
        )
    prompts, arrivals = workload(gpu_model_dir)
    outs = run(llm, prompts, arrivals)
    assert all(len(o.token_ids) == 12 for o in outs)
    del llm
    free_gpu_memory()


def test_fa4_compiles_nothing_after_the_bench_warm_up(gpu_model_dir):
    """Issue 26's benchmark: after the harness's warm-up (two 16-token prompts), prompts of every
    length, alone and together, prefilled whole (no chunking) and decoded from graphs, run on the
    kernels already compiled."""
    from stages.common.bench import warmup_workload

    llm = final.LLM(str(gpu_model_dir), device="cuda", dtype="bfloat16", attn="fa", cuda_graph_max_bs=16,
                    page_size=16, num_pages=POOL_TOKENS // 16)  # fmt: skip
    vocab = llm.config.vocab_size
    warm = warmup_workload(vocab).items
    llm.generate([it.prompt_ids for it in warm], warm[0].params, progress=False)
    compiled = fa4_kernels()
    lengths = [1, 5, 17, 40, 63, 64, 65, 100, 129, 200, 240]  # the checkpoint holds 256 tokens
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    for seed in (13, 29):  # one at a time, then all together (fresh ids: no radix hit)
        prompts = [[(seed * i + 7 * j + seed) % vocab for j in range(n)] for i, n in enumerate(lengths)]
        batches = [[p] for p in prompts] if seed == 13 else [prompts]
        for batch in batches:
            llm.generate(batch, params, progress=False)
    assert fa4_kernels() == compiled, new_kernels(compiled, fa4_kernels())
    del llm
    free_gpu_memory()
