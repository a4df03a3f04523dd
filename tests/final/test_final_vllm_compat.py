"""vLLM's documented offline examples, run against final/'s LLM on the CPU with the tiny models.

Each test follows one of vLLM's examples (https://docs.vllm.ai/en/latest/examples/offline_inference/
basic.html and its neighbours: basic.py, generate.py, chat.py; the prompt forms of
https://docs.vllm.ai/en/latest/features/ ... `TextPrompt` / `TokensPrompt`), with `from vllm import`
changed to `from final import` and the model a tiny random checkpoint. What the examples read of
the outputs (`output.prompt`, `output.outputs[0].text`, ...) must be there and mean the same.
"""

from __future__ import annotations

import pytest

from final import LLM, SamplingParams
from final.core.outputs import CompletionOutput, Logprob
from tests.fixtures.tiny_models import hf_greedy

PROMPTS = [
    "Hello, my name is",
    "The president of the United States is",
    "The capital of France is",
    "The future of AI is",
]


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    # vLLM's engine arguments, under vLLM's names.
    return LLM(
        model=str(tiny_llama_dir), device="cpu", dtype="float32", tensor_parallel_size=1, max_model_len=256,
        gpu_memory_utilization=0.9, enforce_eager=True, seed=0, trust_remote_code=True,
    )  # fmt: skip


def test_basic(llm):
    """basic.py: a list of prompts, one SamplingParams, `output.prompt` and `outputs[0].text`."""
    sampling_params = SamplingParams(temperature=0.8, top_p=0.95)
    outputs = llm.generate(PROMPTS, sampling_params)
    assert [output.prompt for output in outputs] == PROMPTS
    for output in outputs:
        generated = output.outputs[0]
        assert isinstance(generated, CompletionOutput) and isinstance(generated.text, str)
        assert generated.text == llm.get_tokenizer().decode(generated.token_ids, skip_special_tokens=True)
        assert generated.finish_reason in ("stop", "length") and output.finished
        assert output.prompt_token_ids == llm.get_tokenizer().encode(output.prompt)
        assert (output.text, output.token_ids) == (generated.text, generated.token_ids)  # final/'s own names


def test_one_string_is_one_prompt(llm):
    """`llm.generate("Hi there")` is one request, not one per character."""
    outputs = llm.generate("Hi there", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(outputs) == 1 and outputs[0].prompt == "Hi there"
    assert outputs[0].prompt_token_ids == llm.get_tokenizer().encode("Hi there")


def test_generate_with_the_models_default_sampling_params(llm):
    """generate.py: start from get_default_sampling_params() and set fields on it."""
    sampling_params = llm.get_default_sampling_params()
    sampling_params.max_tokens = 5
    sampling_params.temperature = 0
    outputs = llm.generate(PROMPTS, sampling_params)
    assert all(len(o.outputs[0].token_ids) <= 5 for o in outputs)


def test_prompt_forms_give_the_same_answer(llm, tiny_llama_dir):
    """Text, {"prompt": text}, token ids and {"prompt_token_ids": ids}: one request each, the same
    tokens, and HF transformers' greedy tokens."""
    text = PROMPTS[2]
    ids = llm.get_tokenizer().encode(text)
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate(
        [text, {"prompt": text}, ids, {"prompt_token_ids": ids}], sampling_params=greedy, use_tqdm=False
    )
    assert len(outputs) == 4
    assert [o.prompt for o in outputs] == [text, text, None, None]
    assert all(o.prompt_token_ids == ids for o in outputs)
    expected = hf_greedy(tiny_llama_dir, [ids], 8)[0]
    assert all(o.outputs[0].token_ids == expected for o in outputs)
    single = llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)  # one dict alone
    assert len(single) == 1 and single[0].outputs[0].token_ids == expected


def test_n_answers_per_prompt(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    outputs = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    assert len(outputs) == 2
    for output in outputs:
        assert [c.index for c in output.outputs] == [0, 1, 2]
        assert len({tuple(c.token_ids) for c in output.outputs}) > 1, "seed + i: the answers differ"
    again = llm.generate(PROMPTS[:2], params, use_tqdm=False)
    assert [[c.token_ids for c in o.outputs] for o in again] == [
        [c.token_ids for c in o.outputs] for o in outputs
    ]


def test_logprobs_and_cumulative_logprob(llm):
    out = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4, logprobs=3), use_tqdm=False)[0]
    answer = out.outputs[0]
    assert len(answer.logprobs) == len(answer.token_ids)
    for token, candidates in zip(answer.token_ids, answer.logprobs, strict=True):
        assert token in candidates and all(isinstance(lp, Logprob) for lp in candidates.values())
        assert candidates[token].rank == 1  # greedy: the sampled token is the likeliest
        assert isinstance(candidates[token].decoded_token, str)
    assert answer.cumulative_logprob == pytest.approx(
        sum(c[t].logprob for t, c in zip(answer.token_ids, answer.logprobs, strict=True))
    )
    plain = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert plain.outputs[0].logprobs is None and plain.outputs[0].cumulative_logprob is None  # as vLLM


def test_penalties_change_the_answer(llm):
    prompt = "the the the the the the"
    base = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    plain = llm.generate(prompt, base, use_tqdm=False)[0].outputs[0].token_ids
    for name, value in [("repetition_penalty", 1.5), ("presence_penalty", 1.5), ("frequency_penalty", 1.5)]:
        penalized = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, **{name: value})
        tokens = llm.generate(prompt, penalized, use_tqdm=False)[0].outputs[0].token_ids
        assert tokens != plain, name


def test_chat(llm):
    """chat.py: one conversation, a batch of them, and a chat template of one's own."""
    conversation = [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hello! How can I assist you today?"},
        {"role": "user", "content": "Write an essay about the importance of higher education."},
    ]
    sampling_params = SamplingParams(temperature=0, max_tokens=6)
    outputs = llm.chat(conversation, sampling_params, use_tqdm=False)
    assert len(outputs) == 1
    tokenizer = llm.get_tokenizer()
    rendered = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert outputs[0].prompt == rendered
    outputs = llm.chat([conversation for _ in range(3)], sampling_params, use_tqdm=True)
    assert len(outputs) == 3 and len({o.outputs[0].text for o in outputs}) == 1
    template = "{% for m in messages %}<<{{ m['role'] }}>>{{ m['content'] }}\n{% endfor %}<<assistant>>"
    custom = llm.chat(conversation, sampling_params, use_tqdm=False, chat_template=template)[0]
    assert custom.prompt.startswith("<<system>>You are a helpful assistant\n") and custom.prompt.endswith(
        "<<assistant>>"
    )


def test_the_projects_older_names_still_work(llm):
    """scripts/bench_peer.py and the stages' callers: `generate(prompts, params, progress=False)`."""
    params = SamplingParams(temperature=0, max_tokens=3)
    old = llm.generate([[5, 6, 7]], params, progress=False)[0]
    new = llm.generate([[5, 6, 7]], sampling_params=params, use_tqdm=False)[0]
    assert old.token_ids == new.token_ids and old.prompt_ids == [5, 6, 7]
    assert llm.generate([[5, 6, 7]], params=params, progress=False)[0].token_ids == new.token_ids


def test_a_bad_prompt_in_a_list_queues_nothing(llm):
    from final.core.errors import UserError

    with pytest.raises(UserError, match="unsupported prompt key"):
        llm.generate(["fine", {"prompt": "x", "multi_modal_data": {}}], SamplingParams(max_tokens=2))
    with pytest.raises(UserError, match="token ids"):
        llm.generate([[1, 2], [3, "4"]], SamplingParams(max_tokens=2))
    assert not llm.has_unfinished() and not llm.core.scheduler.has_work()
    assert len(llm.generate(["fine"], SamplingParams(max_tokens=2), use_tqdm=False)) == 1
