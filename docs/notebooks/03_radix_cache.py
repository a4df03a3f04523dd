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
# # Stage 03 in a notebook: the radix prefix cache
#
# This notebook drives `stages/03_radix_cache` on the CPU. First a radix tree on its own, with
# made-up token ids and page numbers, so insert, split, lock and evict can be watched one at a
# time. Then the engine with the default model: requests that share a long instruction, a chat
# whose turns reuse the history, and the tree that is left behind. It is the companion of the
# chapter *03 · Radix prefix cache*.

# %%
import importlib
import time

from stages.common.sampling import SamplingParams

stage03 = importlib.import_module("stages.03_radix_cache")
radix = importlib.import_module("stages.03_radix_cache.radix_cache")


def page_list(pages: list[int]) -> str:
    if len(pages) > 4 and pages == list(range(pages[0], pages[0] + len(pages))):
        return f"[{pages[0]}..{pages[-1]}]"
    return str(pages) if len(pages) <= 6 else f"[{pages[0]}, {pages[1]}, ... {pages[-1]}] ({len(pages)})"


def draw(cache, label=lambda key: " ".join(map(str, key))) -> None:
    """Print the tree: each node's tokens, its pages and how many live requests lock it."""
    lines = ["(root)"]

    def walk(node, indent: str) -> None:
        children = sorted(node.children.values(), key=lambda c: c.key)
        for i, child in enumerate(children):
            last = i == len(children) - 1
            locks = f"  locked x{child.lock_ref}" if child.lock_ref else ""
            lines.append(
                f"{indent}{'└── ' if last else '├── '}{label(child.key)}  pages {page_list(child.pages)}{locks}"
            )
            walk(child, indent + ("    " if last else "│   "))

    walk(cache.root, "")
    print("\n".join(lines))


# %% [markdown]
# ## A tree on its own
#
# Pages of one token, so every token has its own page. A first request computed tokens
# `1 2 3 4` into pages 10 to 13 and hands them to the cache:

# %%
cache = radix.RadixCache(page_size=1)
cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
draw(cache)

# %% [markdown]
# A second request computed `1 2 5 6` into pages 20 to 23. The tree already holds `1 2`, so the
# edge is **split** after two tokens; the cache keeps its own pages 10 and 11 for them and returns
# them, and the caller frees 20 and 21, which are duplicates:

# %%
held, _ = cache.insert([1, 2, 5, 6], [20, 21, 22, 23])
print("pages the cache holds for 1 2 5 6:", held)
draw(cache)

# %% [markdown]
# A new prompt `1 2 3 9` **matches** `1 2 3`: three pages are reused, and the match splits `3 4`
# so that it ends at a node. Locking that node protects the whole path from eviction while the
# request runs:

# %%
pages, handle = cache.match([1, 2, 3, 9])
print("matched pages:", pages)
cache.lock(handle)
draw(cache)

# %% [markdown]
# When the pool runs dry, **eviction** drops unlocked leaves, least recently used first. The two
# leaves are `4` (page 13), last used by the first insert, and `5 6` (pages 22, 23), inserted
# after it: the match that split `3 4` stamped only the nodes it used, `1 2` and `3`. So `4` is
# the older and goes first, then `5 6`; nothing on the locked path goes, however much is asked
# for. Evicting one page at a time shows the order:

# %%
print(
    "evict(1):",
    cache.evict(1),
    "  then evict(10):",
    cache.evict(10),
    "   evictable left:",
    cache.evictable_pages,
)
draw(cache)
cache.unlock(handle)
print("after unlock, evictable:", cache.evictable_pages)

# %% [markdown]
# With pages of several tokens the tree works in whole pages: a page is shared only when all its
# tokens agree, and only full pages are inserted.

# %%
paged = radix.RadixCache(page_size=4)
paged.insert(list(range(10)), [0, 1])  # ten tokens: two full pages, the last two tokens are not cached
print(
    "match of 0..6, 9:",
    paged.match([0, 1, 2, 3, 4, 5, 6, 9])[0],
    "(one page: the second differs in its last token)",
)
draw(paged)

# %% [markdown]
# ## The engine
#
# The default model on the CPU. Four requests share a long instruction and ask different
# questions; they arrive together, so the scheduler prefills the first one and lets the others
# wait one step, after which the instruction comes from the cache. `cached_tokens` says how much
# of each prompt was reused.

# %%
llm = stage03.LLM(None, device="cpu")
tok = llm.tokenizer
params = SamplingParams(temperature=0, max_tokens=12)
instruction = (
    "You are a geography tutor. Answer every question in one short sentence, name the country "
    "or city you are talking about, and do not add anything else. Question: "
)
questions = ["What is the capital of France?", "What is the capital of Italy?",
             "Which river flows through Paris?", "What is the largest city in Japan?"]  # fmt: skip
start = time.perf_counter()
outputs = llm.generate([tok.encode_prompt(instruction + q, chat=True) for q in questions], params)
print(f"{time.perf_counter() - start:.1f} s")
for q, out in zip(questions, outputs, strict=True):
    print(
        f"{out.cached_tokens:3} of {len(out.prompt_ids):3} prompt tokens cached | {q} -> {out.text.strip()!r}"
    )

# %% [markdown]
# The tree now holds the shared instruction once, with one branch per question (each with the
# answer tokens that were computed). Token ids are shown as text; long edges are shortened.


# %%
def as_text(key) -> str:
    text = tok.decode(key).replace("\n", "⏎")
    return repr(text if len(text) <= 48 else text[:22] + " … " + text[-22:])


draw(llm.scheduler.cache, as_text)

# %% [markdown]
# ## A chat reuses its history
#
# Each turn sends the whole conversation again, as chat APIs do. The previous turn's prompt and
# answer are in the tree, so only the new message is computed: `cached_tokens` grows turn by turn.

# %%
messages, turns = [], []
for user in ["Hi! What is the capital of France?", "And of Germany?", "Which of the two is larger?"]:
    messages.append({"role": "user", "content": user})
    out = llm.generate([tok.encode_chat(messages)], params)[0]
    messages.append({"role": "assistant", "content": out.text})
    turns.append((out.cached_tokens, len(out.prompt_ids)))
    print(f"{out.cached_tokens:3} of {len(out.prompt_ids):3} cached | {user} -> {out.text.strip()!r}")

# %%
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 2.6))
labels = [f"turn {k + 1}" for k in range(len(turns))]
cached = [c for c, _ in turns]
computed = [n - c for c, n in turns]
ax.barh(labels, cached, color="#5aa469", label="from the cache")
ax.barh(labels, computed, left=cached, color="#e07b39", label="computed")
ax.invert_yaxis()
ax.set_xlabel("prompt tokens")
ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
ax.set_title("Each turn resends the conversation; only the new part is computed", loc="left", fontsize=9)
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Radix against naive
#
# The same requests with `cache="naive"`, stage 02's behaviour: the same answers, and every prompt
# token computed. The scheduler counts the prompt tokens of every admission and how many came
# from the cache.

# %%
naive = stage03.LLM(None, device="cpu", cache="naive")
again = naive.generate([tok.encode_prompt(instruction + q, chat=True) for q in questions], params)
assert [o.token_ids for o in again] == [o.token_ids for o in outputs]
for name, engine in (("radix", llm), ("naive", naive)):
    s = engine.scheduler
    print(
        f"{name}: {s.num_cached_tokens} of {s.num_prompt_tokens} prompt tokens from the cache ({s.hit_rate:.0%})"
    )
llm.scheduler.check_integrity()  # every page is free, cached, or owned by one running request
