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
# # Stage 01 in a notebook: one request, one contiguous KV cache
#
# This notebook opens up `stages/01_naive_generate` with the default model, SmolLM2-135M-Instruct,
# on the CPU. It looks at the model's shape, tokenizes a chat prompt, runs one prefill by hand and
# reads the next-token distribution, decodes a few tokens, generates a whole answer, and measures
# what the contiguous KV cache costs. It is the companion of the chapter
# *01 · The naive generate loop*; every cell runs in seconds.

# %%
import importlib

import torch

from stages.common.sampling import SamplingParams, min_p_mask, sample, top_p_mask
from stages.common.tokenizer import TextStream

stage01 = importlib.import_module("stages.01_naive_generate")
kv_cache = importlib.import_module("stages.01_naive_generate.kv_cache")

torch.manual_seed(0)
llm = stage01.LLM(None, device="cpu")  # None: the default model, converted once from its GGUF file
config = llm.config
print(llm.device, llm.dtype)

# %% [markdown]
# ## The model's shape
#
# Everything the decoder needs from `config.json`. Note the two head counts: 9 query heads share
# 3 key/value heads (grouped-query attention, GQA), so the KV cache is 3x smaller than it would
# be with one KV head per query head.

# %%
fields = "architecture num_layers hidden_size intermediate_size num_heads num_kv_heads head_dim vocab_size"
for field in [*fields.split(), "max_context", "rope_theta", "tie_word_embeddings"]:
    print(f"{field:20} {getattr(config, field)}")
print(f"{'rope_type':20} {config.rope_type}")
print(f"{'heads per KV head':20} {config.num_heads // config.num_kv_heads}")
print(f"parameters: {sum(p.numel() for p in llm.model.parameters()) / 1e6:.0f} M")

# %% [markdown]
# ## A chat prompt, as the model sees it
#
# `--chat` wraps the question in the model's chat template. The model never sees roles, only
# tokens: special tokens such as `<|im_start|>` mark where a turn begins.

# %%
question = "What is the capital of France?"
prompt_ids = llm.tokenizer.encode_prompt(question, chat=True)
print(llm.tokenizer.hf.decode(prompt_ids))
print(len(prompt_ids), "tokens:", llm.tokenizer.hf.convert_ids_to_tokens(prompt_ids)[:12], "...")

# %% [markdown]
# ## Prefill: the whole prompt in one forward pass
#
# We give the model a cache sized for the prompt plus the tokens we will decode, and run the
# prompt through it once. The model returns the logits of the *last* position only: those pick
# the first token of the answer. The cache now holds K and V for every prompt position.

# %%
max_new = 8
cache = kv_cache.ContiguousKVCache(config, len(prompt_ids) + max_new, llm.device, llm.dtype)
logits = llm.model(torch.tensor(prompt_ids), torch.arange(len(prompt_ids)), cache)
print("logits:", tuple(logits.shape), " cached tokens:", cache.length, "of", cache.max_len)

probs = logits[0].softmax(-1)
top = probs.topk(5)
for p, i in zip(top.values.tolist(), top.indices.tolist(), strict=True):
    print(f"{p:7.2%}  {llm.tokenizer.hf.convert_ids_to_tokens(i)!r}")

# %% [markdown]
# ## Decode: one token per forward pass
#
# Each decode step feeds only the newest token, at the next position; attention reads the keys
# and values of all earlier positions from the cache instead of recomputing them.

# %%
tokens = [int(logits.argmax())]
for _ in range(max_new - 1):
    logits = llm.model(torch.tensor(tokens[-1:]), torch.tensor([cache.length]), cache)
    tokens.append(int(logits.argmax()))
print(repr(llm.tokenizer.decode(tokens)), " cached tokens:", cache.length)

# %% [markdown]
# ## Why prefill is cheap per token and decode is not
#
# Time one forward pass over $n$ new tokens, for $n$ from 1 (a decode step) to 256 (a short
# prompt), each into a fresh cache. A pass reads every weight once whatever $n$ is, so the time
# per token falls as $n$ grows, until the arithmetic, not the reading, is what takes the time.
# These are timings of your machine, as it is right now: a busy CPU makes them noisy, but the
# shape is what matters.

# %%
import time

import matplotlib.pyplot as plt

sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
pass_ms = []
threads = torch.get_num_threads()
torch.set_num_threads(1)  # one thread: steadier on a machine that runs other work too
with torch.inference_mode():
    for n in sizes:
        best = float("inf")
        for _ in range(3):  # the fastest of three: the least disturbed by whatever else runs
            scratch = kv_cache.ContiguousKVCache(config, n, llm.device, llm.dtype)
            start = time.perf_counter()
            llm.model(torch.arange(n) % 1000, torch.arange(n), scratch)
            best = min(best, time.perf_counter() - start)
        pass_ms.append(1000 * best)
torch.set_num_threads(threads)

fig, ax = plt.subplots(figsize=(7, 3.2))
ax.loglog(sizes, pass_ms, "o-", color="#3f6fb5", label="one forward pass")
ax.loglog(
    sizes, [t / n for t, n in zip(pass_ms, sizes, strict=True)], "s-", color="#e07b39", label="per token"
)
ax.set_xlabel("tokens in the pass (1 = a decode step)")
ax.set_ylabel("ms (log scale)")
ax.legend()
ax.grid(alpha=0.3, which="both")
fig.tight_layout()
plt.show()
print(f"per token: {pass_ms[0]:.1f} ms at n=1, {pass_ms[-1] / sizes[-1]:.2f} ms at n={sizes[-1]}")

# %% [markdown]
# ## The whole loop: `generate_one`
#
# The engine does the same, with sampling, stop conditions and streaming text. Greedy decoding
# (temperature 0) answers with Paris and stops by itself at the end-of-sequence token.

# %%
pieces: list[str] = []
out = llm.generate_one(prompt_ids, SamplingParams(temperature=0, max_tokens=32), on_text=pieces.append)
print(out.text)
print("streamed pieces:", pieces)
print(f"finish: {out.finish_reason} | tokens: {len(out.token_ids)} | time to first token: {out.ttft_s:.2f} s")
assert "Paris" in out.text

# %% [markdown]
# ## What the contiguous cache costs
#
# Per token, the cache stores a key and a value vector per KV head in every layer. Stage 01
# allocates `prompt + max_tokens` slots up front, used or not: a request that asks for up to
# 1024 tokens and stops after 8 still holds all 1024 for its whole life.

# %%
bytes_per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * llm.dtype.itemsize
print(f"KV bytes per token: {bytes_per_token / 1024:.0f} KiB")
print(f"this cache: {cache.max_len} slots = {(cache.k.nbytes + cache.v.nbytes) / 2**20:.2f} MiB")
reserved = len(prompt_ids) + 1024
used = len(prompt_ids) + len(out.token_ids)
print(f"with max_tokens=1024: {reserved} slots reserved, {used} used ({used / reserved:.0%})")
print(f"a full {config.max_context}-token context: {config.max_context * bytes_per_token / 2**20:.0f} MiB")
mha = bytes_per_token * config.num_heads // config.num_kv_heads
print(f"without GQA (one KV head per query head): {mha / 1024:.0f} KiB per token")

# %% [markdown]
# ## Sampling: what survives each filter
#
# The sampler scales the logits by 1/temperature, then masks them: top-k keeps the k likeliest
# tokens, top-p the smallest set whose probability reaches p, min-p the tokens at least min_p
# times as likely as the best. A higher temperature flattens the distribution, so top-p lets
# many more tokens through, while min-p, being relative to the best token, stays selective.

# %%
fresh = kv_cache.ContiguousKVCache(config, len(prompt_ids), llm.device, llm.dtype)
first = llm.model(torch.tensor(prompt_ids), torch.arange(len(prompt_ids)), fresh)
for temperature in (0.5, 1.0, 1.5):
    scaled = first / temperature
    mass_top_k = scaled.softmax(-1).topk(50).values.sum()
    top_p = int(torch.isfinite(top_p_mask(scaled, torch.tensor([0.9]))).sum())
    min_p = int(torch.isfinite(min_p_mask(scaled, torch.tensor([0.05]))).sum())
    print(
        f"temperature {temperature}: top_k=50 keeps {mass_top_k:.0%} of the probability; "
        f"top_p=0.9 keeps {top_p} tokens; min_p=0.05 keeps {min_p} tokens"
    )

# %% [markdown]
# The draw itself is an *exponential race*: divide each probability by an independent Exp(1)
# sample and take the argmax. Token i wins with probability p_i. A seed gives the request its own
# random stream, so the same seed gives the same token.

# %%
params = SamplingParams(temperature=1.0, top_p=0.9, seed=1234)
draws = [int(sample(first, [params], [params.make_generator("cpu")]).tokens[0]) for _ in range(3)]
print("same seed, three draws:", llm.tokenizer.hf.convert_ids_to_tokens(draws))
assert len(set(draws)) == 1

# A check of the race against the distribution it should follow, on a small example.
p = torch.tensor([0.5, 0.3, 0.2])
winners = (p / torch.empty(100_000, 3).exponential_()).argmax(-1)
print("empirical frequencies:", (torch.bincount(winners, minlength=3) / 100_000).tolist())

# %% [markdown]
# ## Streaming text and stop strings
#
# Text is decoded incrementally, and text that might be the start of a stop string is held back
# until it is decided. With the stop string `"Paris"` the answer ends just before it.

# %%
stream = TextStream(llm.tokenizer, prompt_ids, stop=["Paris"])
for token in out.token_ids:
    text, hit = stream.push([token])
    piece = llm.tokenizer.hf.convert_ids_to_tokens(token)
    print(f"{piece!r:12} -> emitted {text!r}" + ("  (stop string hit)" if hit else ""))
    if hit:
        break
print("final text:", repr(stream.text))
