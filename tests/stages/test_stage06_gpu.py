"""Stage 06 on a CUDA GPU: overlap on against overlap off with real streams, events, pinned copies
and CUDA graphs, and a check that the launch path never waits for the GPU.

- Overlap on == off with FlashInfer, the torch backend and the hybrid, graphs on, over radix hits,
  chunked prompts, preemption, stop tokens and aborts at fixed steps; the pool is checked after
  every step and back to its baseline at the end. The two loops batch requests differently (a
  request that finished at step N still runs in step N+1), and bf16 rounds differently in
  different batches, so the comparison is tests/fixtures/gpu_compare.py's: full-vocabulary
  log-probabilities allclose step by step, tokens equal until a near-tie.
- The launch path: with a long kernel queued on the GPU first, one overlapped `step()` (schedule,
  prepare, plan, replay or eager forward, sampling with temperature and logprobs, the copies back)
  returns while that kernel still runs; the same call without overlap waits for it.
"""

from __future__ import annotations

import pytest
import torch

from stages.common.sampling import SamplingParams
from tests.fixtures.gpu_compare import assert_agree_until_near_tie, free_gpu_memory
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts
from tests.stage_list import load

pytestmark = pytest.mark.gpu

stage06 = load("stages.06_overlap")


@pytest.fixture(scope="module")
def gpu_model_dir(tmp_path_factory):
    # FlashInfer's kernels are compiled for head_dim 64, 128 and 256: use 128 (Qwen3's).
    return make_tiny_checkpoint(tmp_path_factory.mktemp("stage06_gpu_qwen3"), "qwen3", head_dim=128)


def engine(model_dir, attn: str, overlap: bool, **kwargs):
    return stage06.LLM(str(model_dir), device="cuda", dtype="bfloat16", attn=attn, disable_overlap=not overlap,
                       **{"page_size": 16, "num_pages": 40, "max_prefill_length": 40, "cuda_graph_max_bs": 16,
                          **kwargs})  # fmt: skip


def workload(model_dir, vocab: int):
    """Stage 05's GPU schedule (20 prompts: one every third step, then a burst sharing a 48-token
    head, so graphs of every size replay, prompts are chunked and the pool runs dry), with stop
    tokens on every fourth request and two aborts."""
    base = sample_prompts(model_dir, n=16, seed=21)
    prompts = base + [base[1][:48] + p[:5] for p in base[2:6]]
    arrivals = [3 * i for i in range(16)] + [50, 50, 51, 51]
    params = [
        SamplingParams(
            temperature=0,
            max_tokens=50,
            logprobs=vocab,
            stop_token_ids=[5, 9, 11] if i % 4 == 3 else [],
            ignore_eos=i % 4 != 3,
        )
        for i in range(len(prompts))
    ]
    aborts = {4: 20, 17: 58}
    return prompts, arrivals, params, aborts


def drive(llm, prompts, params, arrivals, aborts):
    rids, outputs, step = {}, {}, 0
    while len(outputs) < len(prompts) or llm.has_unfinished():
        for i, at in enumerate(arrivals):
            if at == step:
                rids[i] = llm.add_request(prompts[i], params[i])
        for i, at in aborts.items():
            if at == step and i in rids and i not in outputs:
                assert llm.abort(rids[i])
                outputs[i] = None
        by_rid = {rid: i for i, rid in rids.items()}
        for rid, out in llm.step():
            assert by_rid[rid] not in outputs
            outputs[by_rid[rid]] = out
        llm.scheduler.check_integrity()
        step += 1
        assert step < 5000
    return [outputs[i] for i in range(len(prompts))]


def assert_pool_at_baseline(llm) -> None:
    sched = llm.scheduler
    assert llm.in_flight is None and not sched.retiring and not sched.retired_pages
    cache = sched.cache
    assert cache.evictable_pages == len(cache.all_pages())
    assert sched.allocator.num_free + len(cache.all_pages()) == sched.allocator.num_pages


@pytest.mark.parametrize("attn", ["fi", "torch", "torch,fi"])
def test_overlap_on_equals_off(gpu_model_dir, attn):
    outs, vocab = {}, 0
    for overlap in (False, True):
        llm = engine(gpu_model_dir, attn, overlap)
        assert llm.runner.graphs is not None, "graphs should be captured"
        vocab = llm.config.vocab_size
        prompts, arrivals, params, aborts = workload(gpu_model_dir, vocab)
        replays = [0]
        for g in llm.runner.graphs.graphs.values():
            original = g.replay

            def replay(original=original, replays=replays):
                replays[0] += 1
                original()

            g.replay = replay
        outs[overlap] = drive(llm, prompts, params, arrivals, aborts)
        assert replays[0] > 20, "decode steps should replay graphs"
        assert llm.scheduler.num_preemptions > 0, "the pool is meant to run dry"
        assert max(o.cached_tokens for o in outs[overlap] if o) >= 48, "the shared head should hit the cache"
        assert_pool_at_baseline(llm)
        del llm
        free_gpu_memory()
    kept = [i for i, o in enumerate(outs[False]) if o is not None]
    assert [i for i, o in enumerate(outs[True]) if o is not None] == kept
    compared = assert_agree_until_near_tie([outs[True][i] for i in kept], [outs[False][i] for i in kept], vocab,
                                           atol=0.05)  # fmt: skip
    assert compared >= 4 * len(kept)


def cycles_per_ms() -> float:
    """How many `torch.cuda._sleep` cycles the GPU spins per millisecond (measured)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    return 10_000_000 / start.elapsed_time(end)


@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_an_overlapped_step_does_not_wait_for_the_gpu(gpu_model_dir, kind):
    """A long kernel is queued behind the step in flight; then one `step()` runs. With overlap it
    schedules and launches the next step (queued behind the kernel) and processes the step in
    flight, which came before the kernel: nothing it does needs the kernel to finish. A `decode`
    step replays a graph; a `mixed` one (a new prompt joins) runs eagerly with FlashInfer's plan."""
    prompts = sample_prompts(gpu_model_dir, n=6, seed=3)
    sampled = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=1, max_tokens=40, ignore_eos=True,
                             logprobs=5)  # fmt: skip
    spin = int(cycles_per_ms() * 500)  # half a second of GPU time
    still_running = {}
    for overlap in (False, True):
        llm = engine(gpu_model_dir, "fi", overlap, num_pages=256)
        for p in prompts[:4]:
            llm.add_request(p, sampled)
        for _ in range(6):  # prefill, then decode steps (graphs, the sampler, the plan all warm)
            llm.step()
        if kind == "mixed":
            llm.add_request(prompts[5], sampled)
        torch.cuda._sleep(spin)
        blocker = torch.cuda.Event()
        blocker.record()
        llm.step()
        still_running[overlap] = not blocker.query()
        torch.cuda.synchronize()
        while llm.has_unfinished():
            llm.step()
        assert_pool_at_baseline(llm)
        del llm
        free_gpu_memory()
    assert still_running == {False: False, True: True}
