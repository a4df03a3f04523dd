"""Stage 04 invariants: chunked prefill changes nothing but when tokens are computed.

Budgets smaller than, equal to and larger than the prompts, and 1, under both policies, give the
same greedy tokens and last-prompt-token logits as unchunked stage 03; chunking works with prefix
cache hits and with preemption; a half-prefilled prompt is never offered to the prefix cache."""

from __future__ import annotations

import pytest
import torch

from stages.common.sampling import SamplingParams
from tests.fixtures.driving import serve_at_steps
from tests.fixtures.tiny_models import hf_greedy, sample_prompts
from tests.stage_list import load

stage03 = load("stages.03_radix_cache")
stage04 = load("stages.04_chunked_prefill")
NEW = 12


def greedy(n=NEW, **kw):
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True, **kw)


@pytest.fixture(scope="module")
def prompts(tiny_qwen3_dir):
    short = sample_prompts(tiny_qwen3_dir, n=4, seed=21)
    long = [t for p in sample_prompts(tiny_qwen3_dir, n=10, seed=22) for t in p][:150]
    return [long, *short, long[:90] + short[0]]  # the last shares a 90-token prefix with the first


@pytest.fixture(scope="module")
def unchunked(tiny_qwen3_dir, prompts):
    llm = stage03.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    return llm.generate(prompts, greedy(logprobs=llm.config.vocab_size))


@pytest.mark.parametrize("policy", ["mixed", "prefill-first"])
@pytest.mark.parametrize("budget", [1, 7, 64, 150, 4096])
def test_chunked_equals_unchunked(tiny_qwen3_dir, prompts, unchunked, budget, policy):
    llm = stage04.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", max_prefill_length=budget,
                      chunk_policy=policy)  # fmt: skip
    outs = serve_at_steps(llm, prompts, greedy(logprobs=llm.config.vocab_size), [0, 0, 2, 5, 9, 30],
                          llm.scheduler.check_integrity, max_steps=20_000)  # fmt: skip
    assert [o.token_ids for o in outs] == [o.token_ids for o in unchunked]
    for ours, ref in zip(outs, unchunked, strict=True):  # the last prompt token's whole distribution
        torch.testing.assert_close(torch.tensor(ours.logprobs[0]["top_logprobs"]),
                                   torch.tensor(ref.logprobs[0]["top_logprobs"]), atol=1e-4, rtol=1e-4)  # fmt: skip
    assert (
        llm.runner.allocator.num_free + len(llm.scheduler.cache.all_pages()) == llm.runner.allocator.num_pages
    )


def test_budget_bounds_every_step(tiny_qwen3_dir, prompts):
    llm = stage04.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", max_prefill_length=16)
    for p in prompts:
        llm.add_request(p, greedy())
    seen_cut = False
    while llm.has_unfinished():
        batch = llm.scheduler.schedule()
        if batch is None:
            continue
        prefill_tokens = sum(q for r, q in zip(batch.requests, batch.query_lens, strict=True)
                             if q > 1 or not r.output_ids)  # fmt: skip
        assert prefill_tokens <= 16
        seen_cut |= not all(batch.sampled)
        _finish_step(llm, batch)
    assert seen_cut, "a 150-token prompt under a 16-token budget must be cut"


def _finish_step(llm, batch):
    """The second half of LLM.step() for a batch we scheduled ourselves."""
    original = llm.scheduler.schedule
    llm.scheduler.schedule = lambda: batch
    try:
        llm.step()
    finally:
        llm.scheduler.schedule = original


def test_mixed_policy_keeps_decodes_going(tiny_qwen3_dir, prompts):
    """While a long prompt is chunked, running requests still get a token every step (mixed), and
    get none (prefill-first)."""
    gaps = {}
    for policy in ("mixed", "prefill-first"):
        llm = stage04.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", max_prefill_length=8,
                          chunk_policy=policy)  # fmt: skip
        short = llm.add_request(prompts[1], greedy(40))
        for _ in range(3):
            llm.step()  # the short request is decoding now
        llm.add_request(prompts[0], greedy(4))  # 150 tokens: about 19 chunks of 8
        stalled = 0
        for _ in range(10):
            before = len(_request(llm, short).output_ids)
            llm.step()
            stalled += len(_request(llm, short).output_ids) == before
        gaps[policy] = stalled
    assert gaps["mixed"] == 0
    assert gaps["prefill-first"] == 10


def _request(llm, rid):
    return next(r for r in [*llm.scheduler.running, *llm.scheduler.waiting] if r.rid == rid)


def test_half_prefilled_prompt_is_not_shared(tiny_qwen3_dir, prompts):
    llm = stage04.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", max_prefill_length=32)
    first = llm.add_request(prompts[0], greedy())
    llm.step()  # first chunk of 32 of 150 tokens
    assert llm.scheduler.cache.all_pages() == [], "a partly prefilled prompt entered the cache"
    second = llm.add_request(prompts[0][:100] + [5, 6], greedy())
    llm.step()
    req = _request(llm, second)
    assert req.output.cached_tokens == 0, "matched pages of an unfinished prefill"
    outs = dict(run_stepwise_rest(llm))
    expected = hf_greedy(tiny_qwen3_dir, [prompts[0], prompts[0][:100] + [5, 6]], NEW)
    assert [outs[first].token_ids, outs[second].token_ids] == expected
    # Once the first prompt is in, a third request with the same head reuses it.
    third = llm.generate([prompts[0][:120] + [9]], greedy())[0]
    assert third.cached_tokens >= 100


def run_stepwise_rest(llm):
    while llm.has_unfinished():
        yield from llm.step()


def test_chunking_with_preemption(tiny_qwen3_dir, prompts):
    expected = hf_greedy(tiny_qwen3_dir, prompts, 30)
    longest = max(len(p) for p in prompts) + 30
    llm = stage04.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", max_prefill_length=20, page_size=4,
                      num_pages=-(-longest // 4) + 6)  # fmt: skip
    outs = serve_at_steps(llm, prompts, greedy(30), check=llm.scheduler.check_integrity, max_steps=20_000)
    assert [o.token_ids for o in outs] == expected
    assert llm.scheduler.num_preemptions > 0
