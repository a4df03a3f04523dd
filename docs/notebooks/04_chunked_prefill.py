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
# # Stage 04 in a notebook: a long prompt, cut into chunks
#
# This notebook drives `stages/04_chunked_prefill` with the default model on the CPU. A short
# request starts decoding; then a long prompt arrives. We watch the scheduler cut the long
# prompt into chunks under a per-step token budget, step by step; compare how often the short
# request gets a token under the two policies (`mixed` and `prefill-first`); and check that
# chunking changes nothing in the answers. It is the companion of the chapter
# *04 · Chunked prefill*.

# %%
import importlib
import logging
import time

import torch

from stages.common.sampling import SamplingParams

stage04 = importlib.import_module("stages.04_chunked_prefill")
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", force=True)
# Small batches on a CPU: one thread is faster and steadier than several fighting over the cores.
torch.set_num_threads(1)

# %% [markdown]
# ## The requests
#
# One short chat request, and one long one: a passage of a few hundred tokens to summarise. With
# a budget of 64 prompt tokens per step, the long prompt needs several steps.

# %%
BUDGET = 64
PASSAGE = (
    "Paris is the capital and largest city of France. It lies on the river Seine, in the north of "
    "the country, at the heart of the Ile-de-France region. The city has been a major centre of "
    "finance, diplomacy, commerce, fashion, science and the arts since the seventeenth century. "
    "Its museums, among them the Louvre, which is the most visited art museum in the world, and "
    "the Musee d'Orsay, hold some of the best known paintings and sculptures. The Eiffel Tower, "
    "built for the World's Fair of 1889, was meant to stand for twenty years and became the "
    "symbol of the city instead. Paris is also a hub of transport: two large airports, a dense "
    "metro network opened in 1900, and high-speed trains that reach London, Brussels and "
    "Amsterdam in a few hours. Every summer the Tour de France ends on the Champs-Elysees, and "
    "in 2024 the city hosted the Olympic and Paralympic Games for the third time. The river "
    "banks, with their booksellers and bridges, are a World Heritage Site."
)
llm = stage04.LLM(None, device="cpu", max_prefill_length=BUDGET, chunk_policy="mixed")
short_ids = llm.tokenizer.encode_prompt("Name three primary colors.", chat=True)
long_ids = llm.tokenizer.encode_prompt(f"Summarise this text in one sentence.\n\n{PASSAGE}", chat=True)
short_params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
long_params = SamplingParams(temperature=0, max_tokens=12)
print(
    f"short prompt: {len(short_ids)} tokens; long prompt: {len(long_ids)} tokens; budget: {BUDGET} per step"
)

# %% [markdown]
# ## Step by step
#
# `serve` adds the short request at step 0 and the long one at step 2, when the short one is
# decoding, then steps until both finish. It records the batch the scheduler picked at every
# step: which requests, how many tokens each computes (`query_lens`), and whether the step
# reaches a request's last token, so that it samples (`sampled`). It also prints how far the
# long prompt's KV has got (`num_computed`), and how many pages the prefix cache holds.


# %%
def serve(llm, verbose=True):
    batches = []
    schedule = llm.scheduler.schedule

    def recording_schedule():
        batch = schedule()
        batches.append(batch)
        return batch

    llm.scheduler.schedule = recording_schedule
    outputs, got_token, step = {}, [], 0
    short = llm.add_request(short_ids, short_params)
    t0 = time.perf_counter()
    long = None
    while llm.has_unfinished() or long is None:
        if step == 2:
            long = llm.add_request(long_ids, long_params)
            long_added_s = time.perf_counter() - t0
        start = time.perf_counter()
        finished = dict(llm.step())
        ms = 1000 * (time.perf_counter() - start)
        batch = batches[-1]
        rids = [r.rid for r in batch.requests]
        if short not in outputs:  # until the short request's last token
            got_token.append(short in rids and batch.sampled[rids.index(short)])
        if verbose:
            long_req = next((r for r in batch.requests if r.rid == long), None)
            progress = " " * 13
            if long_req is not None and not long_req.output_ids[1:]:  # prefilling, or just done
                progress = f"L KV {min(long_req.num_computed, len(long_ids)):3}/{len(long_ids)}"
            print(
                f"step {step:2}  requests {str(rids):7} query_lens {str(batch.query_lens):10} "
                f"sampled {str(batch.sampled):14} {progress}  cached pages "
                f"{len(llm.scheduler.cache.all_pages()):3}  {ms:5.0f} ms"
            )
        outputs.update(finished)
        step += 1
    llm.scheduler.schedule = schedule
    # When the long prompt was being prefilled, in seconds since the short request was added.
    prefill_window = (long_added_s, long_added_s + outputs[long].ttft_s)
    return outputs[short], outputs[long], got_token, prefill_window


chunked_short, chunked_long, mixed_got_token, mixed_window = serve(llm)

# %% [markdown]
# Request 0 is the short one, request 1 the long one (`L`). Read the table from the top:
#
# - steps 0 and 1: the short prompt is prefilled whole (it fits the budget) and then decodes,
#   one token per step;
# - at step 2 `L` is admitted. Its KV does not start at 0: the chat template puts the same
#   system prompt in front of both requests, and the prefix cache of stage 03 already holds it
#   (`cached_tokens` below);
# - from step 2, every step carries **one decode token for request 0 and a chunk of `L`**, up to
#   64 prompt tokens. A chunk that stops short of the end of the prompt has `sampled` False:
#   there is no next token to pick yet, so the step computes no logits for it;
# - the last chunk is shorter (what is left of the prompt) and is sampled: `L`'s first token.
#   A step with a chunk costs several decode steps' time (the `ms` column), so the short
#   request's tokens come slower while `L` is prefilled, but they keep coming;
# - the prefix cache holds the short prompt's pages from step 1 on, and gains `L`'s pages only
#   once its whole prompt is in. A half-prefilled prompt never enters the cache: another request
#   could otherwise match pages whose K and V have not been written yet.
#
# Every chunk's queries attend to all of `L`'s KV written by the earlier chunks, plus the chunk
# itself causally: position $p$ sees positions $0..p$, whichever step wrote them.

# %%
print("short:", repr(chunked_short.text))
print(
    "long: ", repr(chunked_long.text), f"({chunked_long.cached_tokens} prompt tokens from the prefix cache)"
)

# %% [markdown]
# ## Mixed against prefill-first
#
# The same requests under `--chunk-policy prefill-first`: a step that has prefill work carries
# nothing else, as in stage 03. Chunking still bounds the step's size, but the short request now
# waits for every chunk of `L`.

# %%
first = stage04.LLM(None, device="cpu", max_prefill_length=BUDGET, chunk_policy="prefill-first")
pf_short, pf_long, pf_got_token, pf_window = serve(first)


# %%
def longest_wait(got_token):
    """The most consecutive steps, after the short request's first token, that gave it no token."""
    longest = run = 0
    for got in got_token[got_token.index(True) :]:
        run = 0 if got else run + 1
        longest = max(longest, run)
    return longest


def gaps_ms(out):
    times = out.token_times
    return [1000 * (b - a) for a, b in zip(times, times[1:], strict=False)]


for name, short_out, got_token in (("mixed", chunked_short, mixed_got_token),
                                   ("prefill-first", pf_short, pf_got_token)):  # fmt: skip
    gaps = gaps_ms(short_out)
    print(
        f"{name:13}: the short request waited at most {longest_wait(got_token)} step(s) for a token; "
        f"gaps between its tokens: median {sorted(gaps)[len(gaps) // 2]:.0f} ms, longest {max(gaps):.0f} ms"
    )
assert longest_wait(mixed_got_token) == 0
assert longest_wait(pf_got_token) >= len(long_ids) // BUDGET

# %% [markdown]
# The decode-gap timeline: each dot is one token of the short request, at the time it arrived,
# with the gap since the token before it. The shaded band is the long prompt's prefill, from
# its arrival to its first token.

# %%
import matplotlib.pyplot as plt

fig, axes = plt.subplots(2, 1, figsize=(8, 4.6), sharex=True, sharey=True)
for ax, (name, out, window) in zip(
    axes, (("mixed", chunked_short, mixed_window), ("prefill-first", pf_short, pf_window)), strict=True
):
    times = out.token_times
    gaps = gaps_ms(out)
    ax.axvspan(*window, color="#e07b39", alpha=0.15, label="long prompt prefilling")
    ax.vlines(times[1:], 0, gaps, color="#3f6fb5", linewidth=1)
    ax.plot(times[1:], gaps, "o", color="#3f6fb5", markersize=4, label="a token of the short request")
    ax.set_title(f"{name}: longest gap {max(gaps):.0f} ms", loc="left", fontsize=9)
    ax.set_ylabel("gap before\nthe token (ms)")
    ax.grid(alpha=0.3)
axes[0].legend(loc="upper right", fontsize=7)
axes[1].set_xlabel("time since the short request arrived (s)")
fig.tight_layout()
plt.show()

# %% [markdown]
# Under `mixed` every gap is one step, though a step that carries a chunk takes longer than a
# pure decode step (the `ms` column above): the short request's median gap rises a little, its
# longest gap is one chunk step. Under `prefill-first` most gaps are short decode steps, but one
# gap lasts the whole prefill of `L`: the stall a reader sees in the stream. A percentile over
# many tokens can miss it (one long gap among hundreds is under 1 %): the benchmark reports the
# worst gap, `short_itl_ms_max`, for that reason.
#
# ## Chunked equals unchunked
#
# Chunking changes when the K and V are computed, not what they are: a chunk sees exactly the
# keys an unchunked prefill would show it. Unchunked here is the stage's switch turned off: a
# budget larger than any prompt, with `prefill-first`.

# %%
whole = stage04.LLM(None, device="cpu", max_prefill_length=8192, chunk_policy="prefill-first")
whole_short, whole_long, _, _ = serve(whole, verbose=False)
chunked_runs = {"mixed, 64": (chunked_short, chunked_long), "prefill-first, 64": (pf_short, pf_long)}
for name, (s, lg) in chunked_runs.items():
    same = s.token_ids == whole_short.token_ids and lg.token_ids == whole_long.token_ids
    print(f"{name:17}: same tokens as unchunked: {same}")
    assert same
print("long answer:", repr(whole_long.text))
