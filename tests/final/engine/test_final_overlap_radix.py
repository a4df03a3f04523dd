"""Overlap keeps the radix hits of the serial loop.

A prompt is offered to the prefix cache when the step that completes it is *launched* (every
later step runs after it on the one stream). Offered at collect instead, the step scheduled
meanwhile under overlap admits a request that waited one step for the shared prefix
(MIN_SHARED_TO_WAIT) before the prefix is in the cache, and it computes the prefix again: cached
tokens [0, 0, 40] instead of [0, 40, 40] (found by the stage 06 work; stage 06 does the same).
"""

from __future__ import annotations

import final
from final.core.sampling_params import SamplingParams
from tests.fixtures.tiny_models import sample_prompts


def test_overlap_keeps_the_radix_hits_of_the_serial_loop(tiny_qwen3_dir):
    base = sample_prompts(tiny_qwen3_dir, n=4, seed=4)
    prompts = [base[1][:40] + p[:5] for p in base[:3]]  # a 40-token shared head
    cached = {}
    for overlap in ("off", "on"):
        llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", overlap=overlap, page_size=2,
                        num_pages=400)  # fmt: skip
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        cached[overlap] = [o.cached_tokens for o in outs]
    assert cached["off"] == [0, 40, 40]  # the later two wait a step for the head, then hit it
    assert cached["on"] == cached["off"]
