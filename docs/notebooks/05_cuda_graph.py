# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Stage 05 in a notebook: recording a step, replaying it
#
# This notebook is the companion of the chapter *05 · CUDA graphs*. On a GPU it captures a small
# CUDA graph and replays it, and shows what a replay does and does not see. On a CPU, where there
# are no graphs, it runs the same protocol through stage 05's stand-in (`EagerGraph`, whose
# replay calls the recorded function again), then drives stage 05 with the default model: which
# graph each decode step replays, that replayed decoding gives the tokens of eager decoding, and
# that padding rows write only into the padding page.

# %%
import importlib
import logging
import time
from collections import Counter

import torch

from stages.common.sampling import SamplingParams

stage05 = importlib.import_module("stages.05_cuda_graph")
graph = importlib.import_module("stages.05_cuda_graph.graph")
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", force=True)
torch.set_num_threads(1)
GPU = torch.cuda.is_available()
print("CUDA GPU:", torch.cuda.get_device_name() if GPU else "none: graphs run through the CPU stand-in")

# %% [markdown]
# ## Capture and replay, on one small function
#
# A step is a function of its inputs. To make it replayable, its inputs live in **static
# buffers**: tensors allocated once, whose contents we overwrite before each replay. The function
# below stands for a decode step: many small operations on a small input.
#
# `make_graph` is a real `torch.cuda.CUDAGraph` (through stage 05's `CudaGraph`) on a GPU, and the
# stand-in on a CPU. `capture` runs the function once while recording; `replay` runs the
# recording.

# %%
device = torch.device("cuda" if GPU else "cpu")
torch.manual_seed(0)
weights = [torch.randn(64, 64, device=device) / 8 for _ in range(50)]
static_x = torch.zeros(4, 64, device=device)  # the input buffer: always the same tensor
static_y = torch.zeros(4, 64, device=device)  # the output buffer


def step() -> None:
    """Fifty small matrix products and activations: a hundred kernels, each a few microseconds."""
    h = static_x
    for w in weights:
        h = torch.tanh(h @ w)
    static_y.copy_(h)


def eager(x: torch.Tensor) -> torch.Tensor:
    h = x
    for w in weights:
        h = torch.tanh(h @ w)
    return h


make_graph = graph.CudaGraph if GPU else graph.EagerGraph
pool = torch.cuda.graph_pool_handle() if GPU else None
g = make_graph(pool)
g.capture(step)  # on a GPU: a warm-up run on a side stream, then the recording

# %% [markdown]
# To run the step on new data, **copy** the data into the static input and replay; read the
# result from the static output. The replay gives what the eager function gives.

# %%
x = torch.randn(4, 64, device=device)
static_x.copy_(x)
g.replay()
print("replay == eager:", torch.allclose(static_y, eager(x), atol=1e-5))
assert torch.allclose(static_y, eager(x), atol=1e-5)

# %% [markdown]
# What a replay does **not** see. First, a forgotten copy: replaying without copying the new
# input into the static buffer returns the result for the old input.

# %%
other = torch.randn(4, 64, device=device)
g.replay()  # forgot static_x.copy_(other)
print("forgotten copy: replay == eager(other)?", torch.allclose(static_y, eager(other), atol=1e-5))
print("                replay == eager(x)?    ", torch.allclose(static_y, eager(x), atol=1e-5))
assert torch.allclose(static_y, eager(x), atol=1e-5)

# %% [markdown]
# Second, on a GPU, a new tensor: binding the name `static_x` to another tensor changes nothing
# for the recording, which reads the old buffer's address. (The CPU stand-in cannot imitate this
# one: it calls the Python function again, which looks the name up anew. That is why the stage's
# graph code never rebinds what its step function reads, and why the GPU tests exist.)

# %%
if GPU:
    kept = static_x
    static_x = other.clone()  # a new tensor under the old name
    g.replay()
    print("after rebinding: replay == eager(other)?", torch.allclose(static_y, eager(other), atol=1e-5))
    assert torch.allclose(static_y, eager(x), atol=1e-5), "the graph still read the old buffer"
    static_x = kept
else:
    print("no GPU: the stand-in would see the new tensor, a real graph would not")

# %% [markdown]
# On a GPU, the point of all this is time: the eager function launches a hundred kernels, one at
# a time from Python; the replay launches one graph. (On a CPU there are no launches to save, and
# the stand-in replays as slowly as the eager function runs.)


# %%
def time_ms(fn, repeats: int = 50) -> float:
    fn()
    if GPU:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    if GPU:
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - start) / repeats


if GPU:
    print(f"eager: {time_ms(lambda: eager(x)):.3f} ms per call; replay: {time_ms(g.replay):.3f} ms per call")
else:
    print("no GPU: nothing to time (the stand-in replays by calling the function again)")

# %% [markdown]
# ## Which graph a batch replays
#
# A graph has fixed shapes, so the engine captures one per batch size: 1, 2, 4, 8, then every
# 8 up to the largest (`--cuda-graph-max-bs`, by default the most requests that run at once, at
# most 256). A batch replays the smallest graph that holds it; the rows it does not fill are
# padding.

# %%
sizes = graph.capture_sizes(64)
print("captured sizes:", sizes)
for batch in (1, 3, 5, 9, 17, 63, 64):
    size = graph.padded_size(sizes, batch)
    print(f"  a batch of {batch:2} replays the graph of {size:2} ({size - batch} padding rows)")

# %% [markdown]
# Why this grid, and not powers of two? Fewer graphs cost less memory and start-up time, but a
# coarser grid pads more. The plot counts the padding rows of every batch size up to 256 under
# the stage's grid and under powers of two: the every-8 grid never pads more than 7 rows, while
# powers of two pad a batch of 129 to 256. A padding row costs little in a decode step (the
# weights are read once for all rows), but not nothing: its attention, its logits row, its share
# of every matrix product.

# %%
import matplotlib.pyplot as plt

batches = list(range(1, 257))
grids = {
    "1, 2, 4, then every 8": graph.capture_sizes(256),
    "powers of two": [1 << i for i in range(9)],
}
fig, ax = plt.subplots(figsize=(8, 3.2))
for label, grid in grids.items():
    padding = [graph.padded_size(grid, b) - b for b in batches]
    mean = sum(padding) / len(padding)
    ax.step(
        batches,
        padding,
        where="post",
        label=f"{label}: {len(grid)} graphs, {mean:.1f} padding rows on average",
    )
ax.set_xlabel("requests in the decode step")
ax.set_ylabel("padding rows")
ax.set_xlim(1, 256)
ax.set_ylim(bottom=0)
ax.legend(loc="upper left", fontsize=8, frameon=False)
ax.set_title("Padding rows per decode step, by the grid of captured sizes", fontsize=10)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Stage 05 with the default model
#
# On this machine stage 05 decides by itself whether it can capture; on a CPU it logs one line
# and decodes eagerly. A short context (`max_context=512`) keeps the torch backend's graph path
# cheap: its fixed-shape decode gathers each row's whole context.

# %%
logging.getLogger("stages.05_cuda_graph").setLevel(logging.INFO)
kwargs = dict(device="cuda" if GPU else "cpu", max_context=512, max_running_requests=8)
if GPU:
    kwargs.update(dtype="bfloat16")
graphed = stage05.LLM(None, **kwargs)
logging.getLogger("stages.05_cuda_graph").setLevel(logging.WARNING)
if graphed.runner.graphs is None:  # the CPU: give it the stand-in, so decode steps replay
    graphed.runner.graphs = graph.GraphRunner(graphed.runner, 8, graph.EagerGraph)
runner = graphed.runner
graphs = runner.graphs
print("graphs for sizes", graphs.sizes, "(captured largest first:", list(graphs.graphs), ")")
print("static inputs (token id, position, page-table row per row):", tuple(graphs.inputs.shape))
print("static logits:", tuple(graphs.logits.shape), graphs.logits.dtype)
print(
    f"padding page: {runner.padding_page} (the allocator hands out pages 0..{runner.allocator.num_pages - 1}); "
    f"padding row: {runner.padding_row}, every entry -> page {int(runner.page_table.table[runner.padding_row, 0])}"
)

# %% [markdown]
# Three chat requests, greedy. We wrap the graph runner's `run` to see each replayed step: how
# many requests it had, and which graph it replayed. The prefill step (and any step that mixes
# prefill and decode) does not appear: it runs eagerly.

# %%
prompts = ["What is the capital of France?", "Name three primary colors.", "Why is the sky blue?"]
ids = [graphed.tokenizer.encode_prompt(p, chat=True) for p in prompts]
params = SamplingParams(temperature=0, max_tokens=12)
replayed: Counter = Counter()
original_run = graphs.run


def counting_run(batch):
    replayed[(batch.size, graph.padded_size(graphs.sizes, batch.size))] += 1
    return original_run(batch)


graphs.run = counting_run
graph_out = graphed.generate(ids, params)
graphs.run = original_run
for (batch, size), n in sorted(replayed.items()):
    print(f"{n:2} decode steps of {batch} request(s) replayed the graph of {size}")

# %% [markdown]
# The same requests decoded eagerly (the stage's switch, `cuda_graph_max_bs=0`) give the same
# tokens.

# %%
eager_llm = stage05.LLM(None, cuda_graph_max_bs=0, **kwargs)
eager_out = eager_llm.generate(ids, params)
for prompt, a, b in zip(prompts, graph_out, eager_out, strict=True):
    print(f"{prompt!r}: {a.text!r}  same as eager: {a.token_ids == b.token_ids}")
if not GPU:  # float32 on a CPU: identical; in bfloat16 on a GPU a near-tie may part them
    assert all(a.token_ids == b.token_ids for a, b in zip(graph_out, eager_out, strict=True))

# %% [markdown]
# ## Padding rows write only into the padding page
#
# Three requests decode; the step replays the graph of 4, so one row is padding. We clear the
# padding page (a padding row computes the same K and V at every step, so a rewrite would not
# show), snapshot every slot of the pool, run one decode step, and list the slots that changed:
# the three requests' new tokens, and the padding page.

# %%
for i in ids:
    graphed.add_request(i, SamplingParams(temperature=0, max_tokens=4))
while any(not r.output_ids for r in graphed.scheduler.running) or graphed.scheduler.waiting:
    graphed.step()  # prefill
pool, page_size = runner.pool, runner.page_size
k_slots = pool.k.view(pool.k.shape[0], -1, *pool.k.shape[3:])  # [layers, slots, kv_heads, head_dim]
pool.k[:, runner.padding_page] = 0  # padding rows write the same K every step: clear it to see the write
before = k_slots.clone()
running = list(graphed.scheduler.running)
graphed.step()  # one decode step of 3 requests: the graph of 4
changed = set((k_slots != before).any(dim=(0, 2, 3)).nonzero().flatten().tolist())
padding = set(range(runner.padding_page * page_size, (runner.padding_page + 1) * page_size))
written = {
    r.pages[(r.num_computed - 1) // page_size] * page_size + (r.num_computed - 1) % page_size for r in running
}
print("slots written for the requests' new tokens:", sorted(written))
print("slots that changed outside the padding page:", sorted(changed - padding))
print("the padding page changed:", bool(changed & padding))
assert changed - padding == written and changed & padding
while graphed.has_unfinished():
    graphed.step()

# %% [markdown]
# On a GPU, the runner also measured, before sizing the KV cache, how much memory the graphs
# take: start-up logs it at INFO level (`CUDA graphs for decode batches of [...]: N MiB, counted
# before sizing the KV cache`). The chapter's *Measure it* shows decode steps with graphs on and
# off, and a profile of one step each way.
