"""The conformance suite: every engine (each stage, and final/) produces HF transformers' greedy
tokens and log-probabilities, in fp32 on the CPU, on tiny random Qwen3 and Llama checkpoints."""

from __future__ import annotations

import pytest
import torch

from stages.common.sampling import SamplingParams
from tests.fixtures.driving import full_logprobs, serve_at_steps
from tests.fixtures.tiny_models import hf_greedy, hf_step_logprobs, sample_prompts
from tests.stage_list import ENGINES, load

NEW_TOKENS = 32

_llms: dict[tuple[str, str], object] = {}


def make_llm(engine: str, model_dir, **kwargs):
    """One engine instance per (engine, model) for the whole session: loading is the slow part."""
    key = (engine, str(model_dir), tuple(sorted(kwargs.items())))
    if key not in _llms:
        _llms[key] = load(engine).LLM(str(model_dir), device="cpu", dtype="float32", **kwargs)
    return _llms[key]


def greedy(max_tokens: int = NEW_TOKENS, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, **kwargs)


@pytest.mark.parametrize("engine", ENGINES)
def test_greedy_tokens_match_hf(engine, tiny_model_dir):
    prompts = sample_prompts(tiny_model_dir, n=5, seed=0)
    expected = hf_greedy(tiny_model_dir, prompts, NEW_TOKENS)
    outputs = make_llm(engine, tiny_model_dir).generate(prompts, greedy())
    assert [o.token_ids for o in outputs] == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_logprobs_match_hf(engine, tiny_model_dir):
    """Compare whole distributions, not only argmaxes: log_softmax over the full vocabulary at the
    prefill step (the prompt's last token) and the first decode steps."""
    prompt = sample_prompts(tiny_model_dir, n=3, seed=1)[2]
    steps = 4
    reference = hf_step_logprobs(tiny_model_dir, prompt, steps)
    llm = make_llm(engine, tiny_model_dir)
    vocab = llm.config.vocab_size
    out = llm.generate([prompt], greedy(steps, logprobs=vocab))[0]
    assert len(out.logprobs) == steps
    for step, entry in enumerate(out.logprobs):
        torch.testing.assert_close(full_logprobs(entry, vocab), reference[step], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("engine", ENGINES)
def test_batch_of_varied_lengths_arriving_at_different_steps(engine, tiny_model_dir):
    """Requests join a running batch at different decode steps; each must still get exactly the
    tokens it would get alone. Engines that serve one request at a time run them in turn."""
    prompts = sample_prompts(tiny_model_dir, n=6, seed=2)
    expected = hf_greedy(tiny_model_dir, prompts, NEW_TOKENS)
    llm = make_llm(engine, tiny_model_dir)
    if not hasattr(llm, "add_request"):
        outputs = llm.generate(prompts, greedy())
        assert [o.token_ids for o in outputs] == expected
        return
    arrivals = [0, 0, 3, 3, 7, 12]  # step at which each request is added
    outputs = serve_at_steps(llm, prompts, greedy(), arrivals)
    assert [o.token_ids for o in outputs] == expected


@pytest.mark.parametrize("engine", ENGINES)
def test_stops_at_stop_token_and_max_tokens(engine, tiny_model_dir):
    llm = make_llm(engine, tiny_model_dir)
    prompt = sample_prompts(tiny_model_dir, n=1, seed=3)[0]
    free_run = llm.generate([prompt], greedy(NEW_TOKENS))[0]
    assert free_run.finish_reason == "length" and len(free_run.token_ids) == NEW_TOKENS
    # Declare the 5th generated token a stop token: generation must end right there.
    stop_token = free_run.token_ids[4]
    first = free_run.token_ids.index(stop_token)
    stopped = llm.generate([prompt], greedy(NEW_TOKENS, stop_token_ids=[stop_token]))[0]
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free_run.token_ids[: first + 1]
