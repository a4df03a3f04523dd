"""Structured outputs (final/engine/structured.py): the answer follows a grammar. The mask against
a bit-by-bit reference; every token of constrained answers allowed by an independent matcher of
the same grammar, finished answers parsed; constrained and free requests in one batch, overlap on
and off; a grammar that cannot compile refused before anything is queued."""

from __future__ import annotations

import json
import re

import pytest
import torch

import final
from final import SamplingParams, StructuredOutputsParams
from final.core.errors import UserError
from final.engine import structured
from final.engine.structured import apply_bitmask

xgrammar = pytest.importorskip("xgrammar", reason="structured outputs need xgrammar (pip install xgrammar)")


def test_the_mask_keeps_exactly_the_allowed_bits():
    torch.manual_seed(0)
    vocab = 70  # not a multiple of 32: the last word is partly padding
    bitmask = torch.randint(-(2**31), 2**31 - 1, (3, 3), dtype=torch.int32)
    scores = torch.randn(3, vocab)
    got = apply_bitmask(scores, bitmask)
    for row in range(3):
        for token in range(vocab):
            allowed = (int(bitmask[row, token // 32]) >> (token % 32)) & 1
            assert (got[row, token] == float("-inf")) != bool(allowed)
            if allowed:
                assert got[row, token] == scores[row, token]


SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
SPECS = [
    StructuredOutputsParams(choice=["yes", "no", "maybe"]),
    StructuredOutputsParams(regex=r"[0-9]{3}-[a-z]{2}"),
    StructuredOutputsParams(json=SCHEMA),
    StructuredOutputsParams(json_object=True),
]


def oracle(tiny_dir, llm, spec: StructuredOutputsParams):
    """A matcher of the same grammar, compiled apart from the engine's."""
    return structured.StructuredOutputs(tiny_dir, llm.config.vocab_size, llm.config.eos_token_ids).matcher(
        spec
    )


def check(spec: StructuredOutputsParams, out) -> None:
    if out.finish_reason != "stop":
        return  # cut by max_tokens: the tokens are checked, the text is incomplete
    if spec.choice:
        assert out.text in spec.choice
    elif spec.regex:
        assert re.fullmatch(spec.regex, out.text)
    elif spec.json is not None:
        value = json.loads(out.text)
        assert set(value) == {"ok"} and isinstance(value["ok"], bool)
    else:
        assert isinstance(json.loads(out.text), dict)


@pytest.mark.parametrize("overlap", ["off", "on"])
def test_answers_follow_their_grammar_beside_free_requests(tiny_qwen3_dir, overlap):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", overlap=overlap)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13], [21, 22]]
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    alone = llm.generate([prompts[0]], free, use_tqdm=False)[0].token_ids
    params = [free] + [
        SamplingParams(temperature=t, seed=s, max_tokens=48, structured_outputs=spec)
        for spec in SPECS
        for t, s in [(0, None), (1.0, 3)]
    ]
    outs = llm.generate([prompts[i % 3] for i in range(len(params))], params, use_tqdm=False)
    assert outs[0].token_ids == alone, "a free request's answer must not see its neighbours' masks"
    finished = {}
    for p, out in zip(params[1:], outs[1:], strict=True):
        spec = p.structured_outputs
        matcher = oracle(tiny_qwen3_dir, llm, spec)
        assert all(matcher.accept(t) for t in out.token_ids), (spec.kind, out.text)
        check(spec, out)
        finished.setdefault(spec.kind, []).append(out.finish_reason == "stop")
    # A finite grammar ends the answer on its own (a random model's JSON may ramble to the cap).
    assert all(finished["choice"]) and all(finished["regex"]) and any(finished["json"])
    assert not llm.core.sampler.matchers, "finished requests leave no matcher behind"


def test_same_seed_same_constrained_answer_with_and_without_overlap(tiny_qwen3_dir):
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=32, structured_outputs=SPECS[2])
    answers = [
        final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", overlap=o)
        .generate([[3, 4, 5]], params, use_tqdm=False)[0]
        .token_ids
        for o in ("off", "on")
    ]
    assert answers[0] == answers[1]


def test_a_grammar_that_cannot_compile_queues_nothing(tiny_qwen3_dir):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    with pytest.raises(UserError, match="regex cannot be compiled"):
        llm.add_request([1, 2], SamplingParams(structured_outputs=StructuredOutputsParams(regex="(unclosed")))
    assert not llm.has_unfinished() and not llm.core.scheduler.has_work()
    with pytest.raises(UserError, match="exactly one of"):
        StructuredOutputsParams(json_object=True, regex="a")


def test_without_xgrammar_a_request_is_refused_with_what_to_install(tiny_qwen3_dir, monkeypatch):
    monkeypatch.setattr(structured, "available", lambda: False)
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    with pytest.raises(UserError, match="pip install xgrammar"):
        llm.add_request([1, 2], SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True)))
    from final.server.errors import APIError
    from final.server.protocol import ChatCompletionRequest, structured_outputs

    req = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}}
    )
    with pytest.raises(APIError) as refused:
        structured_outputs(req)
    assert refused.value.status == 400 and "pip install xgrammar" in str(refused.value.message)
