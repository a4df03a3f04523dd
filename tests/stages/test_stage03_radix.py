"""Stage 03: the radix prefix cache.

- The tree (match, insert, split, lock, unlock, evict) against a brute-force model, under random
  operation sequences (hypothesis), for page sizes 1, 2 and 4.
- The scheduler with the cache, without a model: every page is free, cached or owned by exactly
  one request at every step, and every request attends to the KV of its own tokens.
- The engine on the tiny checkpoints: radix outputs equal naive, stage 02 and HF transformers
  under heavy sharing, full-prefix hits and eviction pressure; a chat reuses its history; on a
  shared-prefix workload only the unshared tokens are computed.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stages.common.errors import UserError
from stages.common.sampling import SamplingParams
from tests.fixtures.driving import full_logprobs, serve_at_steps
from tests.fixtures.tiny_models import hf_greedy, hf_step_logprobs, sample_prompts
from tests.stage_list import load

radix = load("stages.03_radix_cache.radix_cache")
kv_cache = load("stages.03_radix_cache.kv_cache")
page_table_mod = load("stages.03_radix_cache.page_table")
request_mod = load("stages.03_radix_cache.request")
scheduler_mod = load("stages.03_radix_cache.scheduler")
cli = load("stages.03_radix_cache.__main__")
stage03 = load("stages.03_radix_cache")
stage02 = load("stages.02_paged_kv")

PAGE_SIZES = [1, 4]


# ---------------------------------------------------------------------------------------------
# The tree against a brute-force model


def tree_entries(cache) -> dict[tuple[int, ...], tuple[int, int, int]]:
    """The tree flattened: prefix of whole pages -> (page holding its last page, last access, locks)."""
    out = {}
    stack = [(cache.root, ())]
    while stack:
        node, prefix = stack.pop()
        for child in node.children.values():
            for i, page in enumerate(child.pages):
                key = prefix + tuple(child.key[: (i + 1) * cache.page_size])
                out[key] = (page, child.last_access, child.lock_ref)
            stack.append((child, prefix + tuple(child.key)))
    return out


class RadixModel(RuleBasedStateMachine):
    """The model is a dict from each cached prefix (a whole number of pages) to the page that holds
    its last page, with a last-access time and a lock count per prefix. Every tree operation is
    replayed on it, and after every step the flattened tree must equal it."""

    NUM_PAGES = 4096
    tokens = st.lists(st.integers(0, 2), max_size=20)

    @initialize(page_size=st.sampled_from([1, 2, 4]))
    def setup(self, page_size: int) -> None:
        self.ps = page_size
        self.cache = radix.RadixCache(page_size)
        self.free = list(range(self.NUM_PAGES))  # a stand-in allocator
        self.entries: dict[tuple[int, ...], int] = {}
        self.times: dict[tuple[int, ...], int] = {}
        self.clock = 0
        self.locks: list[tuple[object, tuple[int, ...]]] = []  # (handle, the prefix it ends)

    # The model's operations -------------------------------------------------------------------

    def whole(self, tokens: list[int]) -> list[int]:
        return tokens[: len(tokens) - len(tokens) % self.ps]

    def prefixes(self, tokens: list[int]) -> list[tuple[int, ...]]:
        return [tuple(tokens[: (k + 1) * self.ps]) for k in range(len(tokens) // self.ps)]

    def model_match(self, tokens: list[int]) -> tuple[list[int], int]:
        pages = []
        for prefix in self.prefixes(tokens):
            if prefix not in self.entries:
                break
            pages.append(self.entries[prefix])
        return pages, len(pages) * self.ps

    def touch(self, prefixes: list[tuple[int, ...]]) -> None:
        self.clock += 1
        for prefix in prefixes:
            self.times[prefix] = self.clock

    def locked(self, prefix: tuple[int, ...]) -> int:
        return sum(1 for _, end in self.locks if end[: len(prefix)] == prefix and len(end) >= len(prefix))

    def allocate(self, n: int) -> list[int]:
        pages, self.free = self.free[:n], self.free[n:]
        return pages

    def do_insert(self, tokens: list[int], pages: list[int]) -> tuple[list[int], object]:
        held, handle = self.cache.insert(tokens, pages)
        expected = []
        for prefix, page in zip(self.prefixes(tokens), pages, strict=False):
            expected.append(self.entries.setdefault(prefix, page))
        self.touch(self.prefixes(tokens))
        assert held == expected
        assert self.cache.prefix(handle) == (self.whole(tokens), held)
        duplicates = [p for p, q in zip(pages, held, strict=True) if p != q]
        self.free += duplicates  # what the caller does with them
        return held, handle

    # Rules ------------------------------------------------------------------------------------

    @rule(tokens=tokens)
    def insert_fresh_pages(self, tokens: list[int]) -> None:
        """A request that computed everything itself: pages the tree already has are duplicates."""
        self.do_insert(tokens, self.allocate(len(tokens) // self.ps))

    @rule(tokens=tokens)
    def match(self, tokens: list[int]) -> None:
        pages, handle = self.cache.match(tokens)
        expected, length = self.model_match(tokens)
        assert pages == expected
        assert self.cache.prefix(handle) == (tokens[:length], pages)
        self.touch(self.prefixes(tokens[:length]))

    @rule(tokens=tokens, extra=tokens)
    def request_lifecycle(self, tokens: list[int], extra: list[int]) -> None:
        """What the scheduler does: match and lock, compute the rest, insert, move the lock."""
        pages, handle = self.cache.match(tokens)
        expected, length = self.model_match(tokens)
        assert pages == expected
        self.touch(self.prefixes(tokens[:length]))
        self.cache.lock(handle)
        self.locks.append((handle, tuple(tokens[:length])))
        full = tokens + extra
        own = self.allocate(len(full) // self.ps - len(pages))
        held, new_handle = self.do_insert(full, pages + own)
        assert held[: len(pages)] == pages, "the matched pages must stay the request's"
        self.cache.lock(new_handle)
        self.cache.unlock(handle)
        self.locks.remove((handle, tuple(tokens[:length])))
        self.locks.append((new_handle, tuple(self.whole(full))))

    @rule(tokens=tokens)
    def lock_a_match(self, tokens: list[int]) -> None:
        pages, handle = self.cache.match(tokens)
        _, length = self.model_match(tokens)
        self.touch(self.prefixes(tokens[:length]))
        self.cache.lock(handle)
        self.locks.append((handle, tuple(tokens[:length])))

    @precondition(lambda self: self.locks)
    @rule(data=st.data())
    def unlock(self, data) -> None:
        handle, prefix = self.locks.pop(data.draw(st.integers(0, len(self.locks) - 1)))
        self.cache.unlock(handle)

    @rule(num_pages=st.integers(0, 12))
    def evict(self, num_pages: int) -> None:
        evictable = sum(1 for prefix in self.entries if not self.locked(prefix))
        assert self.cache.evictable_pages == evictable
        before = set(self.cache.all_pages())
        freed = self.cache.evict(num_pages)
        after = set(self.cache.all_pages())
        assert len(freed) == len(set(freed)) and set(freed) == before - after, (
            "evict must report what it frees"
        )
        assert len(freed) >= min(num_pages, evictable)
        gone = [prefix for prefix, page in self.entries.items() if page in set(freed)]
        assert not any(self.locked(prefix) for prefix in gone), "a locked page was evicted"
        for prefix in gone:
            del self.entries[prefix]
        # Least recently used first: nothing evicted was used after a leaf that stayed.
        leaves = [
            p for p in self.entries
            if not self.locked(p) and not any(len(q) > len(p) and q[: len(p)] == p for q in self.entries)
        ]  # fmt: skip
        if gone and leaves:
            assert max(self.times[p] for p in gone) <= min(self.times[p] for p in leaves)
        for prefix in gone:
            del self.times[prefix]
        self.free += freed

    # Invariants -------------------------------------------------------------------------------

    @invariant()
    def tree_equals_model(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check_integrity([h for h, _ in self.locks])
        expected = {p: (page, self.times[p], self.locked(p)) for p, page in self.entries.items()}
        assert tree_entries(self.cache) == expected
        for prefix in self.entries:  # prefix-closed: a cached prefix's own prefixes are cached
            assert len(prefix) == self.ps or prefix[: -self.ps] in self.entries
        every = self.free + self.cache.all_pages()
        assert len(every) == len(set(every)) == self.NUM_PAGES, "a page leaked or is in two places"


TestRadixAgainstModel = RadixModel.TestCase
TestRadixAgainstModel.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


# ---------------------------------------------------------------------------------------------
# The tree: the cases the chapter draws


def shape(node, page_size: int = 1) -> dict:
    """The tree as nested dicts of edge labels, for readable asserts."""
    return {" ".join(map(str, c.key)): shape(c, page_size) for c in node.children.values()}


def test_insert_split_and_match_as_drawn():
    cache = radix.RadixCache(page_size=1)
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    assert shape(cache.root) == {"1 2 3 4": {}}
    held, _ = cache.insert([1, 2, 5, 6], [20, 21, 22, 23])
    assert held == [10, 11, 22, 23]  # 20 and 21 duplicate 10 and 11: the caller frees them
    assert shape(cache.root) == {"1 2": {"3 4": {}, "5 6": {}}}
    pages, handle = cache.match([1, 2, 3, 9])
    assert pages == [10, 11, 12]
    assert shape(cache.root) == {"1 2": {"3": {"4": {}}, "5 6": {}}}  # a match splits at its end
    assert cache.prefix(handle) == ([1, 2, 3], [10, 11, 12])


def test_page_aligned_match_and_insert():
    cache = radix.RadixCache(page_size=2)
    held, _ = cache.insert([1, 2, 3, 4, 5], [7, 8, 9])  # the half page [5] is not inserted
    assert held == [7, 8] and cache.all_pages() == [7, 8]
    assert cache.match([1, 2, 3, 9])[0] == [7]  # [3, 9] differs from [3, 4]: the page is not shared
    assert cache.match([1, 2, 3])[0] == [7]  # a partial page never matches
    assert cache.match([1, 2, 3, 4, 5, 6])[0] == [7, 8]
    assert cache.match([2, 1])[0] == []


def test_evict_takes_least_recently_used_unlocked_leaves():
    cache = radix.RadixCache(page_size=1)
    _, a = cache.insert([1, 1], [1, 2])
    _, b = cache.insert([2, 2], [3, 4])
    _, c = cache.insert([3, 3], [5, 6])
    cache.match([1, 1])  # a is now the most recently used
    cache.lock(b)
    assert cache.evictable_pages == 4
    assert cache.evict(1) == [5, 6]  # a whole leaf goes: c, the least recently used unlocked one
    assert cache.evict(10) == [1, 2]  # b is locked
    assert cache.evictable_pages == 0 and sorted(cache.all_pages()) == [3, 4]
    cache.unlock(b)
    assert cache.evict(1) == [3, 4]
    with pytest.raises(AssertionError):
        cache.unlock(b)


def test_evict_frees_an_emptied_parent_too():
    cache = radix.RadixCache(page_size=1)
    cache.insert([1, 2, 3], [1, 2, 3])
    cache.insert([1, 2, 4], [1, 2, 4])
    assert shape(cache.root) == {"1 2": {"3": {}, "4": {}}}
    assert sorted(cache.evict(3)) == [1, 2, 3, 4]


# ---------------------------------------------------------------------------------------------
# The scheduler with the cache, no model: pages are conserved and KV belongs to its tokens


class FakeStream:
    def push(self, ids):
        return "", False


def next_token(ids: list[int]) -> int:
    return hash(tuple(ids)) % 3  # deterministic: equal histories continue alike, as greedy does


@pytest.mark.parametrize("cache_name", ["radix", "naive"])
@settings(max_examples=50, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4]),
    num_pages=st.integers(min_value=12, max_value=60),
    max_running=st.integers(min_value=1, max_value=5),
    requests=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 24), st.integers(1, 10), st.integers(0, 8)),
        min_size=1, max_size=12,
    ),  # (which shared head, prompt length, max new tokens, arrival step)
)  # fmt: skip
def test_scheduler_conserves_pages_and_kv_belongs_to_its_tokens(
    cache_name, page_size, num_pages, max_running, requests
):
    allocator = kv_cache.PageAllocator(num_pages)
    table = page_table_mod.PageTable(max_running, 64, "cpu")
    cache = radix.CACHES[cache_name](page_size)
    sched = scheduler_mod.Scheduler(allocator, table, page_size, max_running, cache)
    heads = [[9] * 40, [9] * 20 + [8] * 20, [7, 6, 5, 4] * 10, []]  # prompts start alike, or not
    pending = []
    for i, (head, length, new, _) in enumerate(requests):
        prompt = (heads[head] + [random.Random(i).randrange(3) for _ in range(length)])[:length]
        if length + new <= num_pages * page_size:
            pending.append(
                request_mod.Request(rid=i, prompt_ids=prompt, params=SamplingParams(), max_new_tokens=new,
                                    stream=FakeStream())
            )  # fmt: skip
    arrivals = {r.rid: requests[r.rid][3] for r in pending}
    # The pool's content: slot -> the tokens whose KV it holds (the KV at position p depends on
    # tokens 0..p, so that tuple names it).
    pool: dict[int, tuple[int, ...]] = {}
    done = 0
    for step in range(3000):
        for r in pending:
            if arrivals[r.rid] == step:
                sched.add(r)
        batch = sched.schedule()
        if batch is not None:
            for req in batch.requests:  # the forward pass: write this step's KV, read all of it
                assert req.num_uncomputed >= 1
                row = table.table[req.row].tolist()
                ids = req.all_ids
                for pos in range(req.seq_len):
                    slot = row[pos // page_size] * page_size + pos % page_size
                    if pos >= req.num_computed:
                        pool[slot] = tuple(ids[: pos + 1])
                    assert pool.get(slot) == tuple(ids[: pos + 1]), "attending to the KV of other tokens"
            for req in batch.requests:  # what the engine does after the forward pass
                req.num_computed = req.seq_len
                req.output_ids.append(next_token(req.all_ids))
                if len(req.output_ids) >= req.max_new_tokens:
                    sched.finish(req)
                    done += 1
                elif batch.is_prefill:
                    sched.cache_request(req)
        sched.check_integrity()
        if done == len(pending) and step > 8:
            break
    assert done == len(pending), "some request never finished"
    assert sorted(table.free_rows) == list(range(max_running))
    assert allocator.num_free + len(cache.all_pages()) == num_pages
    allocator.free(cache.evict(num_pages))
    assert allocator.num_free == num_pages
    if cache_name == "naive":
        assert sched.num_cached_tokens == 0


# ---------------------------------------------------------------------------------------------
# The engine on the tiny checkpoints


def greedy(max_tokens: int = 16, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


def sharing_prompts(model_dir, prefix_len: int = 40) -> list[list[int]]:
    """Heavy sharing: one system prompt before most prompts, exact repeats, a prompt that is a
    prefix of another, the bare system prompt, and two unrelated prompts."""
    base = sample_prompts(model_dir, n=8, seed=21)
    system = (base[1] * 2)[:prefix_len]
    prompts = [system + p[:12] for p in base[2:7]]
    prompts += [prompts[0], prompts[3], system, prompts[2][: prefix_len + 3], base[0], base[7]]
    return prompts


def new_llm(module, model_dir, **kwargs):
    return module.LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_radix_equals_naive_stage02_and_hf(tiny_model_dir, page_size):
    prompts = sharing_prompts(tiny_model_dir)
    expected = hf_greedy(tiny_model_dir, prompts, 16)
    arrivals = [0, 0, 0, 1, 2, 2, 3, 5, 9, 9, 14]
    results = {}
    for name, module, kwargs in [
        ("radix", stage03, {"cache": "radix"}), ("naive", stage03, {"cache": "naive"}), ("stage02", stage02, {}),
    ]:  # fmt: skip
        llm = new_llm(module, tiny_model_dir, page_size=page_size, **kwargs)
        check = llm.scheduler.check_integrity if module is stage03 else None
        results[name] = serve_at_steps(llm, prompts, greedy(), arrivals, check, max_steps=5000)
        if name == "radix":
            hits = [o.cached_tokens for o in results[name]]
            assert sum(hits) >= 5 * 32, f"expected heavy reuse, got {hits}"
            assert all(h % page_size == 0 and h < len(p) for h, p in zip(hits, prompts, strict=True))
            # A second round finds every prompt: a full hit for all but the last token (whole pages).
            again = llm.generate(prompts, greedy())
            assert [o.token_ids for o in again] == expected
            assert [o.cached_tokens for o in again] == [
                (len(p) - 1) // page_size * page_size for p in prompts
            ]
            llm.scheduler.check_integrity()
    for name, outputs in results.items():
        assert [o.token_ids for o in outputs] == expected, name
    assert all(o.cached_tokens == 0 for o in results["naive"])


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_eviction_pressure(tiny_qwen3_dir, page_size, monkeypatch):
    prompts = sharing_prompts(tiny_qwen3_dir) * 2
    expected = hf_greedy(tiny_qwen3_dir, prompts, 24)
    longest = max(len(p) for p in prompts) + 24
    llm = new_llm(stage03, tiny_qwen3_dir, page_size=page_size, num_pages=-(-2 * longest // page_size) + 4)
    evicted: list[int] = []
    evict = llm.scheduler.cache.evict

    def counting_evict(n):
        freed = evict(n)
        evicted.extend(freed)
        return freed

    monkeypatch.setattr(llm.scheduler.cache, "evict", counting_evict)
    arrivals = [i // 3 for i in range(len(prompts))]
    outputs = serve_at_steps(
        llm, prompts, greedy(24), arrivals, llm.scheduler.check_integrity, max_steps=5000
    )
    assert [o.token_ids for o in outputs] == expected
    assert evicted, "the pool was meant to run dry and evict"
    assert sum(o.cached_tokens for o in outputs) > 0
    sched = llm.scheduler
    assert sched.allocator.num_free + len(sched.cache.all_pages()) == sched.allocator.num_pages


def test_preemption_with_radix(tiny_llama_dir):
    prompts = sharing_prompts(tiny_llama_dir)[:6]
    expected = hf_greedy(tiny_llama_dir, prompts, 40)
    longest = max(len(p) for p in prompts) + 40
    for page_size in PAGE_SIZES:
        llm = new_llm(
            stage03, tiny_llama_dir, page_size=page_size, num_pages=-(-(longest + 8) // page_size) + 2
        )
        outputs = serve_at_steps(
            llm, prompts, greedy(40), check=llm.scheduler.check_integrity, max_steps=5000
        )
        assert [o.token_ids for o in outputs] == expected
        assert llm.scheduler.num_preemptions > 0, "the pool was meant to run dry"


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_full_prefix_hit_matches_hf_logprobs(tiny_model_dir, page_size):
    prompt = sample_prompts(tiny_model_dir, n=3, seed=22)[1]  # 60 tokens
    reference = hf_step_logprobs(tiny_model_dir, prompt, 4)
    llm = new_llm(stage03, tiny_model_dir, page_size=page_size)
    vocab = llm.config.vocab_size
    first = llm.generate([prompt], greedy(4, logprobs=vocab))[0]
    second = llm.generate([prompt], greedy(4, logprobs=vocab))[0]
    assert first.cached_tokens == 0
    assert second.cached_tokens == (len(prompt) - 1) // page_size * page_size  # all but the last token
    assert second.token_ids == first.token_ids
    for step, entry in enumerate(second.logprobs):
        torch.testing.assert_close(full_logprobs(entry, vocab), reference[step], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_multi_turn_chat_reuses_its_history(tiny_model_dir, page_size):
    llm = new_llm(stage03, tiny_model_dir, page_size=page_size)
    naive = new_llm(stage03, tiny_model_dir, page_size=page_size, cache="naive")
    messages = sample_prompts(tiny_model_dir, n=5, seed=23)
    history: list[int] = []
    cached = []
    for turn, message in enumerate(messages[1:]):  # 60, then random lengths
        prompt = history + message[:20]
        out = llm.generate([prompt], greedy(8))[0]
        assert out.token_ids == naive.generate([prompt], greedy(8))[0].token_ids
        if turn:
            # Everything the previous turn computed (its prompt and all but its last token) was
            # inserted when it finished, in whole pages.
            assert out.cached_tokens == (len(history) - 1) // page_size * page_size
        cached.append(out.cached_tokens)
        history = prompt + out.token_ids
        llm.scheduler.check_integrity()
    assert cached[0] == 0 and all(a < b for a, b in zip(cached, cached[1:], strict=False))


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_shared_prefix_computes_only_unshared_tokens(tiny_qwen3_dir, page_size):
    """All requests arrive at once. Each group's system prompt is computed once (requests that
    share it wait one step for the first one's prefill), then only the questions are."""
    rng = random.Random(5)
    groups, per_group, prefix_len = 3, 5, 48
    prompts, suffixes = [], []
    for _ in range(groups):
        system = [rng.randrange(3, 500) for _ in range(prefix_len)]
        for j in range(per_group):
            suffix = [rng.randrange(3, 500) for _ in range(rng.randint(0, 12))] if j else []
            prompts.append(system + suffix)
            suffixes.append(len(suffix))
    order = list(range(len(prompts)))
    rng.shuffle(order)
    prompts, suffixes = [prompts[i] for i in order], [suffixes[i] for i in order]
    llm = new_llm(stage03, tiny_qwen3_dir, page_size=page_size)
    outputs = llm.generate(prompts, greedy(4))
    computed = sum(len(p) - o.cached_tokens for p, o in zip(prompts, outputs, strict=True))
    # Unshared tokens (each system prompt once, every suffix) plus one per request; with pages of
    # several tokens a match also stops short of up to page_size - 1 shared tokens.
    bound = groups * prefix_len + sum(suffixes) + len(prompts) * page_size
    assert computed <= bound
    assert computed == llm.scheduler.num_prompt_tokens - llm.scheduler.num_cached_tokens
    naive = new_llm(stage03, tiny_qwen3_dir, page_size=page_size, cache="naive")
    assert [o.token_ids for o in naive.generate(prompts, greedy(4))] == [o.token_ids for o in outputs]


def test_cache_switch_and_cli(tiny_llama_dir, capsys):
    with pytest.raises(UserError, match="unknown prefix cache"):
        new_llm(stage03, tiny_llama_dir, cache="lru")
    prompt = " ".join(["The cat reads the first page."] * 6)  # long enough to be worth sharing
    for cache, hit in (("radix", True), ("naive", False)):
        code = cli.main(["--model", str(tiny_llama_dir), "--device", "cpu", "--prompt", prompt, "--prompt",
                         prompt, "--max-tokens", "4", "--cache", cache])  # fmt: skip
        err = capsys.readouterr().err
        assert code == 0 and f"prefix cache ({cache})" in err
        cached = int(err.split(f"prefix cache ({cache}): ")[1].split()[0])
        assert (cached > 0) == hit
    with pytest.raises(SystemExit):
        cli.parse_args(["--prompt", "x", "--cache", "lru"])


def test_cached_tokens_are_counted_per_request(tiny_qwen3_dir):
    llm = new_llm(stage03, tiny_qwen3_dir)
    prompt = sample_prompts(tiny_qwen3_dir, n=2, seed=24)[1]
    first = llm.generate([prompt], greedy(2))[0]
    # The first request left its prompt and its first output token (the last has no KV yet).
    outs = llm.generate([prompt + [first.token_ids[0], 5, 6], prompt[:30] + [9]], greedy(2))
    assert [o.cached_tokens for o in outs] == [len(prompt) + 1, 30]
