"""final/'s piecewise prefill graphs (engine/prefill_graph.py), on the CPU: the buckets, the
padding, and a prefill step run through the pieces (graph.EagerGraph stand-ins: a replay runs the
recorded piece again over the same static buffers) against the eager step, through the whole
engine. A GPU records real graphs; that comparison is tests/final/test_final_gpu.py's.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import final
from final.args import build_parser
from final.core.config import EngineConfig
from final.core.errors import UserError
from final.core.sampling_params import SamplingParams
from final.engine import prefill_graph
from final.engine.prefill_graph import PrefillGraphRunner, bucket_for, buckets
from final.engine.resolve import prefill_graph_tokens
from final.kernels import qk_norm_rope_kv
from tests.final.engine.test_final_graphs import CountingGraph, run  # the decode graphs' stand-in, step loop
from tests.fixtures.tiny_models import sample_prompts


def test_buckets_double_from_256_up_to_the_setting_and_the_buffers():
    assert buckets(0, 10**6) == []
    assert buckets(255, 10**6) == []
    assert buckets(256, 10**6) == [256]
    assert buckets(5000, 10**6) == [256, 512, 1024, 2048, 4096]
    # The step buffers' size (a full budget plus one decode token a running request) caps it, and
    # is the last bucket where the setting reaches it: a mixed step at a full budget replays too.
    assert buckets(16384, 9000) == [256, 512, 1024, 2048, 4096, 8192, 9000]
    assert buckets(8192, 9000) == [256, 512, 1024, 2048, 4096, 8192]
    assert buckets(10**6, 16384 + 256) == [256 << i for i in range(7)] + [16640]
    assert buckets(10**6, 4096) == [256, 512, 1024, 2048, 4096]
    assert [bucket_for([256, 512], t) for t in (1, 256, 257, 512, 513)] == [256, 256, 512, 512, None]


def config(**kwargs) -> EngineConfig:
    return EngineConfig(model="unused", **kwargs)


CUDA, CPU = torch.device("cuda"), torch.device("cpu")


def test_on_by_default_on_one_gpu_for_every_step_size(monkeypatch):
    monkeypatch.delenv(prefill_graph.ENV, raising=False)
    # A full budget plus one decode token a running request: the step buffers' size, the last bucket.
    assert prefill_graph_tokens(config(max_running_requests=64), CUDA, 8192) == 8192 + 64
    assert prefill_graph_tokens(config(piecewise_cuda_graph_max_tokens=2048), CUDA, 8192) == 2048
    assert prefill_graph_tokens(config(piecewise_cuda_graph_max_tokens=0), CUDA, 8192) is None
    # Decode graphs off means no graphs (--enforce-eager), unless the flag asks for these.
    assert prefill_graph_tokens(config(cuda_graph_max_bs=0), CUDA, 8192) is None
    assert (
        prefill_graph_tokens(config(cuda_graph_max_bs=0, piecewise_cuda_graph_max_tokens=512), CUDA, 8192)
        == 512
    )
    # One CUDA GPU only.
    assert prefill_graph_tokens(config(), CPU, 512) is None
    assert prefill_graph_tokens(config(piecewise_cuda_graph_max_tokens=512), CPU, 512) is None
    assert prefill_graph_tokens(config(tp=2), CUDA, 8192) is None  # under --tp: only where asked
    assert prefill_graph_tokens(config(tp=2, piecewise_cuda_graph_max_tokens=2048), CUDA, 8192) == 2048
    with pytest.raises(UserError, match="must be >= 0"):
        prefill_graph_tokens(config(piecewise_cuda_graph_max_tokens=-1), CUDA, 8192)


def test_the_environment_overrides_the_flag_both_ways(monkeypatch):
    monkeypatch.setenv(prefill_graph.ENV, "0")
    assert prefill_graph_tokens(config(piecewise_cuda_graph_max_tokens=4096), CUDA, 8192) is None
    monkeypatch.setenv(prefill_graph.ENV, "1024")
    assert prefill_graph_tokens(config(piecewise_cuda_graph_max_tokens=0), CUDA, 8192) == 1024
    assert prefill_graph_tokens(config(cuda_graph_max_bs=0), CUDA, 8192) == 1024
    assert prefill_graph_tokens(config(tp=2), CUDA, 8192) == 1024  # the A/B under --tp
    monkeypatch.setenv(prefill_graph.ENV, "")
    assert prefill_graph.override_max_tokens() is None
    monkeypatch.setenv(prefill_graph.ENV, "lots")
    with pytest.raises(UserError, match="FINAL_PREFILL_GRAPHS='lots'"):
        prefill_graph_tokens(config(), CUDA, 8192)


def test_a_cpu_engine_has_none_and_the_flags_reach_the_config(tiny_qwen3_dir):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    assert llm.core.executor.prefill_graphs is None
    assert prefill_graph.maybe_prefill_graphs(llm.core.executor.runner, None) is None
    args = build_parser().parse_args(["--model", "m", "--disable-piecewise-cuda-graph"])
    assert args.piecewise_cuda_graph_max_tokens == 0
    args = build_parser().parse_args(["--model", "m", "--piecewise-cuda-graph-max-tokens", "4096"])
    assert args.piecewise_cuda_graph_max_tokens == 4096


def test_running_out_of_memory_recording_them_leaves_eager_prefill(tiny_qwen3_dir, monkeypatch):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")

    def no_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(prefill_graph, "PrefillGraphRunner", no_memory)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    assert prefill_graph.maybe_prefill_graphs(llm.core.executor.runner, 4096) is None


def with_prefill_graphs(llm: final.LLM, max_tokens: int) -> PrefillGraphRunner:
    """Give a CPU engine prefill graphs (EagerGraph stand-ins), buckets from a few tokens up: the
    tiny model's steps are small, so the smallest bucket is lowered to 8 for the test."""
    made: list[CountingGraph] = []

    def factory(pool):
        made.append(CountingGraph(pool))
        return made[-1]

    graphs = PrefillGraphRunner(llm.core.executor.runner, max_tokens, factory)
    for size, pieces in graphs.graphs.items():
        for piece in pieces:
            piece.size = size
    llm.core.executor.prefill_graphs = graphs
    return graphs


@pytest.fixture
def small_buckets(monkeypatch):
    monkeypatch.setattr(prefill_graph, "SMALLEST_BUCKET", 8)


@pytest.fixture(params=["fused", "unfused"])
def kv_path(request, monkeypatch):
    """`fused`: the GPU's path on the CPU: the projection's piece writes k and v into the pool
    (its torch reference standing in for the Triton kernel), padding tokens included; `unfused`:
    the CPU's, the backend writing the real tokens' k and v."""
    if request.param == "fused":
        monkeypatch.setattr(qk_norm_rope_kv, "available", lambda qkv: True)
        monkeypatch.setattr(qk_norm_rope_kv, "triton_qk_norm_rope_kv", qk_norm_rope_kv.torch_qk_norm_rope_kv)
    return request.param


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_pieces_equal_the_eager_step_with_chunks_radix_hits_and_mixed_steps(
    arch, tmp_path_factory, small_buckets, kv_path
):
    from tests.fixtures.tiny_models import make_tiny_checkpoint

    model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp(f"prefill_graphs_{arch}"), arch)
    base = sample_prompts(model_dir, n=8, seed=7)
    head = base[1][:30]  # a shared prefix: later prompts hit the radix cache
    prompts = base + [head + p[:6] for p in base[2:5]]
    params = [SamplingParams(temperature=0, max_tokens=6 + 3 * (i % 4), ignore_eos=True, logprobs=5) for i in range(len(prompts))]  # fmt: skip
    arrivals = [0, 0, 1, 1, 2, 4, 4, 6, 7, 9, 9]
    prompts = [p[: 12 + 9 * (i % 5)] for i, p in enumerate(prompts)]  # 12 to 48 tokens: several buckets
    # A prefill budget of 40 tokens: chunked prompts, and mixed steps (prefill + running decodes).
    kwargs = dict(page_size=2, num_pages=200, max_prefill_length=40, max_running_requests=8)
    eager = final.LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)
    graphed = final.LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)
    CountingGraph.replays.clear()
    graphs = with_prefill_graphs(graphed, max_tokens=32)  # buckets 8, 16, 32: larger steps run eagerly
    assert graphs.sizes == [8, 16, 32]
    eager_steps = Counter()
    forward = graphed.core.executor.runner.forward

    def counted(step, between_layers=None):
        eager_steps[step.is_prefill] += 1
        return forward(step, between_layers)

    graphed.core.executor.runner.forward = counted
    want = run(eager, prompts, params, arrivals, aborts={})
    got = run(graphed, prompts, params, arrivals, aborts={})
    layers = len(graphs.layers)
    assert sum(CountingGraph.replays.values()) >= 3 * (layers + 1), "no prefill step replayed its pieces"
    assert all(n % (layers + 1) == 0 for n in CountingGraph.replays.values()), (
        "a step replayed part of its pieces"
    )
    assert len(CountingGraph.replays) >= 2, "every step fell in one bucket: the padding is not exercised"
    assert graphs.writes_kv == (kv_path == "fused")
    assert eager_steps[True] > 0, (
        "no prefill step was over the largest bucket: the eager fallback is not exercised"
    )
    for w, g in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids
        for a, b in zip(g.logprobs, w.logprobs, strict=True):
            assert a["top_ids"] == b["top_ids"]
            torch.testing.assert_close(torch.tensor(a["top_logprobs"]), torch.tensor(b["top_logprobs"]), atol=1e-4, rtol=0)  # fmt: skip


@pytest.mark.parametrize("kv_path", ["fused"], indirect=True)
def test_padding_tokens_write_only_the_padding_page(tiny_qwen3_dir, small_buckets, kv_path):
    """A big step leaves its slots in the step buffers; a smaller one padded after it must not write
    into those (live) slots, only into the padding page (the fused path, where the piece writes
    k and v for every token of its bucket)."""
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=4, num_pages=64)
    CountingGraph.replays.clear()
    with_prefill_graphs(llm, max_tokens=64)
    prompts = sample_prompts(tiny_qwen3_dir, n=2, seed=3)
    first = prompts[0][:40]
    llm.add_request(first, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    llm.step()  # 40 tokens, bucket 64: its slots stay in the buffers past the next step's tokens
    pool = llm.core.executor.runner.pool
    pool.k[:, pool.padding_page].zero_()  # padding tokens write the same values every step: clear them
    slots_k = pool.k.view(pool.k.shape[0], -1, *pool.k.shape[3:])  # [layers, slots, heads, dim]
    before = slots_k.clone()
    second = prompts[1][:5]
    llm.add_request(second, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    llm.step()  # 5 tokens, bucket 8: three padding tokens
    assert CountingGraph.replays[8] > 0
    changed = (slots_k != before).any(dim=(0, 2, 3)).nonzero().flatten().tolist()
    padding = range(pool.padding_page * pool.page_size, (pool.padding_page + 1) * pool.page_size)
    live = [s for s in changed if s not in padding]
    assert len(live) == len(second), f"the step wrote {len(live)} live slots for {len(second)} tokens"
    assert any(s in padding for s in changed), "the padding tokens wrote nothing: was the step padded?"


GIB = 1 << 30


@pytest.mark.parametrize(
    "decode_refused, prefill_oom, expected",
    [
        (False, False, (3 * GIB, True, True)),  # both graphs' memory is reserved
        (False, True, (1 * GIB, True, False)),  # no memory for the prefill graphs: eager prefill
        (True, False, (2 * GIB, False, True)),  # the backend takes no decode graphs
        (True, True, (0, False, False)),
    ],
)
def test_the_kv_cache_is_sized_without_both_graphs_memory(
    tiny_qwen3_dir, monkeypatch, decode_refused, prefill_oom, expected
):
    """Executor._measure_graphs on the CPU, CUDA's memory readings and the two graph runners
    stood in: a decode graph set takes 1 GiB, the prefill graphs' largest bucket 2 GiB."""
    from final.engine import executor as executor_module

    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    executor, free, asked = llm.core.executor, [64 * GIB], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free[0], 80 * GIB))

    def decode_graphs(runner, max_batch):
        free[0] -= GIB
        return object()

    class PrefillGraphs:
        def __init__(self, runner, max_tokens, graph_factory=None, largest_only=False):
            asked.append((max_tokens, largest_only))
            if prefill_oom:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
            free[0] -= 2 * GIB
            self.sizes = [max_tokens]

    monkeypatch.setattr(executor_module, "GraphRunner", decode_graphs)
    monkeypatch.setattr(prefill_graph, "PrefillGraphRunner", PrefillGraphs)
    backend_class = type(executor.runner.backend)
    monkeypatch.setattr(backend_class, "graph_unsupported_reason",
                        lambda self, batch: "refused" if decode_refused else None)  # fmt: skip
    monkeypatch.setattr(executor.runner, "page_bytes", lambda: 0)  # no scratch pool to subtract
    assert executor._measure_graphs(8, 4096) == expected
    assert asked == [(4096, True)]  # the largest bucket alone: the others reuse its pool


def generate_through_pieces(model_dir, prompts, params, honours_out: bool, monkeypatch):
    """Generate with prefill graphs, the torch backend standing in for one that writes into the
    buffer it is given (`honours_out`) or returns its own. Returns the outputs, per attention call
    given a buffer whether its result is in it, and the copies prefill_graph.py made into it."""
    import sys

    from final.attention.torch_backend import TorchBackend

    original, given, copies = TorchBackend.forward, [], [0]

    def forward(self, layer, q, k, v, batch, out=None):
        result = original(self, layer, q, k, v, batch)
        if out is not None:
            if honours_out:  # a kernel that writes into the buffer it is given
                result = out.copy_(result.view_as(out)).view(result.shape)
            given.append(result.data_ptr() == out.data_ptr())
        return result

    monkeypatch.setattr(TorchBackend, "forward", forward)
    llm = final.LLM(str(model_dir), device="cpu", dtype="float32", page_size=4, num_pages=64)
    graphs = with_prefill_graphs(llm, max_tokens=64)

    class Counting(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is torch.Tensor.copy_ and sys._getframe(1).f_code.co_filename == prefill_graph.__file__:
                copies[0] += args[0].data_ptr() == graphs.attn_out.data_ptr()
            return func(*args, **(kwargs or {}))

    with Counting():
        outputs = llm.generate(prompts, params)
    return outputs, given, copies[0]


def test_a_backend_that_writes_into_the_static_buffer_saves_the_copy(
    tiny_qwen3_dir, small_buckets, monkeypatch
):
    """The pieces hand attention their static output buffer (`out`): FlashInfer and FlashAttention
    4's replay write there and the pieces copy nothing; a backend that returns its own tensor
    (torch here, TRT-LLM) is copied in, once a layer. Both give the eager step's logits."""
    prompts = [p[:20] for p in sample_prompts(tiny_qwen3_dir, n=3, seed=9)]
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=5)
    eager = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=4, num_pages=64)
    want = eager.generate(prompts, params)
    for honours_out in (False, True):
        got, given, copies = generate_through_pieces(
            tiny_qwen3_dir, prompts, params, honours_out, monkeypatch
        )
        assert given and all(given) == honours_out and any(given) == honours_out
        assert copies == (0 if honours_out else len(given)), copies
        for w, g in zip(want, got, strict=True):
            assert g.token_ids == w.token_ids
            torch.testing.assert_close(
                torch.tensor(g.logprobs[0]["top_logprobs"]),
                torch.tensor(w.logprobs[0]["top_logprobs"]),
                atol=1e-4,
                rtol=0,
            )
