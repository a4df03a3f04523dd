"""final/'s decode CUDA graphs (engine/graph.py), on the CPU: the batch sizes, the padding, and
replay == eager through the whole engine.

A GPU records a CUDA graph; on the CPU the graph runner takes `EagerGraph`, whose replay runs the
captured step function again. That function reads only the static buffers, so everything the
graph path adds (staging the step into static buffers, padding rows on the padding page, reading
each row's token from the token table, picking the sampled rows' logits) is checked here against
the eager path; tests/final/test_final_gpu.py runs the same comparison with real graphs.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import final
from final.attention.torch_backend import TorchBackend
from final.core.sampling_params import SamplingParams
from final.engine.graph import EagerGraph, GraphRunner, capture_sizes, padded_size
from tests.fixtures.tiny_models import sample_prompts


def test_capture_sizes_are_1_2_4_8_then_every_8():
    assert capture_sizes(1) == [1]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(8) == [1, 2, 4, 8]
    assert capture_sizes(12) == [1, 2, 4, 8, 12]
    sizes = capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and len(sizes) == 35
    assert all(b - a == 8 for a, b in zip(sizes[3:], sizes[4:], strict=False))


@pytest.mark.parametrize("batch, padded", [(1, 1), (3, 4), (4, 4), (5, 8), (9, 16), (16, 16), (17, None)])
def test_a_batch_replays_the_smallest_graph_that_holds_it(batch, padded):
    assert padded_size(capture_sizes(16), batch) == padded


class CountingGraph(EagerGraph):
    replays: Counter = Counter()

    def __init__(self, pool=None):
        super().__init__(pool)
        self.size = 0

    def replay(self) -> None:
        CountingGraph.replays[self.size] += 1
        super().replay()


def with_graphs(llm: final.LLM, max_batch: int) -> GraphRunner:
    """Give a CPU engine decode graphs (EagerGraph stand-ins) of up to `max_batch` rows."""
    runner = llm.core.executor.runner
    made: list[CountingGraph] = []

    def factory(pool):
        made.append(CountingGraph(pool))
        return made[-1]

    graphs = GraphRunner(runner, max_batch, factory)
    for (size, _kernel), graph in graphs.graphs.items():
        graph.size = size
    llm.core.executor.graphs = graphs
    return graphs


def run(llm: final.LLM, prompts, params, arrivals, aborts: dict[int, int]) -> list[final.RequestOutput]:
    """Add prompt i at step arrivals[i], abort request i at step aborts[i]; check the pool after
    every step. Outputs of aborted requests are None."""
    rids: dict[int, int] = {}
    outputs: dict[int, final.RequestOutput] = {}
    step = 0
    while len(outputs) + len(aborts) < len(prompts):
        for i, at in enumerate(arrivals):
            if at == step:
                rids[i] = llm.add_request(prompts[i], params[i])
        for i, at in aborts.items():
            if at == step and i in rids:
                llm.core.abort(rids[i])
                llm.requests.pop(rids[i], None)
        by_rid = {rid: i for i, rid in rids.items()}
        for rid, out in llm.step():
            outputs[by_rid[rid]] = out
        llm.core.check_integrity()
        step += 1
        assert step < 2000
    return [outputs.get(i) for i in range(len(prompts))]


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_replay_equals_eager_with_padding_chunks_radix_hits_preemption_and_aborts(arch, tmp_path_factory):
    from tests.fixtures.tiny_models import make_tiny_checkpoint

    model_dir = make_tiny_checkpoint(tmp_path_factory.mktemp(f"graphs_{arch}"), arch)
    base = sample_prompts(model_dir, n=10, seed=5)
    head = base[1][:40]  # a shared prefix: later prompts hit the radix cache
    prompts = base + [head + p[:8] for p in base[2:6]]
    params = [
        SamplingParams(temperature=0, max_tokens=10 + 4 * (i % 5), ignore_eos=True, logprobs=5)
        for i in range(len(prompts))
    ]
    arrivals = [0, 0, 0, 1, 2, 2, 3, 5, 8, 8, 9, 12, 12, 13]
    aborts = {4: 6, 11: 15}
    # A small pool (preemption), a small prefill budget (chunks, and 1-token prompt chunks in
    # decode-shaped steps), page size 2 (padding rows share a page table with real ones).
    kwargs = dict(page_size=2, num_pages=90, max_prefill_length=9, max_running_requests=16)
    eager = final.LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)
    graphed = final.LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)
    CountingGraph.replays.clear()
    with_graphs(graphed, max_batch=16)
    want = run(eager, prompts, params, arrivals, aborts)
    got = run(graphed, prompts, params, arrivals, aborts)
    assert sum(CountingGraph.replays.values()) > 20, "the decode steps did not replay graphs"
    assert set(CountingGraph.replays) - {1, 2, 4, 8, 16} == set()
    assert any(size in CountingGraph.replays for size in (4, 8, 16)), "no padded replay"
    assert graphed.core.scheduler.num_preemptions > 0, "the workload should preempt"
    for w, g in zip(want, got, strict=True):
        if w is None:
            assert g is None
            continue
        assert g.token_ids == w.token_ids
        for a, b in zip(g.logprobs, w.logprobs, strict=True):
            assert a["top_ids"] == b["top_ids"]
            torch.testing.assert_close(
                torch.tensor(a["top_logprobs"]), torch.tensor(b["top_logprobs"]), atol=1e-4, rtol=0
            )
    pool = graphed.core.executor.runner.pool
    assert pool.padding_page == pool.num_pages  # the padding rows' page is no request's


def test_padding_rows_write_only_the_padding_page(tiny_qwen3_dir):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=4, num_pages=64)
    CountingGraph.replays.clear()
    with_graphs(llm, max_batch=8)
    prompts = sample_prompts(tiny_qwen3_dir, n=3, seed=2)
    for p in prompts:
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    llm.step()  # the prefill: eager
    pool = llm.core.executor.runner.pool
    slots_k = pool.k.view(pool.k.shape[0], -1, *pool.k.shape[3:])  # [layers, slots, heads, dim]
    before = slots_k.clone()
    running = list(llm.core.scheduler.running)
    llm.step()  # 3 decodes, replayed as 4: one padding row
    assert CountingGraph.replays == Counter({4: 1})
    # The decode wrote each request's newest token, at position seq_len - 1, and nothing else
    # outside the padding page.
    written = set()
    for r in running:
        pos = r.num_computed - 1
        written.add(r.kv.pages[pos // pool.page_size] * pool.page_size + pos % pool.page_size)
    changed = (slots_k != before).any(dim=(0, 2, 3)).nonzero().flatten().tolist()
    padding = range(pool.padding_page * pool.page_size, (pool.padding_page + 1) * pool.page_size)
    assert {s for s in changed if s not in padding} == written, "a padding row wrote into a live page"
    assert any(s in padding for s in changed), "the padding row wrote nothing: was it padded?"


def test_torch_backend_declines_graphs_it_cannot_afford(tiny_qwen3_dir):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    backend = llm.core.executor.runner.backend
    assert isinstance(backend, TorchBackend)
    assert backend.graph_unsupported_reason(8) is None
    assert "MiB per layer" in backend.graph_unsupported_reason(10**7)


def last_token_gathers(llm: final.LLM) -> list[int]:
    """Wrap the model so that each forward appends how many gathers by its batch's
    `last_token_index` (aten::index, a kernel each on a GPU) it ran."""
    runner = llm.core.executor.runner
    model, counts = runner.model, []

    def forward(batch, backend, **kwargs):
        counts.append(0)

        class Counting(torch.overrides.TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                if func is torch.Tensor.__getitem__ and isinstance(args[1], torch.Tensor):
                    counts[-1] += args[1] is batch.last_token_index
                return func(*args, **(kwargs or {}))

        with Counting():
            return model(batch, backend, **kwargs)

    runner.model = forward
    return counts


def test_a_decode_graph_gathers_no_last_tokens(tiny_qwen3_dir):
    """Every row of a decode graph is a request's last token, so the model picks none out before
    the final norm (two index kernels a step less on a GPU: `last_token_index` is None there); a
    prefill, whose sampled rows are a few of its tokens, still does, for x and the residual."""
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=4, num_pages=64)
    with_graphs(llm, max_batch=4)
    counts = last_token_gathers(llm)
    for p in sample_prompts(tiny_qwen3_dir, n=2, seed=3):
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    llm.step()  # the prefill: eager, two prompts' last tokens out of many
    assert counts == [2]
    CountingGraph.replays.clear()
    llm.step()  # a decode step, replayed
    assert CountingGraph.replays == Counter({2: 1}) and counts == [2, 0]


def test_a_decode_graph_writes_its_logits_in_place(tiny_qwen3_dir):
    """The LM head of a decode graph writes into the graph runner's static logits (`out`), so no
    [batch, vocab] copy follows it (78 MB at batch 256 of Qwen3's vocabulary); the step's logits
    are those rows, and they equal an eager forward's."""
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=4, num_pages=64)
    graphs = with_graphs(llm, max_batch=4)
    head = llm.core.executor.runner.model.lm_head
    written: list[int] = []
    original = head.forward

    def forward(x, out=None):
        logits = original(x, out=out)
        written.append(logits.data_ptr())
        return logits

    head.forward = forward
    for p in sample_prompts(tiny_qwen3_dir, n=3, seed=4):
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    llm.step()  # the prefill: eager, logits of its own
    assert written[-1] != graphs.logits.data_ptr()
    llm.step()  # a decode step, replayed
    assert written[-1] == graphs.logits.data_ptr()


def test_linear_into_out_on_the_cpu():
    """gemv.linear's `out` where no GEMV kernel runs (torch.mm / addmm): F.linear's numbers, in
    the given rows."""
    from final.kernels import gemv

    torch.manual_seed(0)
    x, w, b = torch.randn(3, 16), torch.randn(40, 16), torch.randn(40)
    for bias in (None, b):
        buffer = torch.full((5, 40), 7.0)
        got = gemv.linear(x, w, bias, out=buffer[:3])
        assert got.data_ptr() == buffer.data_ptr() and (buffer[3:] == 7).all()
        torch.testing.assert_close(got, torch.nn.functional.linear(x, w, bias))


def test_staging_a_decode_step_is_one_copy(tiny_qwen3_dir):
    """A decode graph reads its rows and lengths where the step's one host-to-device transfer put
    them (ModelRunner.decode_views), so staging a step copies nothing on the device after it: one
    `copy_`, the transfer (three more before: rows, lengths and the sampled rows' indices)."""
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=4, num_pages=64)
    with_graphs(llm, max_batch=4)
    runner = llm.core.executor.runner
    copies: list[int] = []
    stage = runner.stage_decode

    class Counting(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            copies[-1] += func is torch.Tensor.copy_
            return func(*args, **(kwargs or {}))

    def counted(step, size):
        copies.append(0)
        with Counting():
            return stage(step, size)

    runner.stage_decode = counted
    for p in sample_prompts(tiny_qwen3_dir, n=3, seed=5):
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    llm.step()  # the prefill
    llm.step()  # a decode step, replayed: 3 rows padded to 4
    rows, seq_lens = runner.decode_views(4)
    assert copies == [1]
    assert rows[3].item() == runner.page_table.padding_row and seq_lens[3].item() == 1


def test_a_size_with_two_kernels_gets_a_graph_each_and_replays_the_one_picked(tiny_qwen3_dir, monkeypatch):
    """Where the attention backend picks its decode kernel by more than the batch size (FlashInfer's
    tensor cores for long contexts), each size gets a graph per kernel (`graph_variants`), captured
    with that kernel, and a step replays the graph of the kernel the backend picks for that step
    (`graph_variant`: here by the mean context, which crosses the line as the requests decode)."""
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=4, num_pages=64)
    backend = llm.core.executor.runner.backend
    prompts = sample_prompts(tiny_qwen3_dir, n=2, seed=6)
    line = sum(len(p) for p in prompts) / 2 + 3  # the mean context of the third decode step on

    def mean(batch) -> float:
        real = [n for n in batch.seq_lens if n > 1]  # the padding rows' length is 1
        return sum(real) / len(real)

    captured, replayed = [], []
    capture, replay = backend.prepare_for_capture, backend.prepare_for_replay
    monkeypatch.setattr(
        backend, "graph_variants", lambda size: ("short", "long") if size >= 2 else ("short",)
    )
    monkeypatch.setattr(backend, "graph_variant", lambda batch: "long" if mean(batch) >= line else "short")
    monkeypatch.setattr(
        backend,
        "prepare_for_capture",
        lambda batch, v=None: (captured.append((batch.size, v)), capture(batch, v)),
    )
    monkeypatch.setattr(
        backend, "prepare_for_replay", lambda b, v=None: (replayed.append((b.size, v, mean(b))), replay(b, v))
    )
    graphs = with_graphs(llm, max_batch=4)
    want = {(4, "short"), (4, "long"), (2, "short"), (2, "long"), (1, "short")}
    assert set(graphs.graphs) == want and sorted(captured) == sorted(want)
    for key, graph in graphs.graphs.items():
        graph.size = key
    for p in prompts:
        llm.add_request(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    CountingGraph.replays.clear()
    while llm.has_unfinished():
        llm.step()
    assert replayed and all(v == ("long" if m >= line else "short") for _, v, m in replayed)
    assert CountingGraph.replays[2, "short"] > 0 and CountingGraph.replays[2, "long"] > 0
    assert sum(CountingGraph.replays.values()) == len(replayed)
