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
# # Stage 07 in a notebook: one model, two processes
#
# This notebook is the companion of the chapter *07 · Tensor parallelism*. It shards a model over
# two ranks on the CPU, each a process of its own talking to the other through gloo, exactly as
# two GPUs talk through NCCL: which slice of which matrix each rank holds, the message rank 0
# sends every step, the tokens that come out (the same as one process's), the default model split
# three ways, and what happens when a rank dies. Every engine it starts is closed at the end, and
# its processes with it.

# %%
import importlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import stages
from stages.common.errors import UserError
from stages.common.model_config import load_model_config
from stages.common.model_source import resolve_model
from stages.common.sampling import SamplingParams

stage07 = importlib.import_module("stages.07_tensor_parallel")
distributed = importlib.import_module("stages.07_tensor_parallel.distributed")
model_module = importlib.import_module("stages.07_tensor_parallel.model")
ranks = importlib.import_module("stages.07_tensor_parallel.ranks")
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", force=True)
torch.set_num_threads(1)
TPInfo = distributed.TPInfo

# %% [markdown]
# ## A small model to split
#
# The default model, SmolLM2-135M, has 9 attention heads: it splits over 3 ranks, not over 2 (we
# come back to it below). For two ranks we write a tiny random-weight checkpoint with Qwen3's
# layout: 4 query heads, 2 KV heads, an MLP of 128, a vocabulary of a few hundred tokens.

# %%
tiny = Path(tempfile.mkdtemp()) / "tiny-qwen3"
subprocess.run(
    [sys.executable, "-m", "scripts.make_random_checkpoint", "--shape", "tiny-qwen3", "--out", str(tiny)],
    cwd=Path(stages.__file__).parents[1], check=True, capture_output=True,  # scripts run from the repository root
)  # fmt: skip
config = load_model_config(tiny)
print(
    f"{config.architecture}: hidden {config.hidden_size}, {config.num_heads} heads and {config.num_kv_heads} "
    f"KV heads of {config.head_dim}, MLP {config.intermediate_size}, vocabulary {config.vocab_size}"
)

# %% [markdown]
# ## Who holds what
#
# Each rank builds the same modules with its own slices. A column-parallel layer (q, k, v, gate,
# up) keeps a slice of the output rows; a row-parallel layer (o_proj, down_proj) a slice of the
# input columns, and sums the ranks' partial outputs with an all-reduce. The embedding and the LM
# head keep a slice of the vocabulary. Built on the meta device, the shapes cost nothing:

# %%
for rank in range(2):
    with torch.device("meta"):
        model = model_module.CausalLM(config, TPInfo(rank, 2))
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    print(f"rank {rank}:")
    print(f"  q_proj    rows {attn.q_proj.start}..{attn.q_proj.start + attn.q_proj.out_features}"
          f"  {tuple(attn.q_proj.weight.shape)}   heads {attn.num_heads}, KV heads {attn.num_kv_heads}")  # fmt: skip
    print(f"  k/v_proj  rows {attn.k_proj.start}..{attn.k_proj.start + attn.k_proj.out_features}"
          f"  {tuple(attn.k_proj.weight.shape)}")  # fmt: skip
    print(f"  o_proj    columns {attn.o_proj.start}..{attn.o_proj.start + attn.o_proj.in_features}"
          f"  {tuple(attn.o_proj.weight.shape)}  + all-reduce")  # fmt: skip
    print(f"  gate/up   rows {mlp.up_proj.start}..{mlp.up_proj.start + mlp.up_proj.out_features}"
          f"  {tuple(mlp.up_proj.weight.shape)}")  # fmt: skip
    print(f"  down_proj columns {mlp.down_proj.start}..{mlp.down_proj.start + mlp.down_proj.in_features}"
          f"  {tuple(mlp.down_proj.weight.shape)}  + all-reduce")  # fmt: skip
    embed = model.model.embed_tokens
    print(f"  embedding and LM head: vocabulary rows {embed.start}..{embed.start + embed.rows}")

# %% [markdown]
# With fewer KV heads than ranks, a KV head is replicated: at 4 ranks, ranks 0 and 1 hold KV head
# 0 (their query heads 0 and 1 read it), ranks 2 and 3 KV head 1. And a vocabulary that the
# degree does not divide is padded with zero rows, which the logits drop again.

# %%
print(
    "KV heads (first, count) at 4 ranks:", [TPInfo(r, 4).kv_head_shard(config.num_kv_heads) for r in range(4)]
)
print(
    "a vocabulary of 509 over 4 ranks:",
    TPInfo(0, 4).padded_vocab(509),
    "rows,",
    TPInfo(0, 4).padded_vocab(509) // 4,
    "each",
)

# %% [markdown]
# ## Two ranks
#
# `LLM(..., tp=2)` makes this process rank 0: it serves the rendezvous, starts rank 1 as a fresh
# interpreter (`python -m stages.07_tensor_parallel.worker`), and both join the process groups
# (gloo here). Rank 0's KV pool holds only its own KV head.

# %%
# Overlap on, as on a GPU (on a CPU it is off by default), so the steps below carry tokens in flight.
llm = stage07.LLM(str(tiny), device="cpu", tp=2, disable_overlap=False)
for rank, proc in llm.ranks.local.items():
    print(f"rank {rank}: pid {proc.pid}, running {' '.join(proc.args[1:3])}")
print("rank 0's q_proj:", tuple(llm.runner.model.model.layers[0].self_attn.q_proj.weight.shape))
print("rank 0's KV pool [layers, pages, page size, KV heads, head dim]:", tuple(llm.runner.pool.k.shape))

# %% [markdown]
# ## What rank 0 sends
#
# Rank 0 alone schedules. Before it runs its own shard of a step, it sends the batch to the other
# ranks: each request's page-table row, where it starts and how many tokens it computes, whether
# it gets a token, whether its input is the token still in flight (overlap scheduling: then the
# token table on the device holds it), and the input tokens the host knows. Plus the page-table
# writes the scheduler made since the last step: every rank keeps its own copy of the table.
# We record the messages of a short run:

# %%
sent = []
send_step = TPInfo.send_step


def recording(tp, message):
    sent.append(message)
    send_step(tp, message)


TPInfo.send_step = recording
prompt = [5, 17, 42, 99, 7, 3]
try:
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))[0]
finally:
    TPInfo.send_step = send_step
for i, m in enumerate(sent):
    kind = "prefill" if m.is_prefill else "decode"
    print(f"step {i} ({kind}): rows {m.rows}, starts {m.starts}, query lens {m.query_lens}, sampled {m.sampled}, "
          f"pending {m.pending}, known ids {m.known_ids}, page writes {m.page_writes}")  # fmt: skip

# %% [markdown]
# The decode steps send no token ids: the input of each is the token the previous step sampled,
# which rank 0 broadcast to every rank right after sampling, and which every rank wrote into its
# token table. So every rank's table holds the same tokens, and no rank waits for the host.
#
# ## The same tokens as one process
#
# In float32 the two ranks' partial sums add up to what one process computes, up to rounding in
# the last bits: the greedy tokens are the same, the log-probabilities equal to 1e-5.

# %%
one = stage07.LLM(str(tiny), device="cpu")
prompts = [[5, 17, 42, 99, 7, 3], list(range(30, 70)), [11] * 9]
params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=5)
two_ranks, one_rank = llm.generate(prompts, params), one.generate(prompts, params)
for a, b in zip(two_ranks, one_rank, strict=True):
    gap = max(
        abs(x["token_logprob"] - y["token_logprob"]) for x, y in zip(a.logprobs, b.logprobs, strict=True)
    )
    print(f"tp=2 {a.token_ids}\ntp=1 {b.token_ids}  largest logprob gap {gap:.1e}")
assert [a.token_ids for a in two_ranks] == [b.token_ids for b in one_rank]

# %% [markdown]
# ## The default model, three ways
#
# A degree must divide the attention heads and the MLP, and split or replicate the KV heads. The
# engine says so before it starts any rank. SmolLM2-135M (9 heads, 3 KV heads, MLP 1536) takes 3:

# %%
default_config = load_model_config(resolve_model(None))
try:
    distributed.check_degree(default_config, 2)
except UserError as err:
    print("tp=2:", err)
llm.close()  # one tensor-parallel engine per process: rank 0 holds its process group
question = "What is the capital of France?"
greedy = SamplingParams(temperature=0, max_tokens=16)
with stage07.LLM(None, device="cpu", tp=3) as three:
    ids = three.tokenizer.encode_prompt(question, chat=True)
    sharded = three.generate([ids], greedy)[0]
alone = stage07.LLM(None, device="cpu").generate([ids], greedy)[0]
print(f"tp=3: {sharded.text!r}\ntp=1: {alone.text!r}")
assert sharded.token_ids == alone.token_ids

# %% [markdown]
# ## A rank that dies
#
# Every rank other than 0 beats a heartbeat into the rendezvous store, and rank 0's watchdog
# thread watches their processes and heartbeats. Kill rank 1 in the middle of a generation: the
# next step raises `RankFailure` naming it, rank 0 stops the other ranks of its node, and nothing
# is left behind.

# %%
llm = stage07.LLM(str(tiny), device="cpu", tp=2)
(worker,) = llm.ranks.local.values()
llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
llm.step()
os.kill(worker.pid, signal.SIGKILL)
try:
    while llm.has_unfinished():
        llm.step()
except ranks.RankFailure as err:
    print("RankFailure:", err)
llm.close()
print("rank 1's exit status:", worker.poll())

# %% [markdown]
# The chapter's *Measure it* counts and times the collectives of a decode step at TP 1, 2 and 4
# on the CPU, over gloo (`scripts/bench_tp_collectives.py`). What tensor parallelism buys on GPUs
# (the decode step and the offline throughput of the Qwen3-0.6B and Qwen3-8B shapes at 1, 2 and
# 4 GPUs) is not measured yet: stage 07 has not run on GPUs.
