"""final/'s scheduler and KV cache manager: pages never leak or get shared, whatever arrives and
leaves."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from final.core.sampling_params import SamplingParams
from final.kvcache.manager import KVCacheManager
from final.kvcache.page_table import PageTable
from final.kvcache.registry import PREFIX_CACHES, create_prefix_cache
from final.scheduler.policy import POLICIES, create_policy
from final.scheduler.request import Request
from final.scheduler.scheduler import Scheduler

# ---------------------------------------------------------------------------------------------
# Scheduler and cache manager: pages never leak or get shared, whatever arrives and leaves


@settings(max_examples=60, deadline=None)
@given(
    cache=st.sampled_from(sorted(PREFIX_CACHES)),
    policy=st.sampled_from(sorted(POLICIES)),  # every registered policy
    page_size=st.sampled_from([1, 2, 4]),
    num_pages=st.integers(min_value=16, max_value=60),
    max_running=st.integers(min_value=1, max_value=5),
    budget=st.sampled_from([1, 3, 8, 64, 10_000]),
    requests=st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 24), st.integers(1, 16), st.booleans()),
        min_size=1,
        max_size=10,
    ),
    deferred=st.booleans(),
)
def test_scheduler_never_leaks_or_shares_pages(
    cache, policy, page_size, num_pages, max_running, budget, requests, deferred
):
    """Heavy sharing (prompts start with one of three heads), chunking, eviction, preemption and
    aborts (some mid-prefill): after every step each page is free, cached or owned exactly once.
    `deferred`: as under overlap, a finished request keeps its row and pages until the step after
    (finish's defer_release, released after the next schedule), so rows run out before the
    running count says (an H200 server at 64 requests/s crashed on an empty row list)."""
    table = PageTable(max_running, 64, torch.device("cpu"), padding_page=num_pages)
    kv = KVCacheManager(num_pages, page_size, create_prefix_cache(cache, page_size), table)
    sched = Scheduler(kv, max_running, budget, create_policy(policy))
    heads = [[5, 6, 7, 8, 9, 10, 11], [5, 6, 7, 20], [30 + i for i in range(12)]]
    live = []
    for rid, (head, prompt_len, max_new, abort_early) in enumerate(requests):
        prompt = (heads[head] + [rid + 100] * prompt_len)[: max(prompt_len, 1)]
        if len(prompt) + max_new <= num_pages * page_size:
            sched.add(Request(rid=rid, prompt_ids=prompt, params=SamplingParams(), max_new_tokens=max_new))
            live.append((rid, abort_early))
    aborted = {rid for rid, early in live if early}
    steps = 0
    while sched.has_work() or sched.retiring:
        decoding_before = {id(r) for r in sched.running if r.is_decoding}
        batch = sched.schedule()
        sched.release_retired()  # the step in flight is collected
        if batch is None:
            assert deferred, "nothing could run, with nothing held back"
            continue
        prefill_tokens = sum(
            q for r, q in zip(batch.requests, batch.query_lens, strict=True) if id(r) not in decoding_before
        )
        assert prefill_tokens <= budget, "a step went over the prefill budget"
        if policy == "prefill-first" and prefill_tokens:
            assert all(id(r) not in decoding_before for r in batch.requests), "decodes ran with prefill"
        owned = [p for r in sched.running for p in r.kv.own_pages]
        assert len(owned) == len(set(owned)), "a page is owned by two live requests"
        sched.check_integrity()
        table.flush()
        for r in sched.running:
            assert table.table[r.kv.row, : len(r.kv.pages)].tolist() == r.kv.pages
        for req, q_len, sampled in zip(batch.requests, batch.query_lens, batch.sampled, strict=True):
            if not sampled:
                assert req.num_computed + q_len < req.seq_len, "only a cut prompt samples nothing"
                req.num_computed += q_len
                continue
            completes_prefill = q_len > 1 or not req.output_ids
            req.num_computed += q_len
            req.output_ids.append(7)
            if len(req.output_ids) >= req.max_new_tokens:
                sched.finish(req, defer_release=deferred)
            elif completes_prefill:
                sched.cache_request(req)
        sched.check_integrity()
        for rid in list(aborted):
            if steps >= 2 and sched.abort(rid):
                aborted.discard(rid)
                sched.check_integrity()
        steps += 1
        assert steps < 10_000
    assert kv.num_free_pages + kv.prefix_cache.evictable_pages == num_pages
    assert kv.prefix_cache.num_cached_pages == kv.prefix_cache.evictable_pages
    assert table.num_free_rows == max_running
