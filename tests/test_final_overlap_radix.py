"""A finding in final/'s overlap scheduling, kept as a strict xfail until final/ is fixed (then this
test passes, the xfail turns red, and the marker goes).

final/ offers a prompt to the prefix cache when the step that completed it is *collected*. With
overlap, the next step is scheduled before that, so a request that waited one step for a shared
prefix (MIN_SHARED_TO_WAIT) is admitted before the prefix is in the cache, and computes it again.
Stage 06 inserts the prompt when the step is launched (every later step runs after it on the one
stream), and gets the serial loop's hits (tests/test_stage06_overlap.py, the same schedule).
"""

from __future__ import annotations

import pytest

import final
from final.core.sampling_params import SamplingParams
from tests.fixtures.tiny_models import sample_prompts


@pytest.mark.xfail(strict=True, reason="final/ inserts a prompt into the prefix cache only at collect")
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
