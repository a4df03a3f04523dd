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
# # Stage 02 in a notebook: pages, page tables and continuous batching
#
# This notebook drives `stages/02_paged_kv` with the default model on the CPU. It shows how a
# page table turns a (request, position) into a slot of the KV pool, serves a batch of prompts
# that arrive at different steps and watches the scheduler admit and retire them, then shrinks
# the pool until the scheduler must preempt, and checks that the answers do not change. It is
# the companion of the chapter *02 · Paged KV cache and continuous batching*.

# %%
import importlib
import logging

import torch

from stages.common.sampling import SamplingParams

stage02 = importlib.import_module("stages.02_paged_kv")
PageTable = importlib.import_module("stages.02_paged_kv.page_table").PageTable
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", force=True)
# The batches here are tiny: on a CPU, several threads would spend more time synchronising on
# each of the many small operations than computing, and far more when other programs compete
# for the cores. One thread keeps the notebook fast and steady.
torch.set_num_threads(1)

# %% [markdown]
# ## A page table, on its own
#
# The pool is an array of pages of `page_size` token slots. A request owns a list of pages, in
# order; its row of the page table lists them. Token `p` of the request lives in page
# `row[p // page_size]`, at offset `p % page_size`, so its slot is
# `row[p // page_size] * page_size + p % page_size`. Here one request owns pages 5, 2 and 7:

# %%
table = PageTable(max_requests=2, max_pages_per_request=8, device="cpu")
table.write(row=0, start=0, pages=[5, 2, 7])
rows = torch.zeros(40, dtype=torch.long)
for page_size in (16, 1):
    positions = torch.arange(40 if page_size == 16 else 3)
    slots = table.slots(rows[: len(positions)], positions, page_size)
    print(f"page_size={page_size:2}: positions 0..{len(positions) - 1} -> slots {slots.tolist()}")

# %% [markdown]
# With 16-token pages three pages hold up to 48 tokens, in runs of 16 consecutive slots; with
# 1-token pages every token needs its own table entry, which costs bookkeeping but wastes nothing
# at the end of a request's last page.
#
# ## A batch served continuously
#
# We build the engine with a small pool (64 pages of 16 tokens) and serve six chat prompts. Four
# arrive at step 0, two more at step 5, while the first four are decoding. To watch the
# scheduler, we record the batch it picks at every step.

# %%
llm = stage02.LLM(None, device="cpu", attn="torch", page_size=16, num_pages=64)
prompts = [
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Explain what a GPU is in one sentence.",
    "Give me one tip for learning Python.",
]
prompt_ids = [llm.tokenizer.encode_prompt(p, chat=True) for p in prompts]
params = SamplingParams(temperature=0, max_tokens=32)
print("prompt lengths:", [len(ids) for ids in prompt_ids])

batches = []
schedule = llm.scheduler.schedule


def recording_schedule():
    batch = schedule()
    batches.append(batch)
    return batch


llm.scheduler.schedule = recording_schedule

# %%
arrivals = {0: [0, 1, 2, 3], 5: [4, 5]}  # step -> prompts added before that step
rid_of: dict[int, int] = {}
results = {}
free_pages = []  # after each step, for the plot below
snapshots = {6: [], 20: []}  # steps after which we copy the page table of the running requests
step = 0
while step <= max(arrivals) or llm.has_unfinished():
    for i in arrivals.get(step, []):
        rid_of[llm.add_request(prompt_ids[i], params)] = i
    finished = llm.step()
    batch = batches[-1]
    kind = "prefill" if batch.is_prefill else "decode "
    done = [rid for rid, _ in finished]
    print(
        f"step {step:2}  {kind} requests {[r.rid for r in batch.requests]}  tokens {batch.num_tokens:3}  "
        f"free pages {llm.runner.allocator.num_free:2}" + (f"  finished {done}" if done else "")
    )
    free_pages.append(llm.runner.allocator.num_free)
    for rid, out in finished:
        results[rid_of[rid]] = out
    if step in snapshots:
        snapshots[step] = [
            (r.rid, r.seq_len, r.row, llm.runner.page_table.table[r.row, : len(r.pages)].tolist())
            for r in llm.scheduler.running
        ]
    step += 1

# %% [markdown]
# The same run as a picture: how many requests each step computed and how many tokens (a
# prefill step computes whole prompts, a decode step one token per request), and the free pages
# left after it. Pages go when prompts are admitted and as answers grow, and come back the step a
# request finishes.

# %%
import matplotlib.pyplot as plt

steps = range(len(batches))
fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 4.5), sharex=True)
colors = ["#e07b39" if b.is_prefill else "#3f6fb5" for b in batches]
top.bar(steps, [b.num_tokens for b in batches], color=colors)
top.set_yscale("log")
top.set_ylabel("tokens in the step\n(log scale)")
top.set_title("orange: prefill steps, blue: decode steps", loc="left", fontsize=9)
for x, b in zip(steps, batches, strict=True):
    top.annotate(str(len(b.requests)), (x, b.num_tokens), ha="center", va="bottom", fontsize=7)
bottom.step(steps, free_pages, where="mid", color="#5aa469")
bottom.set_ylabel("free pages\nafter the step")
bottom.set_xlabel("step (the number above a bar: requests in that step)")
bottom.set_ylim(0, llm.runner.allocator.num_pages)
fig.tight_layout()
plt.show()

# %% [markdown]
# Every step is either a **prefill** of newly admitted prompts (many tokens) or a **decode** of
# every running request (one token each). The two late prompts were prefilled at step 5 and
# then joined the decode batch; finished requests left at once and gave their pages back.
#
# The page table after steps 6 and 20: the row each running request holds, and the pages listed
# in it, which is what attention reads. A request grows by one page when its last page fills, and
# takes whatever page is free, so by step 20 its pages are no longer neighbours in the pool.

# %%
for at, running in snapshots.items():
    print(f"after step {at}:")
    for rid, seq_len, row, pages in running:
        print(f"  request {rid}: {seq_len:3} tokens, page-table row {row}: pages {pages}")

# %%
for i, prompt in enumerate(prompts):
    print(f"[{i}] {prompt}\n    {results[i].text!r} ({results[i].finish_reason})")
assert "Paris" in results[0].text
assert llm.runner.allocator.num_free == llm.runner.allocator.num_pages  # no page leaked

# %% [markdown]
# ## Running out of pages: preemption
#
# Now the same prompts on a pool of only 8 pages (128 token slots). A request of about 40 prompt
# tokens plus 32 answer tokens needs 5 pages, so two requests cannot both finish side by side.
# When a decode step finds no free page, the scheduler preempts the newest running request:
# frees its pages and puts it back at the head of the queue, to be prefilled again (prompt and
# the answer so far) once there is room. Greedy decoding is deterministic, so the answers must
# be exactly the ones above.

# %%
tiny = stage02.LLM(None, device="cpu", attn="torch", page_size=16, num_pages=8)
outputs = tiny.generate(prompt_ids, params)
print("preemptions:", tiny.scheduler.num_preemptions)
same = [out.token_ids == results[i].token_ids for i, out in enumerate(outputs)]
print("identical to the roomy run:", same)
assert tiny.scheduler.num_preemptions > 0 and all(same)

# %% [markdown]
# A request that could never fit, even alone, is refused up front instead of being preempted
# forever:

# %%
try:
    tiny.add_request(prompt_ids[0], SamplingParams(temperature=0, max_tokens=500))
except Exception as err:  # a UserError: the CLI prints it as one line
    print(type(err).__name__, "-", err)
