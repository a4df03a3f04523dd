"""final/'s radix prefix cache (stage 03) and chunked prefill (stage 04): the same greedy tokens
as HF transformers with the cache on or off, with prompts chunked or whole; page accounting
checked after every step; cached tokens growing over a multi-turn chat; aborts and preemptions
giving back exactly their own pages."""

from __future__ import annotations

from pathlib import Path

import pytest

import final
from final.core.sampling_params import SamplingParams
from final.scheduler.request import ScheduledBatch
from tests.fixtures.tiny_models import hf_greedy, sample_prompts

NEW = 8


def greedy(max_tokens: int = NEW) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def make_llm(model_dir: Path, **kwargs) -> final.LLM:
    return final.LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)


class Recorder:
    """Wraps the scheduler and the prefix cache to see every batch and every eviction."""

    def __init__(self, llm: final.LLM):
        self.batches: list[ScheduledBatch] = []
        self.decoding: list[list[bool]] = []  # per batch, which requests ran a decode token
        self.evicted = 0
        sched, cache = llm.core.scheduler, llm.core.kv.prefix_cache
        schedule, evict = sched.schedule, cache.evict

        def record_schedule():
            batch = schedule()
            if batch is not None:
                self.batches.append(batch)
                self.decoding.append([r.is_decoding for r in batch.requests])
            return batch

        def record_evict(n):
            pages = evict(n)
            self.evicted += len(pages)
            return pages

        sched.schedule, cache.evict = record_schedule, record_evict


def run_checked(llm: final.LLM, waves: list[list[list[int]]], gap: int = 3) -> list[final.RequestOutput]:
    """Submit each wave `gap` steps after the previous one; check the pool after every step, and
    that a prompt still being chunked never enters the prefix cache."""
    core, page_size = llm.core, llm.core.config.page_size
    order: dict[int, int] = {}
    results: dict[int, final.RequestOutput] = {}
    pending, steps, n = list(waves), 0, 0
    while pending or llm.has_unfinished():
        if pending and steps % gap == 0:
            for prompt in pending.pop(0):
                order[llm.add_request(prompt, greedy())] = n
                n += 1
        for rid, out in llm.step():
            results[order[rid]] = out
        core.check_integrity()
        for req in core.scheduler.running:
            if not req.output_ids and req.num_computed < len(req.prompt_ids):
                assert req.kv.num_shared * page_size == req.cached_tokens, "a cut prompt entered the cache"
        steps += 1
        assert steps < 5000
    assert_idle_and_whole(llm)
    return [results[i] for i in range(n)]


def assert_idle_and_whole(llm: final.LLM) -> None:
    core = llm.core
    cache = core.kv.prefix_cache
    assert not core.has_work()
    assert cache.num_cached_pages == cache.evictable_pages, "a lock outlived its request"
    assert core.kv.num_free_pages + cache.num_cached_pages == core.kv.num_pages
    assert core.executor.runner.page_table.num_free_rows == llm.engine_config.max_running_requests
    core.check_integrity()


def sharing_workload(model_dir: Path) -> list[list[list[int]]]:
    """Three waves over one system prompt and a second shared head: exact repeats (full-prefix
    hits), prompts that extend earlier ones, and prompts that leave a shared head part way."""
    base = sample_prompts(model_dir, n=8, seed=11)
    system = base[1][:40]  # the 60-token prompt's head
    other = base[2][:12] if len(base[2]) >= 12 else base[2] + base[3][:12]
    wave1 = [system + base[3][:9], system + base[4][:5], other + base[5][:7]]
    wave2 = [wave1[0], system + base[3][:9] + base[6][:6], other + base[5][:3] + base[7][:4], system[:21]]
    wave3 = [wave1[1], wave2[1], system + base[0], other + base[5][:7]]
    return [wave1, wave2, wave3]


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def model_and_oracle(request):
    model_dir = request.getfixturevalue(f"tiny_{request.param}_dir")
    waves = sharing_workload(model_dir)
    prompts = [p for wave in waves for p in wave]
    return model_dir, waves, hf_greedy(model_dir, prompts, NEW)


@pytest.mark.parametrize("page_size", [1, 4])
def test_radix_equals_naive_equals_hf_under_eviction_pressure(model_and_oracle, page_size):
    model_dir, waves, expected = model_and_oracle
    num_pages = 96 // page_size  # far less than the workload's tokens: cached prefixes get evicted
    outs = {}
    for cache in ["radix", "naive"]:
        llm = make_llm(
            model_dir, cache=cache, page_size=page_size, num_pages=num_pages, max_running_requests=3
        )
        rec = Recorder(llm)
        outs[cache] = run_checked(llm, waves)
        assert [o.token_ids for o in outs[cache]] == expected, f"--cache {cache} differs from HF"
        if cache == "radix":
            assert rec.evicted > 0, "the pool was meant to be too small to keep every prefix"
            cached = [o.cached_tokens for o in outs[cache]]
            full_hit = len(waves[0][0]) - 1
            assert cached[3] == full_hit - full_hit % page_size, (
                f"a repeated prompt should hit in full: {cached}"
            )
            assert sum(cached) > 0
        else:
            assert all(o.cached_tokens == 0 for o in outs[cache])
            assert llm.core.kv.prefix_cache.num_cached_pages == 0


@pytest.mark.parametrize("policy", ["mixed", "prefill-first"])
def test_chunked_prefill_equals_unchunked(model_and_oracle, policy):
    model_dir, waves, expected = model_and_oracle
    for budget in [1, 7, 100_000]:
        llm = make_llm(model_dir, max_prefill_length=budget, chunk_policy=policy, page_size=2, num_pages=80)
        rec = Recorder(llm)
        outs = run_checked(llm, waves, gap=2)
        assert [o.token_ids for o in outs] == expected, f"budget {budget}, {policy} differs from HF"
        for batch, decoding in zip(rec.batches, rec.decoding, strict=True):
            prefill = sum(q for q, d in zip(batch.query_lens, decoding, strict=True) if not d)
            assert prefill <= budget, "a step went over the prefill budget"
            if policy == "prefill-first":
                assert not (prefill and any(decoding)), "prefill-first ran a decode next to prefill"
        cut = sum(not s for b in rec.batches for s in b.sampled)
        if budget == 100_000:
            assert cut == 0
        else:
            assert cut > 0, "some prompt should have been cut into chunks"
        if budget == 7 and policy == "mixed":
            assert any(any(d) and not all(d) for d in rec.decoding), (
                "a mixed step should carry decodes and prefill"
            )


def test_multi_turn_chat_caches_more_every_turn(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir)  # the defaults: radix, page size 1
    prompts = sample_prompts(tiny_qwen3_dir, n=5, seed=21)
    history: list[int] = []
    cached = []
    for turn in prompts[1:]:
        history += turn
        out = llm.generate([history], greedy(), progress=False)[0]
        assert out.token_ids == hf_greedy(tiny_qwen3_dir, [history], NEW)[0]
        cached.append(out.cached_tokens)
        expected = len(history) - len(turn) - 1 if cached[:-1] else 0  # all but the last token computed
        assert out.cached_tokens == max(expected, 0), f"turn {len(cached)}: {cached}"
        history += out.token_ids
        assert_idle_and_whole(llm)
    assert cached[0] < cached[1] < cached[2] < cached[3]


def test_abort_mid_chunk_and_mid_decode_gives_back_only_its_own_pages(tiny_llama_dir):
    llm = make_llm(tiny_llama_dir, max_prefill_length=4, page_size=2, num_pages=100)
    core, cache = llm.core, llm.core.kv.prefix_cache
    prompts = sample_prompts(tiny_llama_dir, n=4, seed=5)
    first = prompts[1][:30]
    llm.generate([first], greedy(), progress=False)
    before = sorted(cache.all_pages())
    # A request that shares `first` and is cut mid-prompt: abort it between two chunks.
    rid = llm.add_request(first + prompts[2] + prompts[3], greedy())
    llm.step()
    core.check_integrity()
    req = core.scheduler.by_rid[rid]
    assert req.kv.num_shared > 0 and req.num_computed < len(req.prompt_ids), "it should be mid-prefill"
    assert core.abort(rid)
    llm.requests.pop(rid)
    assert_idle_and_whole(llm)
    assert sorted(cache.all_pages()) == before, "a cut prompt entered the cache or a cached page was freed"
    # A request aborted while decoding: its computed tokens stay cached, its lock goes.
    rid = llm.add_request(first + prompts[2][:3], greedy(40))
    for _ in range(12):
        llm.step()
        core.check_integrity()
    assert core.scheduler.by_rid[rid].output_ids
    assert core.abort(rid)
    llm.requests.pop(rid)
    assert_idle_and_whole(llm)
    assert set(before) < set(cache.all_pages())
    again = llm.generate([first + prompts[2][:3]], greedy(), progress=False)[0]
    assert again.cached_tokens == (len(first) + 3 - 1) // 2 * 2
    assert again.token_ids == hf_greedy(tiny_llama_dir, [first + prompts[2][:3]], NEW)[0]
