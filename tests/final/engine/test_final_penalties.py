"""Presence, frequency and repetition penalties (final/engine/penalties.py): the device tables
against a per-row reference on logits, generation against HF transformers with the same
penalties, and a penalty-free batch that runs nothing of it."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor

import final
from final.core.errors import UserError
from final.core.sampling_params import SamplingParams
from final.engine.penalties import Penalties
from final.engine.sampler import Sampler
from tests.fixtures.tiny_models import load_hf_model, sample_prompts


def reference(logits: torch.Tensor, prompt: list[int], answer: list[int], p: SamplingParams) -> torch.Tensor:
    """One row, written out token by token as vLLM and OpenAI define the penalties."""
    out = logits.clone()
    for token in set(prompt) | set(answer):  # repetition: the prompt's and the answer's tokens
        out[token] = (
            out[token] / p.repetition_penalty if out[token] > 0 else out[token] * p.repetition_penalty
        )
    for token, count in Counter(answer).items():  # presence and frequency: the answer's only
        out[token] -= p.frequency_penalty * count + p.presence_penalty
    return out


PARAMS = [
    SamplingParams(repetition_penalty=1.5),
    SamplingParams(presence_penalty=1.2),
    SamplingParams(frequency_penalty=0.7),
    SamplingParams(presence_penalty=-0.5, frequency_penalty=0.3, repetition_penalty=0.8),
    SamplingParams(),  # neutral, in a batch with penalized rows
]


def test_the_tables_match_a_per_row_reference_over_steps_and_a_readmission():
    vocab, rng = 50, random.Random(0)
    table = Penalties(num_rows=8, vocab_size=vocab, device=torch.device("cpu"))
    rows = [6, 2, 7, 0, 3]  # out of order; row 3 held a penalized request before the neutral one
    table.admit(3, SamplingParams(repetition_penalty=3.0, presence_penalty=2.0), [1, 2, 3], [4, 4])
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 12))] for _ in PARAMS]
    answers: list[list[int]] = [[] for _ in PARAMS]
    for row, p, prompt in zip(rows, PARAMS, prompts, strict=True):
        table.admit(row, p, prompt, [])
    index = torch.tensor(rows)
    for step in range(8):
        if step == 4:  # the first request comes back after a preemption, into another row
            rows[0] = 5
            index = torch.tensor(rows)
            table.admit(5, PARAMS[0], prompts[0], answers[0])
        logits = torch.randn(len(rows), vocab) * 3
        got = table.apply(logits, index, PARAMS)
        for i, p in enumerate(PARAMS):
            torch.testing.assert_close(got[i], reference(logits[i], prompts[i], answers[i], p))
        # Tokens that repeat: sampled among a few, so counts grow past one.
        tokens = torch.tensor([rng.choice(prompts[i][:2] + [rng.randrange(vocab)]) for i in range(len(rows))])
        table.record(index, tokens)
        for i, token in enumerate(tokens.tolist()):
            answers[i].append(token)
    assert any(len(set(a)) < len(a) for a in answers), "some token should repeat (counts past one)"


def test_logits_are_left_as_they_are():
    """apply returns a new tensor: the logprobs read the model's own logits after it."""
    table = Penalties(2, 10, torch.device("cpu"))
    table.admit(0, SamplingParams(repetition_penalty=2.0, presence_penalty=1.0), [1, 2], [3])
    logits = torch.randn(1, 10)
    before = logits.clone()
    table.apply(logits, torch.tensor([0]), [SamplingParams(repetition_penalty=2.0, presence_penalty=1.0)])
    assert torch.equal(logits, before)


def aten_ops(fn) -> list[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::")]


def test_a_penalty_free_batch_runs_no_penalty_work():
    """The sampler decides on the host: a neutral batch runs exactly the ops it runs in a sampler
    that never saw a penalty, even after a penalized request used a row of this one."""
    neutral = [SamplingParams(temperature=0), SamplingParams(temperature=0.7, top_k=5)]
    logits, rows = torch.randn(2, 20), torch.tensor([0, 1])

    def sampler(penalized_before: bool) -> Sampler:
        s = Sampler(4, torch.device("cpu"), vocab_size=20)
        for row, p in enumerate(neutral):
            s.admit(row, p)
        if penalized_before:  # the tables exist now
            s.penalties.admit(2, SamplingParams(presence_penalty=1.0), [1, 2], [])
        return s

    fresh, used = sampler(False), sampler(True)
    baseline = aten_ops(lambda: fresh.sample(logits, rows, neutral, [None, None]))
    assert aten_ops(lambda: used.sample(logits, rows, neutral, [None, None])) == baseline
    penalized = [SamplingParams(temperature=0, presence_penalty=1.0)] + neutral[1:]
    with_penalty = aten_ops(lambda: used.sample(logits, rows, penalized, [None, None]))
    assert "aten::index_select" in with_penalty and len(with_penalty) > len(baseline)


@torch.inference_mode()
def hf_penalized_greedy(model_dir, prompt: list[int], p: SamplingParams, steps: int) -> list[int]:
    """HF transformers' logits, HF's own repetition-penalty processor, then presence and frequency
    as OpenAI defines them; greedy, EOS ignored."""
    model = load_hf_model(model_dir)
    repetition = RepetitionPenaltyLogitsProcessor(p.repetition_penalty)
    ids = list(prompt)
    for _ in range(steps):
        logits = model(input_ids=torch.tensor([ids])).logits[:, -1].float()
        logits = repetition(torch.tensor([ids]), logits)[0]
        for token, count in Counter(ids[len(prompt) :]).items():
            logits[token] -= p.frequency_penalty * count + p.presence_penalty
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def greedy(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, **kwargs)


BATCH = [
    greedy(repetition_penalty=1.8),
    greedy(presence_penalty=1.5, frequency_penalty=0.8),
    greedy(presence_penalty=0.5, frequency_penalty=1.0, repetition_penalty=1.3),
    greedy(),
]


@pytest.mark.parametrize(
    "engine",
    [{}, {"overlap": "on"}, {"num_pages": 100, "max_prefill_length": 16}],
    ids=["serial", "overlap", "preempted-and-chunked"],
)
def test_penalized_generation_matches_hf_with_the_same_penalties(tiny_qwen3_dir, engine):
    """A batch mixing every penalty and none: each request gets HF's greedy tokens under its own
    penalties, with the overlapped loop, and with prompts cut in chunks and requests preempted
    (their counts rebuilt when they come back)."""
    prompts = sample_prompts(tiny_qwen3_dir, n=len(BATCH), seed=11)
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32", **engine)
    outs = llm.generate(prompts, BATCH, use_tqdm=False)
    for prompt, p, out in zip(prompts, BATCH, outs, strict=True):
        assert out.outputs[0].token_ids == hf_penalized_greedy(tiny_qwen3_dir, prompt, p, 24)
    plain = llm.generate(prompts[:3], greedy(), use_tqdm=False)
    assert all(a.token_ids != b.token_ids for a, b in zip(plain, outs[:3], strict=True)), "no effect"
    if "num_pages" in engine:
        assert llm.core.scheduler.num_preemptions > 0, "the pool was meant to run dry"


@pytest.mark.parametrize(
    ("field", "value"),
    [("presence_penalty", 2.5), ("frequency_penalty", -2.1), ("repetition_penalty", 0.0), ("n", 0)],
)
def test_out_of_range_values_are_refused(field, value):
    with pytest.raises(UserError, match=field):
        SamplingParams(**{field: value})


def test_logprobs_are_the_models_own_before_the_penalties(tiny_qwen3_dir):
    """As vLLM's default (raw) logprobs: the first step's candidates are the same with and without
    a repetition penalty, though the penalty changes which token is picked."""
    prompt = sample_prompts(tiny_qwen3_dir, n=3, seed=11)[2]
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    plain, penalized = llm.generate(
        [prompt, prompt], [greedy(logprobs=5), greedy(logprobs=5, repetition_penalty=1e-3)], use_tqdm=False
    )
    assert plain.logprobs[0]["top_logprobs"] == penalized.logprobs[0]["top_logprobs"]
    assert plain.token_ids[0] != penalized.token_ids[0]  # a prompt token, made far likelier


# ---------------------------------------------------------------------------------------------
# On a GPU (scripts/run_gpu_tests.sh)


@pytest.mark.gpu
def test_the_device_tables_match_the_cpu_ones_on_a_gpu():
    vocab, rng = 151936, random.Random(1)
    tables = {d: Penalties(6, vocab, torch.device(d)) for d in ("cpu", "cuda")}
    rows = [4, 1, 5]
    prompts = [[rng.randrange(vocab) for _ in range(40)] for _ in rows]
    for table in tables.values():
        for row, p, prompt in zip(rows, PARAMS[:3], prompts, strict=True):
            table.admit(row, p, prompt, prompt[:5])
    for _ in range(4):
        logits = torch.randn(len(rows), vocab, dtype=torch.bfloat16) * 4
        tokens = torch.tensor([rng.choice(prompts[i]) for i in range(len(rows))])
        got = {d: t.apply(logits.to(d), torch.tensor(rows, device=d, dtype=torch.int32), PARAMS[:3]).cpu()
               for d, t in tables.items()}  # fmt: skip
        torch.testing.assert_close(got["cuda"], got["cpu"])
        for d, table in tables.items():
            table.record(torch.tensor(rows, device=d, dtype=torch.int32), tokens.to(d))


@pytest.mark.gpu
def test_a_penalty_free_batch_launches_no_penalty_kernel_on_a_gpu():
    """The CUDA kernels of a neutral batch's draw, with and without a penalized request admitted
    before: the same list (the penalties run nothing when the batch has none)."""

    def kernels(sampler: Sampler, logits, rows, params) -> list[str]:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            sampler.sample(logits, rows, params, [None] * len(params))
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]

    neutral = [SamplingParams(temperature=0.7, top_p=0.9)] * 8
    logits = torch.randn(8, 151936, device="cuda", dtype=torch.bfloat16)
    rows = torch.arange(8, device="cuda", dtype=torch.int32)
    fresh, used = (Sampler(16, torch.device("cuda"), 151936) for _ in range(2))
    for s in (fresh, used):
        for row, p in enumerate(neutral):
            s.admit(row, p)
    used.penalties.admit(12, SamplingParams(presence_penalty=1.0), [1, 2, 3], [])
    kernels(fresh, logits, rows, neutral)  # warm-up: FlashInfer's first call compiles
    assert kernels(used, logits, rows, neutral) == kernels(fresh, logits, rows, neutral)


@pytest.mark.gpu
def test_penalties_with_graphs_and_overlap_equal_eager_and_serial_on_a_gpu(tmp_path):
    """The penalties apply after a graph's replay and in stream order under overlap: a graphed,
    overlapped engine gives the eager, serial one's tokens (bf16 on FlashInfer)."""
    from tests.fixtures.tiny_models import make_tiny_checkpoint

    model_dir = make_tiny_checkpoint(tmp_path / "m", "qwen3", head_dim=128)
    prompts = sample_prompts(model_dir, n=len(BATCH), seed=3)
    outs = []
    for kwargs in ({"cuda_graph_max_bs": 0, "overlap": "off"}, {"overlap": "on"}):
        llm = final.LLM(str(model_dir), device="cuda", dtype="bfloat16", attn="fi", page_size=16, num_pages=1024,
                        **kwargs)  # fmt: skip
        outs.append([o.token_ids for o in llm.generate(prompts, BATCH, use_tqdm=False)])
        llm.close()
    assert outs[0] == outs[1]
