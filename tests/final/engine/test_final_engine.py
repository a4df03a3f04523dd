"""final/'s offline LLM without a server: outputs, sampling, stop strings, preemption, aborts,
limits, and one clear error per bad option."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open

import final
from final.core.errors import UserError
from final.core.sampling_params import SamplingParams
from tests.fixtures.tiny_models import hf_greedy, sample_prompts

# ---------------------------------------------------------------------------------------------
# The offline LLM

_llms: dict[tuple, final.LLM] = {}


def make_llm(model_dir: Path, **kwargs) -> final.LLM:
    key = (str(model_dir), tuple(sorted(kwargs.items())))
    if key not in _llms:
        _llms[key] = final.LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)
    return _llms[key]


def greedy(max_tokens: int = 24, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kw)


def assert_pool_is_whole(llm: final.LLM) -> None:
    """Idle: every page is free or cached and unlocked (so evictable), and the integrity check passes."""
    core = llm.core
    assert not core.has_work()
    cache = core.kv.prefix_cache
    assert core.kv.num_free_pages + cache.evictable_pages == core.kv.num_pages, "KV pages leaked"
    assert cache.num_cached_pages == cache.evictable_pages, "a finished request left a lock behind"
    assert core.executor.runner.page_table.num_free_rows == llm.engine_config.max_running_requests
    core.check_integrity()


def test_public_api_matches_the_stages(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir)
    assert llm.config.vocab_size > 0
    out = llm.generate(["The cat reads"], greedy(5))[0]
    assert isinstance(out, final.RequestOutput)
    assert len(out.token_ids) == 5 and out.finish_reason == "length"
    assert out.text == llm.tokenizer.decode(out.token_ids)
    assert len(out.token_times) == 5 and out.token_times == sorted(out.token_times)
    assert 0 < out.ttft_s <= out.latency_s
    assert out.cached_tokens == 0  # nothing cached yet starts with this prompt's first token
    again = llm.generate(["The cat reads"], greedy(5))[0]
    assert again.token_ids == out.token_ids
    assert again.cached_tokens == len(out.prompt_ids) - 1  # a full hit still computes the last token


def test_sampling_params_are_duck_typed(tiny_qwen3_dir):
    """The conformance suite passes stages.common's SamplingParams; any object with the fields works."""
    llm = make_llm(tiny_qwen3_dir)
    prompt = sample_prompts(tiny_qwen3_dir, n=1, seed=4)[0]
    ours = llm.generate([prompt], greedy(6))[0].token_ids
    foreign = SimpleNamespace(**vars(greedy(6)))
    assert llm.generate([prompt], foreign)[0].token_ids == ours
    with pytest.raises(UserError, match="temperature"):
        llm.add_request(prompt, SimpleNamespace(temperature=-1.0))


def test_stop_string_spanning_tokens_cuts_the_text_and_frees_pages(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir)
    prompt = sample_prompts(tiny_qwen3_dir, n=2, seed=5)[1]
    free = llm.generate([prompt], greedy(24))[0]
    pieces = [llm.tokenizer.decode([t]) for t in free.token_ids]
    # A stop string made of the end of one token's text and the start of the next one's.
    k = next(
        i
        for i in range(3, len(pieces) - 1)
        if pieces[i] and pieces[i + 1] and "\ufffd" not in pieces[i] + pieces[i + 1]
    )
    stop = pieces[k][-1] + pieces[k + 1][0]
    cut = free.text.find(stop)
    out = llm.generate([prompt], greedy(24, stop=[stop]))[0]
    assert out.finish_reason == "stop"
    assert out.text == free.text[:cut]
    assert out.token_ids == free.token_ids[: len(out.token_ids)] and len(out.token_ids) < 24
    assert_pool_is_whole(llm)  # the engine was told to drop the request when the stop string hit


def test_seeded_sampling_is_reproducible_and_batch_independent(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir)
    prompts = sample_prompts(tiny_qwen3_dir, n=4, seed=6)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = llm.generate([prompts[0]], seeded)[0].token_ids
    other = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    batched = llm.generate(prompts, [seeded, other, other, other])[0].token_ids
    assert alone == batched
    different = llm.generate(
        [prompts[0]], SamplingParams(temperature=1.0, top_p=0.9, seed=99, max_tokens=16, ignore_eos=True)
    )
    assert different[0].token_ids != alone


def test_preemption_gives_the_same_tokens_and_leaks_nothing(tiny_llama_dir):
    prompts = sample_prompts(tiny_llama_dir, n=5, seed=7)
    expected = hf_greedy(tiny_llama_dir, prompts, 24)
    tight = make_llm(tiny_llama_dir, page_size=4, num_pages=40, max_running_requests=4)
    outs = tight.generate(prompts, greedy(24))
    assert [o.token_ids for o in outs] == expected
    assert tight.core.scheduler.num_preemptions > 0, "the pool was meant to be too small"
    assert_pool_is_whole(tight)


def test_too_big_requests_are_refused_with_the_limits(tiny_llama_dir):
    llm = make_llm(tiny_llama_dir, page_size=4, num_pages=40, max_running_requests=4)
    with pytest.raises(UserError, match="context holds 256"):
        llm.add_request(list(range(1, 300)), greedy(4))
    with pytest.raises(UserError, match="pool holds 160"):
        llm.add_request(list(range(1, 100)), greedy(200))
    with pytest.raises(UserError, match="empty"):
        llm.add_request([], greedy(4))
    assert_pool_is_whole(llm)


def test_abort_frees_pages_of_running_and_waiting_requests(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir, max_running_requests=2)
    prompts = sample_prompts(tiny_qwen3_dir, n=4, seed=8)
    rids = [llm.add_request(p, greedy(50)) for p in prompts]
    llm.step()
    llm.step()
    assert llm.core.scheduler.num_running == 2 and llm.core.scheduler.num_waiting == 2
    assert llm.core.kv.num_free_pages < llm.core.kv.num_pages
    for rid in rids:
        assert llm.core.abort(rid)
        llm.requests.pop(rid)
    assert not llm.core.abort(rids[0])  # gone already
    assert_pool_is_whole(llm)


def test_merged_projections_hold_the_checkpoint_weights(tiny_qwen3_dir):
    """q/k/v and gate/up are merged at load time: check the slices, not only the outputs."""
    layer = make_llm(tiny_qwen3_dir).core.executor.runner.model.model.layers[1]
    with safe_open(str(tiny_qwen3_dir / "model.safetensors"), framework="pt") as f:
        w = {n: f.get_tensor(n) for n in f.keys() if n.startswith("model.layers.1.")}
    qkv = torch.cat([w[f"model.layers.1.self_attn.{p}_proj.weight"] for p in "qkv"])
    gate_up = torch.cat([w[f"model.layers.1.mlp.{p}_proj.weight"] for p in ("gate", "up")])
    torch.testing.assert_close(layer.self_attn.qkv_proj.weight, qkv, rtol=0, atol=0)
    torch.testing.assert_close(layer.mlp.gate_up_proj.weight, gate_up, rtol=0, atol=0)


def test_logits_only_for_each_requests_last_token(tiny_qwen3_dir):
    llm = make_llm(tiny_qwen3_dir)
    seen: list[tuple[int, ...]] = []
    head = llm.core.executor.runner.model.lm_head
    handle = head.register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    try:
        llm.generate(sample_prompts(tiny_qwen3_dir, n=3, seed=9)[1:], greedy(2))
    finally:
        handle.remove()
    assert seen[0][0] == 2, f"the LM head ran on {seen[0][0]} rows for a prefill of 2 requests"


# ---------------------------------------------------------------------------------------------
# Bad options: one clear error each


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"attn": "nope"}, "choose from torch, fi, fa, trtllm"),
        ({"attn": "fi"}, "CUDA"),
        ({"cache": "lru"}, "choose from radix, naive"),
        ({"chunk_policy": "fifo"}, "unknown chunk policy .fifo.; choose from mixed, prefill-first"),
        ({"max_prefill_length": 0}, "--max-prefill-length"),
        ({"page_size": 0}, "--page-size"),
        ({"no_such_option": 1}, "unknown engine option"),
    ],
)
def test_bad_engine_options_are_user_errors(tiny_qwen3_dir, kwargs, needle):
    with pytest.raises(UserError, match=needle):
        final.LLM(str(tiny_qwen3_dir), device="cpu", **kwargs)


def test_cuda_graph_flag_on_the_cpu_logs_one_line(tiny_qwen3_dir, caplog):
    with caplog.at_level(logging.INFO, logger="final"):
        final.LLM(str(tiny_qwen3_dir), device="cpu", cuda_graph_max_bs=8)
    lines = [r.getMessage() for r in caplog.records if "cuda-graph" in r.getMessage()]
    assert lines == ["--cuda-graph-max-bs 8 ignored on the CPU: CUDA graphs need a GPU"]


@pytest.mark.parametrize("overlap", ["on", "off"])
def test_the_engine_says_whether_the_step_it_collected_computed_prompt_tokens(tiny_qwen3_dir, overlap):
    """The online benchmark's decode-step reference (scripts/stream_metrics.py): a step with a
    prompt in it is no decode step, the ones after it are, and a new prompt makes one again (under
    overlap the step collected next was launched before the prompt came: one step later)."""
    core = make_llm(tiny_qwen3_dir, overlap=overlap).core
    kinds, added = [], False
    core.add_request(1001, list(range(5, 25)), greedy(6))
    while core.has_work():
        if core.step():
            kinds.append(core.collected_decode_only)
        if len(kinds) == 3 and not added:
            core.add_request(1002, list(range(40, 70)), greedy(2))
            added = True
    assert kinds[:3] == [False, True, True]
    later = kinds[3:]
    assert later.count(False) == 1, later
    assert later.index(False) == (1 if overlap == "on" else 0)
