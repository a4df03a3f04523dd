"""final/'s extension points take a new part as one class and one registration line, and nothing
else changes: the CLI lists it, the engine builds it, and the rest of the engine runs around it.
docs/serving/extending.md walks through the same steps with the shipped parts' file names.

- a scheduling policy (scheduler/policy.py's POLICIES), shown with a toy that halves the
  prefill budget;
- an attention backend (attention/registry.py's BACKENDS, one descriptor), shown with a toy on
  the CPU that counts its calls around the torch backend's arithmetic;
- a model architecture (models/registry.py's ARCHITECTURES);
- a step that gives each request up to k tokens (engine/core.py's collect), for an executor that
  speculates.
"""

from __future__ import annotations

import pytest
import torch

import final
from final.args import build_parser, parse_args
from final.attention.registry import BACKENDS
from final.attention.spec import BackendSpec
from final.attention.torch_backend import TorchBackend
from final.core.errors import UserError
from final.core.sampling_params import SamplingParams
from final.engine.handle import StepHandle
from final.models.registry import ARCHITECTURES, LLAMA, model_class
from final.scheduler.policy import POLICIES, SchedulingPolicy
from tests.fixtures.tiny_models import sample_prompts

GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def run(llm: final.LLM, prompts: list[list[int]]) -> list[list[int]]:
    outs = llm.generate(prompts, GREEDY, progress=False)
    llm.core.check_integrity()
    return [o.token_ids for o in outs]


# ---------------------------------------------------------------------------------------------
# A scheduling policy


class HalfBudgetPolicy(SchedulingPolicy):
    """Mixed, with half the prefill budget: prompts take twice the steps to prefill."""

    name = "half-budget"

    def select(self, scheduler, can_preempt):
        decodes = scheduler.decodes(can_preempt)
        return decodes, scheduler.prefill_chunks(max(1, scheduler.max_prefill_length // 2))


def test_a_toy_policy_is_one_class_and_one_registration_line(tiny_qwen3_dir, monkeypatch):
    monkeypatch.setitem(POLICIES, HalfBudgetPolicy.name, HalfBudgetPolicy)  # the registration line
    assert "--chunk-policy {mixed,prefill-first,half-budget}" in " ".join(
        build_parser().format_help().split()
    )
    assert parse_args(["--chunk-policy", "half-budget"]).engine.chunk_policy == "half-budget"
    prompts = sample_prompts(tiny_qwen3_dir, n=3, seed=4)
    budget = max(len(p) for p in prompts)  # the longest prompt fits one step of mixed, not of the toy
    steps, tokens = {}, {}
    for policy in ("mixed", "half-budget"):
        llm = final.LLM(str(tiny_qwen3_dir), device="cpu", chunk_policy=policy, max_prefill_length=budget)
        tokens[policy] = run(llm, prompts)
        steps[policy] = llm.core.snapshot().num_steps
        assert isinstance(llm.core.scheduler.policy, HalfBudgetPolicy) == (policy == "half-budget")
    assert tokens["half-budget"] == tokens["mixed"], "a policy changes when tokens run, not which"
    assert steps["half-budget"] > steps["mixed"], "the toy's budget was not the one scheduled"


# ---------------------------------------------------------------------------------------------
# An attention backend


class CountingBackend(TorchBackend):
    """The torch backend's arithmetic under another name, counting its steps and layers."""

    name = "counting"
    prepared = 0
    forwards = 0

    def prepare(self, batch):
        CountingBackend.prepared += 1
        super().prepare(batch)

    def forward(self, layer, q, k, v, batch, out=None):
        CountingBackend.forwards += 1
        return super().forward(layer, q, k, v, batch, out)


COUNTING = BackendSpec("counting", "a test's backend: torch's arithmetic, counted", CountingBackend)


def test_a_toy_backend_is_one_class_and_one_descriptor(tiny_qwen3_dir, monkeypatch):
    monkeypatch.setitem(BACKENDS, COUNTING.name, COUNTING)  # the registration line
    monkeypatch.setattr(CountingBackend, "prepared", 0)
    monkeypatch.setattr(CountingBackend, "forwards", 0)
    assert "counting (a test's backend: torch's arithmetic, counted)" in " ".join(
        build_parser().format_help().split()
    )
    prompts = sample_prompts(tiny_qwen3_dir, n=3, seed=6)
    want = run(final.LLM(str(tiny_qwen3_dir), device="cpu", attn="torch"), prompts)
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", attn="counting")
    assert llm.core.info().attn == "counting"
    assert run(llm, prompts) == want
    layers = llm.config.num_layers
    assert CountingBackend.prepared > 0 and CountingBackend.forwards == CountingBackend.prepared * layers
    # As one phase of a hybrid, too; and `auto`, which the descriptor does not enter, never picks it.
    hybrid = final.LLM(str(tiny_qwen3_dir), device="cpu", attn="counting,torch")
    assert hybrid.core.info().attn == "counting,torch" and run(hybrid, prompts) == want
    assert final.LLM(str(tiny_qwen3_dir), device="cpu", attn="auto").core.info().attn == "torch"


def test_an_unknown_backend_names_the_registered_ones(tiny_qwen3_dir, monkeypatch):
    monkeypatch.setitem(BACKENDS, COUNTING.name, COUNTING)
    with pytest.raises(UserError, match="choose from torch, fi, fa, trtllm, counting or auto"):
        final.LLM(str(tiny_qwen3_dir), device="cpu", attn="flash")


# ---------------------------------------------------------------------------------------------
# A model architecture


def test_an_architecture_is_one_registry_entry(tiny_qwen3_dir, monkeypatch):
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu")
    config = llm.config
    assert model_class(config) is type(llm.core.executor.runner.model)
    monkeypatch.delitem(ARCHITECTURES, config.architecture)
    with pytest.raises(UserError, match=f"unsupported architecture .*{config.architecture}"):
        final.LLM(str(tiny_qwen3_dir), device="cpu")
    monkeypatch.setitem(ARCHITECTURES, config.architecture, LLAMA)  # the registration line
    assert run(final.LLM(str(tiny_qwen3_dir), device="cpu"), [[1, 2, 3]]) == run(llm, [[1, 2, 3]])


# ---------------------------------------------------------------------------------------------
# A step that gives up to k tokens per request (the seam speculative decoding lands on)


def test_collect_takes_up_to_k_tokens_per_request_and_stops_at_a_finish(tiny_qwen3_dir):
    """An executor that speculates hands `collect` k tokens per request (`tokens_per_step`): the
    bookkeeping appends them up to the first that finishes the request and drops the rest."""
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu")
    core = llm.core
    a = llm.add_request([1, 2, 3], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[99]))
    b = llm.add_request([4, 5, 6], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    llm.step()  # the prefill: one token each
    reqs = sorted(core.scheduler.running, key=lambda r: r.rid)
    before = {r.rid: list(r.output_ids) for r in reqs}
    k = 3
    for r in reqs:
        r.num_pending += k  # what launch counts for a step of k tokens per request
    tokens = torch.tensor([[7, 99, 8], [9, 10, 11]])
    handle = StepHandle(batch=None, sampled=reqs, tokens=tokens, done=None, logprobs=None, pending=k)
    deltas = {d.rid: d for d in core.collect(handle)}
    assert (deltas[a].token_ids, deltas[a].finish_reason) == ([7, 99], "stop")
    assert (deltas[b].token_ids, deltas[b].finish_reason) == ([9, 10, 11], None)
    assert reqs[1].output_ids == before[b] + [9, 10, 11] and reqs[1].num_pending == 0
    assert [r.rid for r in core.scheduler.running] == [b]
    core.check_integrity()
