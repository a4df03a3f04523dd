"""Stage 05 on the CPU: the capture sizes, the padding, the static buffers, the eager fallback, and
replay == eager through the whole engine.

A CPU has no CUDA graphs, so the graph runner takes `EagerGraph`, whose replay runs the captured
step function again. That function reads only the static buffers, so everything the graph path
adds (the step written into static buffers, padding rows on the padding row and page, logits of
the sampled rows only, the torch backend's fixed-shape decode) is checked here against the eager
path; tests/stages/test_stage05_gpu.py runs the same comparison with real graphs.
"""

from __future__ import annotations

import logging
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from stages.common.errors import UserError
from stages.common.sampling import SamplingParams
from tests.fixtures.driving import full_logprobs
from tests.fixtures.tiny_models import sample_prompts
from tests.stage_list import load

stage05 = load("stages.05_cuda_graph")
graph = load("stages.05_cuda_graph.graph")
runner_module = load("stages.05_cuda_graph.runner")


def test_capture_sizes_are_1_2_4_8_then_every_8():
    assert graph.capture_sizes(1) == [1]
    assert graph.capture_sizes(3) == [1, 2, 3]
    assert graph.capture_sizes(8) == [1, 2, 4, 8]
    assert graph.capture_sizes(20) == [1, 2, 4, 8, 16, 20]
    sizes = graph.capture_sizes(256)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-1] == 256 and len(sizes) == 35
    assert all(b - a == 8 for a, b in zip(sizes[3:], sizes[4:], strict=False))


@pytest.mark.parametrize(
    "batch, padded", [(1, 1), (3, 4), (4, 4), (5, 8), (9, 16), (16, 16), (17, 20), (21, None)]
)
def test_a_batch_replays_the_smallest_graph_that_holds_it(batch, padded):
    assert graph.padded_size(graph.capture_sizes(20), batch) == padded


def fake_runner(device: str, max_running: int) -> SimpleNamespace:
    return SimpleNamespace(device=torch.device(device), max_running=max_running)


@pytest.mark.parametrize(
    "asked, max_running, captured",
    [(None, 256, 256), (None, 512, 256), (None, 48, 48), (64, 256, 64), (300, 256, 256), (0, 256, 0)],
)
def test_largest_graph_is_auto_or_asked_and_never_above_max_running(asked, max_running, captured):
    assert runner_module.ModelRunner._graph_batch(fake_runner("cuda", max_running), asked) == captured


@pytest.mark.parametrize("asked", [None, 16])
def test_cpu_runs_decode_eagerly_with_one_log_line(tiny_qwen3_dir, caplog, asked):
    caplog.set_level(logging.INFO, logger="stages.05_cuda_graph")
    caplog.clear()
    llm = stage05.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", cuda_graph_max_bs=asked)
    assert llm.runner.graphs is None
    lines = [r.getMessage() for r in caplog.records if "graph" in r.getMessage().lower()]
    assert lines == ["CUDA graphs need a GPU: decode steps run eagerly on the cpu"]


def test_graphs_off_says_nothing_and_negative_is_an_error(tiny_qwen3_dir, caplog):
    caplog.set_level(logging.INFO, logger="stages.05_cuda_graph")
    caplog.clear()
    llm = stage05.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", cuda_graph_max_bs=0)
    assert llm.runner.graphs is None
    assert not [r for r in caplog.records if "graph" in r.getMessage().lower()]
    with pytest.raises(UserError, match="--cuda-graph-max-bs must be >= 0"):
        stage05.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", cuda_graph_max_bs=-1)


class CountingGraph(graph.EagerGraph):
    """EagerGraph that counts its replays by captured size."""

    def __init__(self, replays: Counter, size_of: dict):
        super().__init__()
        self.replays, self.size_of = replays, size_of

    def replay(self) -> None:
        self.replays[self.size_of[id(self)]] += 1
        super().replay()


def with_graphs(llm, max_batch: int) -> tuple[Counter, list[list[bool]]]:
    """Give a CPU engine decode graphs (EagerGraph stand-ins) of up to `max_batch` rows; returns the
    replay counts by size and the `sampled` flags of every replayed step."""
    replays: Counter = Counter()
    size_of: dict[int, int] = {}
    made: list[CountingGraph] = []

    def make_graph(pool):
        made.append(CountingGraph(replays, size_of))
        return made[-1]

    runner = graph.GraphRunner(llm.runner, max_batch, make_graph)
    for size, g in runner.graphs.items():
        size_of[id(g)] = size
    steps: list[list[bool]] = []
    run = runner.run

    def recording_run(batch):
        steps.append(list(batch.sampled))
        return run(batch)

    runner.run = recording_run
    llm.runner.graphs = runner
    return replays, steps


def test_static_buffers_padding_row_and_page(tiny_qwen3_dir):
    llm = stage05.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=4, num_pages=64,
                      max_running_requests=12)  # fmt: skip
    runner = llm.runner
    with_graphs(llm, 12)
    graphs = runner.graphs
    assert list(graphs.graphs) == [12, 8, 4, 2, 1], "captured largest first"
    assert graphs.inputs.shape == (3, 12) and graphs.out_slots.shape == (12,)
    assert graphs.logits.shape == (12, llm.config.vocab_size) and graphs.logits.dtype == torch.float32
    # The padding page is one page past what the allocator hands out; the padding row is one row
    # past what requests can hold, and every entry of it is the padding page.
    assert runner.pool.k.shape[1] == runner.allocator.num_pages + 1 == runner.padding_page + 1
    assert runner.padding_page not in runner.allocator.free_pages
    assert runner.page_table.table.shape[0] == 13
    assert runner.padding_row not in runner.page_table.free_rows
    assert (runner.page_table.table[runner.padding_row] == runner.padding_page).all()


def run_steps(llm, prompts, params, arrivals):
    """Add prompt i at step arrivals[i]; step until all finish; check the pool after every step."""
    ids, outputs, step = {}, {}, 0
    while len(outputs) < len(prompts):
        for i, at in enumerate(arrivals):
            if at == step:
                ids[llm.add_request(prompts[i], params)] = i
        for rid, out in llm.step():
            outputs[ids[rid]] = out
        llm.scheduler.check_integrity()
        step += 1
        assert step < 2000
    return [outputs[i] for i in range(len(prompts))]


@pytest.mark.parametrize("arch, budget, num_pages", [("qwen3", 9, 80), ("llama", 1, 40)])
def test_replay_equals_eager_with_padding_chunks_radix_hits_and_preemption(arch, budget, num_pages, request):
    """A budget of 9 cuts prompts into chunks whose last piece is often one token: a decode-shaped
    step that samples. A budget of 1 feeds every prompt one token per step beside the decodes: a
    decode-shaped step whose prompt row gets no logits."""
    model_dir = request.getfixturevalue(f"tiny_{arch}_dir")
    base = sample_prompts(model_dir, n=10, seed=5)
    head = base[1][:40]  # a shared prefix: later prompts hit the radix cache
    prompts = base + [head + p[:8] for p in base[2:6]]
    arrivals = [0, 0, 0, 1, 2, 2, 3, 5, 8, 8, 9, 12, 12, 13]
    vocab = 512
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True, logprobs=vocab)
    # A small pool (preemption), a small prefill budget (chunks), pages of 2 tokens (padding rows
    # share a page table with real ones).
    kwargs = dict(device="cpu", dtype="float32", page_size=2, num_pages=num_pages, max_prefill_length=budget,
                  max_running_requests=16)  # fmt: skip
    eager = stage05.LLM(str(model_dir), **kwargs)
    graphed = stage05.LLM(str(model_dir), **kwargs)
    replays, replayed_steps = with_graphs(graphed, max_batch=16)
    want = run_steps(eager, prompts, params, arrivals)
    got = run_steps(graphed, prompts, params, arrivals)

    assert sum(replays.values()) > 20, "the decode steps did not replay graphs"
    assert any(size in replays for size in (4, 8, 16)), "no padded replay"
    if budget == 1:
        assert any(not all(sampled) for sampled in replayed_steps), "no replayed step carried a prompt chunk"
    assert graphed.scheduler.num_preemptions > 0, "the workload should preempt"
    assert max(o.cached_tokens for o in got) >= 40, "the shared head should hit the radix cache"
    for w, g in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids
        for a, b in zip(g.logprobs, w.logprobs, strict=True):
            torch.testing.assert_close(full_logprobs(a, vocab), full_logprobs(b, vocab), atol=1e-4, rtol=0)


def slots_of(pool) -> torch.Tensor:
    """The pool's K as [layers, slots, kv_heads, head_dim]."""
    return pool.k.view(pool.k.shape[0], -1, *pool.k.shape[3:]).clone()


def test_padding_rows_write_only_the_padding_page(tiny_qwen3_dir):
    llm = stage05.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", page_size=4, num_pages=64)
    prompts = sample_prompts(tiny_qwen3_dir, n=3, seed=2)
    for p in prompts:
        llm.add_request([*p, 7, 8, 9], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    llm.step()  # the prefill: eager
    pool, page_size = llm.runner.pool, llm.runner.page_size
    padding = range(llm.runner.padding_page * page_size, (llm.runner.padding_page + 1) * page_size)

    # Capturing runs every graph once, on padding rows only: nothing outside the padding page moves.
    before = slots_of(pool)
    replays, _ = with_graphs(llm, max_batch=8)
    changed = set((slots_of(pool) != before).any(dim=(0, 2, 3)).nonzero().flatten().tolist())
    assert changed and changed <= set(padding), "capture wrote outside the padding page"

    running = list(llm.scheduler.running)
    pool.k[:, llm.runner.padding_page] = 0  # padding rows write the same K every time: make it show
    before = slots_of(pool)
    llm.step()  # 3 decodes, replayed as 4: one padding row
    assert replays == Counter({4: 1})
    written = set()  # each request's input token of the step, at position num_computed - 1 now
    for r in running:
        pos = r.num_computed - 1
        written.add(r.pages[pos // page_size] * page_size + pos % page_size)
    changed = set((slots_of(pool) != before).any(dim=(0, 2, 3)).nonzero().flatten().tolist())
    assert changed - set(padding) == written, "a padding row wrote into a live page"
    assert changed & set(padding), "the padding row wrote nothing: was the step padded?"


def test_torch_backend_declines_graphs_it_cannot_afford(tiny_qwen3_dir):
    llm = stage05.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    backend = llm.runner.backend
    assert backend.graph_unsupported_reason(16) is None
    assert "MiB per layer" in backend.graph_unsupported_reason(10**7)


def test_graph_memory_is_measured_then_subtracted_from_the_kv_cache(tiny_qwen3_dir, monkeypatch, caplog):
    """The sizing logic with the device's memory faked: capture against a one-page pool, count the
    drop in free memory, and size the KV cache without it. A backend that declines costs nothing
    and says why in one line."""
    llm = stage05.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", max_running_requests=8)
    runner = llm.runner
    gib, graph_bytes = 1 << 30, 300 << 20
    free = [10 * gib]  # what the fake driver reports as free; the capture below takes graph_bytes

    def capture_that_takes_memory(*args, **kwargs):
        free[0] -= graph_bytes
        return graph.GraphRunner(*args, **kwargs, make_graph=graph.EagerGraph)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *_: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *_: (free[0], 80 * gib))
    monkeypatch.setattr(runner_module, "GraphRunner", capture_that_takes_memory)
    assert runner._measure_graphs(8) == graph_bytes
    free[0] = 10 * gib  # the measurement's graphs were thrown away
    caplog.set_level(logging.INFO, logger="stages.05_cuda_graph")
    caplog.clear()
    assert runner._measure_graphs(10**7) is None, "the torch backend cannot afford 10^7 rows"
    lines = [r.getMessage() for r in caplog.records if "graph" in r.getMessage().lower()]
    assert len(lines) == 1 and lines[0].startswith("CUDA graphs off, decode steps run eagerly: the torch")

    runner.device = torch.device("cuda")  # only for the arithmetic of the sizing below
    page_bytes = stage05.runner.KVPool.bytes_per_page(runner.config, runner.page_size, runner.dtype)
    without, with_graphs = runner._pages_that_fit(0.9, 0), runner._pages_that_fit(0.9, graph_bytes)
    assert without - with_graphs == pytest.approx(graph_bytes / page_bytes, abs=1)
    assert without == int((10 * gib - 0.1 * 80 * gib) // page_bytes) - 1  # one page less: the padding page
