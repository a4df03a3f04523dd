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
# # Stage 06 in a notebook: one step ahead
#
# This notebook is the companion of the chapter *06 · Overlap scheduling*. It drives stage 06
# with the default model, one call at a time, and looks at what the overlapped loop keeps where:
# the token the host has not seen yet (in the token table, on the device), a request that
# finished while the next step was already launched (its pages wait), an abort of a request in
# flight. Then it shows, with a simulated GPU whose clock we control, why the loop is faster,
# and checks that overlap changes no token. On a CPU the "device" finishes each operation before
# the host moves on, so nothing is faster here; the bookkeeping is the same as on a GPU.

# %%
import importlib
import logging

import torch

from stages.common.sampling import SamplingParams

stage06 = importlib.import_module("stages.06_overlap")
engine = importlib.import_module("stages.06_overlap.engine")
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", force=True)
torch.set_num_threads(1)
GPU = torch.cuda.is_available()
kwargs = dict(device="cuda", dtype="bfloat16") if GPU else dict(device="cpu")
# On a CPU overlap is off by default (nothing runs asynchronously there; final/'s `--overlap auto` is
# the same rule): `disable_overlap=False` runs the overlapped loop anyway, to watch its bookkeeping.
llm = stage06.LLM(None, max_context=512, disable_overlap=False, **kwargs)
print("device:", llm.device, "| overlap:", "on" if llm.overlap else "off")

# %% [markdown]
# ## Step by step
#
# `step()` schedules step N+1, launches it, and only then processes step N. After the first call
# the prefill of our request is in flight and nothing has come back; its first token exists only
# on the device. The request's `num_pending` counts such tokens.

# %%
prompt = llm.tokenizer.encode_prompt("What is the capital of France?", chat=True)
rid = llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=32))
print("step 1 returned:", llm.step())
req = llm.scheduler.running[0]
print(
    f"in flight: {llm.in_flight is not None}; output on the host: {req.output_ids}; pending: {req.num_pending}"
)
print(f"the token table, at the request's row {req.row}: {int(llm.runner.token_table[req.row])}")

# %% [markdown]
# The second call schedules the first decode step *before* the host has looked at that token: the
# step's input for this request is read from the token table, on the device. Then the host
# processes step 1, and the token lands in `output_ids`: the one the table held.

# %%
first_token = int(llm.runner.token_table[req.row])
llm.step()
print(f"output on the host: {req.output_ids} (the table held {first_token}); pending: {req.num_pending}")
assert req.output_ids == [first_token] and req.num_pending == 1

# %% [markdown]
# ## A request that finishes while the next step is launched
#
# The request stops at its end-of-turn token, which only the host can see. By then the next step,
# with the request in it, has been launched. So the request leaves the batch at once, but its
# pages, its page-table row and its prefix-cache lock are kept in `retiring` until that step is
# complete; the token that step samples for it is dropped.

# %%
finished = []
while not finished:
    finished = llm.step()
((got, out),) = finished
print(f"finished: {out.text!r} ({out.finish_reason}, {len(out.token_ids)} tokens)")
sched, cache = llm.scheduler, llm.scheduler.cache


def locked() -> int:
    return len(cache.all_pages()) - cache.evictable_pages


print("in the step in flight:", req in llm.in_flight.requests, "| retiring:", [r.rid for r in sched.retiring])
print(f"its row {req.row} is still taken; cached pages it keeps locked: {locked()}")
llm.step()  # that step is complete: its token for the finished request is dropped
print(f"after the next step: retiring {sched.retiring}; its row {req.row}; locked pages: {locked()}")
print("output unchanged:", out.token_ids == req.output_ids, len(out.token_ids), "tokens")

# %% [markdown]
# ## Aborting a request in flight
#
# A server aborts a request whose client went away. `abort` takes it out of the batch at once; if
# the step in flight holds it, its pages wait for that step like a finished request's. An abort
# of a request that is gone already (a second abort, or one that raced a finish) does nothing.

# %%
params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
a = llm.add_request(llm.tokenizer.encode_prompt("Name three primary colors.", chat=True), params)
b = llm.add_request(llm.tokenizer.encode_prompt("Why is the sky blue?", chat=True), params)
for _ in range(3):
    llm.step()
print("abort a:", llm.abort(a), "| retiring:", [r.rid for r in sched.retiring])
print("abort a again:", llm.abort(a), "| abort an unknown id:", llm.abort(999))
returned = []
while llm.has_unfinished():
    returned += [r for r, _ in llm.step()]
    sched.check_integrity()
print("returned:", returned, "(a never is)")
cache = sched.cache
print(
    f"pool back to its baseline: {sched.allocator.num_free} free + {len(cache.all_pages())} cached "
    f"= {sched.allocator.num_pages} pages; cache locks left: {len(cache.all_pages()) - cache.evictable_pages}"
)

# %% [markdown]
# ## Why it is faster: a simulated GPU
#
# On a GPU, `launch` returns as soon as the work is queued, and `Launched.wait` blocks until the
# step's tokens are on the host. We replace both with a clock: launching costs the host 3 units,
# the GPU runs a step in 6, processing costs the host 2. Without overlap the host waits for every
# step before scheduling the next; with overlap it schedules, launches and processes while the
# GPU works.


# %%
def simulate(overlap: bool, host_launch: int = 3, gpu: int = 6, host_process: int = 2) -> dict:
    clock = {"host": 0, "gpu_free": 0, "busy": 0, "steps": 0, "lanes": []}
    launch, process, wait = engine.LLM.launch, engine.LLM.process, engine.Launched.wait

    def record(lane: str, start: int, length: int, kind: str) -> None:
        if length > 0:
            clock["lanes"].append((lane, start, length, kind))

    def timed_launch(self, batch):
        record("host", clock["host"], host_launch, "schedule and launch")
        clock["host"] += host_launch
        launched = launch(self, batch)
        start = max(clock["gpu_free"], clock["host"])
        record("GPU", start, gpu, "step")
        clock["gpu_free"] = launched.end = start + gpu
        clock["busy"] += gpu
        clock["steps"] += 1
        return launched

    def timed_wait(launched):
        record("host", clock["host"], launched.end - clock["host"], "wait for the tokens")
        clock["host"] = max(clock["host"], launched.end)
        return wait(launched)

    def timed_process(self, launched):
        finished = process(self, launched)
        record("host", clock["host"], host_process, "process")
        clock["host"] += host_process
        return finished

    engine.LLM.launch, engine.LLM.process, engine.Launched.wait = timed_launch, timed_process, timed_wait
    try:
        sim = stage06.LLM(None, max_context=512, disable_overlap=not overlap, **kwargs)
        sim.generate([prompt] * 4, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    finally:
        engine.LLM.launch, engine.LLM.process, engine.Launched.wait = launch, process, wait
    return clock


clocks = {overlap: simulate(overlap) for overlap in (False, True)}
for overlap, c in clocks.items():
    print(
        f"overlap {'on ' if overlap else 'off'}: {c['steps']} steps in {c['host']} units; "
        f"the GPU busy {c['busy']} ({100 * c['busy'] / c['host']:.0f}%)"
    )

# %% [markdown]
# The same two runs drawn as timelines, one lane for the host and one for the GPU (the first 60
# units). Without overlap the two lanes take turns: the GPU waits while the host processes a step
# and launches the next, and the host waits while the GPU runs. With overlap the host launches
# step N+1 and then processes step N while the GPU runs step N+1, so the GPU lane has no gaps
# and the host waits only for the rest of each step.

# %%
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

colours = {"schedule and launch": "#3f6fb5", "process": "#e67e22", "wait for the tokens": "#dddddd",
           "step": "#27ae60"}  # fmt: skip
window = 60
fig, axes = plt.subplots(2, 1, figsize=(9, 3.4), sharex=True)
for ax, (overlap, c) in zip(axes, clocks.items(), strict=True):
    for lane, y in (("host", 1.1), ("GPU", 0.1)):
        for kind, colour in colours.items():
            bars = [(s, n) for ln, s, n, k in c["lanes"] if ln == lane and k == kind and s < window]
            ax.broken_barh(bars, (y, 0.8), facecolors=colour, edgecolor="white", lw=0.5)
    ax.set_yticks([0.5, 1.5], ["GPU", "host"])
    ax.set_ylim(0, 2)
    ax.set_xlim(0, window)
    ax.set_title(f"overlap {'on' if overlap else 'off'}", fontsize=9, loc="left")
axes[-1].set_xlabel("simulated time (units: host launch 3, GPU step 6, host processing 2)")
fig.legend(handles=[Patch(color=col, label=kind) for kind, col in colours.items()], loc="lower center",
           ncol=4, fontsize=8, frameon=False)  # fmt: skip
fig.tight_layout(rect=(0, 0.08, 1, 1))
plt.show()

# %% [markdown]
# ## Overlap changes no token
#
# The same requests with overlap off (the stage's switch, `disable_overlap=True`, or
# STAGE06_DISABLE_OVERLAP=1 in the environment) give the same tokens.

# %%
prompts = ["What is the capital of France?", "Name three primary colors.", "Why is the sky blue?"]
ids = [llm.tokenizer.encode_prompt(p, chat=True) for p in prompts]
greedy = SamplingParams(temperature=0, max_tokens=16)
on = llm.generate(ids, greedy)
off = stage06.LLM(None, max_context=512, disable_overlap=True, **kwargs).generate(ids, greedy)
for p, x, y in zip(prompts, on, off, strict=True):
    print(f"{p!r}: {x.text!r}  same without overlap: {x.token_ids == y.token_ids}")
if not GPU:  # float32 on a CPU: identical; in bfloat16 on a GPU a near-tie may part them
    assert all(x.token_ids == y.token_ids for x, y in zip(on, off, strict=True))

# %% [markdown]
# The chapter's *Measure it* has the real thing: the offline and online workloads on a GPU with
# overlap on and off, and a profile of eight steps each way, where the gaps in the GPU's lane
# close.
