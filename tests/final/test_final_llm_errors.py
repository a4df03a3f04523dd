"""The offline API after bad input (issue 29, items 4 and 12): every value is checked before
anything is queued, a failed call leaves nothing behind, and the LLM stays usable after any error.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import final
from final.core.errors import UserError
from final.core.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir):
    return final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")


def assert_idle(llm: final.LLM) -> None:
    """Nothing queued or running, no request state kept, every KV page back."""
    assert not llm.has_unfinished() and not llm.core.has_work()
    kv = llm.core.kv
    assert kv.num_free_pages + kv.prefix_cache.num_cached_pages == kv.num_pages
    llm.core.check_integrity()


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"seed": 1.5}, "seed must be an integer"),
        ({"max_tokens": 2.5}, "max_tokens must be an integer"),
        ({"max_tokens": True}, "max_tokens must be an integer"),
        ({"top_k": 2.5}, "top_k must be an integer"),
        ({"temperature": "0.5"}, "temperature must be a number"),
        ({"top_p": None}, "top_p must be a number"),
        ({"stop_token_ids": [2.0]}, "stop_token_ids"),
        ({"stop": 5}, "stop must be a list"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else "",
)
def test_values_of_the_wrong_type_are_user_errors(fields, needle):
    with pytest.raises(UserError, match=needle):
        SamplingParams(**fields)


@pytest.mark.parametrize("bad", [{"seed": 1.5}, {"max_tokens": True}, {"temperature": "hot"}])
def test_a_bad_params_object_fails_the_call_and_the_next_call_works(llm, bad):
    """A params object other than SamplingParams (a stage's, a namespace) is checked the same way;
    the call that carries it fails before queueing, and the LLM answers the next call."""
    before = llm.generate([[5, 6, 7]], GREEDY, progress=False)[0].token_ids
    loose = SimpleNamespace(**{**vars(GREEDY), **bad})
    with pytest.raises(UserError):
        llm.generate([[5, 6, 7], [8, 9]], [GREEDY, loose], progress=False)
    assert_idle(llm)
    for _ in range(2):  # the request ids are not reused: "already in the engine" never comes
        assert llm.generate([[5, 6, 7]], GREEDY, progress=False)[0].token_ids == before


def test_a_prompt_that_cannot_fit_queues_none_of_the_call(llm):
    ok, too_long = [5, 6, 7], [5] * 300  # the tiny model's context is 256 tokens
    alone = llm.generate([[9, 10]], GREEDY, progress=False)[0].token_ids
    with pytest.raises(UserError, match="context"):
        llm.generate([ok, too_long], GREEDY, progress=False)
    assert_idle(llm)  # `ok` was not queued: it would run silently in the next call
    outs = llm.generate([[9, 10]], GREEDY, progress=False)
    assert len(outs) == 1 and outs[0].token_ids == alone


@pytest.mark.parametrize("prompt", [None, 5, [1.5, 2], [True], []])
def test_a_prompt_that_is_not_text_or_token_ids_is_a_user_error(llm, prompt):
    with pytest.raises(UserError):
        llm.generate([[5, 6], prompt], GREEDY, progress=False)
    assert_idle(llm)


def test_params_and_prompts_of_different_lengths_are_a_user_error(llm):
    with pytest.raises(UserError, match="1 prompts but 2 sampling parameters"):
        llm.generate([[5, 6]], [GREEDY, GREEDY], progress=False)
    assert_idle(llm)


def test_an_error_while_stepping_drops_the_calls_requests(llm, monkeypatch):
    """Ctrl-C (or any error) in the middle of generate: its requests leave the engine."""
    real_step, calls = llm.step, []

    def interrupted_step():
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(llm, "step", interrupted_step)
    long = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
    with pytest.raises(KeyboardInterrupt):
        llm.generate([[5, 6, 7], [8, 9, 10]], long, progress=False)
    monkeypatch.undo()
    assert_idle(llm)
    assert len(llm.generate([[5, 6, 7]], GREEDY, progress=False)) == 1


def test_a_top_p_that_rounds_to_zero_keeps_the_likeliest_token(llm):
    """1e-300 is 0.0 in the sampler's float32 table: it used to mask every token (empty output)."""
    greedy = llm.generate([[5, 6, 7]], GREEDY, progress=False)[0]
    tiny = SamplingParams(temperature=1.0, top_p=1e-300, max_tokens=8, ignore_eos=True, seed=1)
    out = llm.generate([[5, 6, 7]], tiny, progress=False)[0]
    assert out.token_ids == greedy.token_ids
