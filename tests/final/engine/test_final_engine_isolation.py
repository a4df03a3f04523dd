"""One request's bad input never fails another (issue 15, part 1), inside the engine.

Values the device tables cannot hold are refused when the request arrives (a UserError for that
request alone); and should storing one request's sampling parameters still fail when its step
is built, that request leaves the batch with an error while the others go on, token for token as
if it had never come, with no `fail_all` and the KV pool whole. Both loops, overlap off and on.
"""

from __future__ import annotations

import pytest

import final
from final.core.config import EngineConfig
from final.core.errors import UserError
from final.core.sampling_params import SamplingParams
from final.engine.sampler import Sampler
from final.runtime.build import build_engine
from tests.fixtures.tiny_models import sample_prompts

POISON_TOP_K = 7  # the marker of the request whose parameters "cannot be stored"


def run(llm: final.LLM, prompts: list[list[int]], params: list[SamplingParams]) -> dict[int, object]:
    """Every request added at once, stepped to the end with the pool checked after each step;
    {prompt index: RequestOutput}."""
    index = {llm.add_request(p, sp): i for i, (p, sp) in enumerate(zip(prompts, params, strict=True))}
    outputs = {}
    for _ in range(2000):
        for rid, out in llm.step():
            outputs[index[rid]] = out
        llm.core.check_integrity()
        if len(outputs) == len(prompts) and not llm.core.has_work():
            break
    assert len(outputs) == len(prompts), "the engine stopped making progress"
    kv = llm.core.kv
    assert kv.num_free_pages + kv.prefix_cache.num_cached_pages == kv.num_pages
    assert kv.prefix_cache.num_cached_pages == kv.prefix_cache.evictable_pages, "a lock was left behind"
    return outputs


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_a_request_whose_params_cannot_be_stored_fails_alone(tiny_qwen3_dir, monkeypatch, overlap):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", overlap=overlap)
    prompts = sample_prompts(tiny_qwen3_dir, n=4, seed=3)
    good = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True) for _ in prompts]
    good[1] = SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True)
    reference = run(llm, prompts, good)

    real_row_values = Sampler.row_values

    def row_values(params):
        if params.top_k == POISON_TOP_K:
            raise RuntimeError("cannot store this row")
        return real_row_values(params)

    def no_fail_all(message):
        raise AssertionError(f"fail_all called: {message}")

    monkeypatch.setattr(Sampler, "row_values", staticmethod(row_values))
    monkeypatch.setattr(llm.core, "fail_all", no_fail_all)
    poisoned = SamplingParams(temperature=0.5, top_k=POISON_TOP_K, max_tokens=12)
    mixed = run(llm, [*prompts, prompts[0][:5]], [*good, poisoned])
    bad = mixed[len(prompts)]
    assert bad.finish_reason == "error" and bad.token_ids == []
    for i in range(len(prompts)):
        assert mixed[i].token_ids == reference[i].token_ids, f"request {i} changed"
        assert mixed[i].finish_reason == "length"


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [("top_k", 10**20, "top_k"), ("seed", 2**70, "seed"), ("temperature", float("inf"), "temperature")],
)
def test_unrepresentable_values_are_refused_on_arrival(tiny_qwen3_dir, field, value, needle):
    config = EngineConfig(model=str(tiny_qwen3_dir), device="cpu", dtype="float32")
    core = build_engine(config, tiny_qwen3_dir)
    params = SamplingParams(max_tokens=4)
    setattr(params, field, value)  # past the constructor's check, as a pickled message would be
    with pytest.raises(UserError, match=needle):
        core.add_request(0, [1, 2, 3], params)
    assert not core.has_work()


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_a_step_that_fails_in_admission_fails_every_request_and_the_engine_goes_on(
    tiny_qwen3_dir, monkeypatch, overlap
):
    """A bug in the middle of scheduling (here: the KV manager's admit raising for the second
    prompt of a step) is what `fail_all` is for: every request ends with an error, the pool is whole,
    and the next request runs. `fail_all` itself must not trip over a request the failed step had
    half-moved (the admission loop took it off the queue before the call that raised, and
    `fail_all`'s abort then raised in its turn: the engine process exited)."""
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", overlap=overlap)
    prompts = sample_prompts(tiny_qwen3_dir, n=3, seed=9)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    rids = [llm.add_request(p, params) for p in prompts]
    real_admit, calls = llm.core.kv.admit, []

    def admit(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected")
        return real_admit(*args, **kwargs)

    monkeypatch.setattr(llm.core.kv, "admit", admit)
    with pytest.raises(RuntimeError, match="injected"):
        for _ in range(10):
            llm.core.step()
    failed = llm.core.fail_all("the engine failed: RuntimeError: injected")
    assert {d.rid for d in failed} == set(rids) and all(d.finish_reason == "error" for d in failed)
    llm.core.check_integrity()
    monkeypatch.setattr(llm.core.kv, "admit", real_admit)
    for rid in rids:
        llm.requests.pop(rid, None)
    (out,) = llm.generate([prompts[0]], params, use_tqdm=False)
    assert len(out.token_ids) == 6
    kv = llm.core.kv
    assert kv.num_free_pages + kv.prefix_cache.num_cached_pages == kv.num_pages
