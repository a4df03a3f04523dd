"""Stage 03 on a GPU with FlashInfer: the radix cache gives the outputs of the naive cache.

bf16 batches of different shapes round differently: the runs are compared step by step, full
distributions with a loose tolerance, until they part at a near-tie (tests/fixtures/gpu_compare.py). The
tiny checkpoints get head_dim 128 here: FlashInfer's kernels are built for the head sizes real
models use.
"""

from __future__ import annotations

import pytest

from stages.common.sampling import SamplingParams
from tests.fixtures.driving import serve_at_steps
from tests.fixtures.gpu_compare import assert_agree_until_near_tie
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts
from tests.stage_list import load

pytestmark = pytest.mark.gpu

stage03 = load("stages.03_radix_cache")

STEPS = 6  # tokens generated per request
ATOL = 0.1  # on log-probabilities, bf16
POOL_TOKENS = 16384


@pytest.fixture(scope="module", params=["qwen3", "llama"])
def gpu_model_dir(request, tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp(f"gpu_{request.param}"), request.param, head_dim=128)


def sharing_prompts(model_dir) -> list[list[int]]:
    base = sample_prompts(model_dir, n=8, seed=31)
    system = (base[1] * 2)[:48]
    prompts = [system + p[:12] for p in base[2:7]]
    return prompts + [prompts[0], prompts[3], system, base[0], base[7]]


def greedy_logprobs(vocab: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=vocab)


def assert_close_outputs(ours, reference, vocab: int) -> None:
    compared = assert_agree_until_near_tie(ours, reference, vocab, ATOL)
    assert compared >= 2 * len(reference)  # at least the prefill step and one decode step each


def record_evictions(llm) -> list[int]:
    """Wrap the cache's evict to collect the pages it drops."""
    evicted: list[int] = []
    evict = llm.scheduler.cache.evict

    def recording(num_pages: int) -> list[int]:
        freed = evict(num_pages)
        evicted.extend(freed)
        return freed

    llm.scheduler.cache.evict = recording
    return evicted


def make(model_dir, **kwargs):
    # An explicit pool: sized by --memory-ratio, the first engine of the process would take the
    # memory the next ones need (the engines of earlier tests are not freed at once).
    kwargs.setdefault("num_pages", POOL_TOKENS // kwargs.get("page_size", 1))
    return stage03.LLM(str(model_dir), device="cuda", dtype="bfloat16", **kwargs)


@pytest.mark.parametrize("page_size", [1, 16])
def test_radix_matches_naive_with_flashinfer(gpu_model_dir, page_size):
    prompts = sharing_prompts(gpu_model_dir)
    arrivals = [0, 0, 1, 1, 2, 4, 4, 6, 9, 9]
    outs = {}
    for cache in ("naive", "radix"):
        llm = make(gpu_model_dir, attn="fi", page_size=page_size, cache=cache)
        vocab = llm.config.vocab_size
        outs[cache] = serve_at_steps(llm, prompts, greedy_logprobs(vocab), arrivals,
                                     llm.scheduler.check_integrity, max_steps=5000)  # fmt: skip
    assert sum(o.cached_tokens for o in outs["radix"]) >= 5 * 32, "the prompts were meant to share"
    assert_close_outputs(outs["radix"], outs["naive"], vocab)


@pytest.mark.parametrize("page_size", [1, 16])
def test_flashinfer_prefill_over_a_cached_prefix_matches_torch(gpu_model_dir, page_size):
    """A radix hit makes FlashInfer prefill queries that start after the cached keys; the torch
    backend is the reference for that causal alignment."""
    prompts = sharing_prompts(gpu_model_dir)
    outs = {}
    for attn in ("torch", "fi"):
        llm = make(gpu_model_dir, attn=attn, page_size=page_size)
        vocab = llm.config.vocab_size
        params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=vocab)
        llm.generate(prompts[:1], params)  # the system prompt and a question are cached now
        outs[attn] = llm.generate(prompts[1:], params)
        assert all(o.cached_tokens >= 32 for o in outs[attn][:-2])
    assert_close_outputs(outs["fi"], outs["torch"], vocab)


@pytest.mark.parametrize("page_size", [1, 16])
def test_full_prefix_hit_with_flashinfer(gpu_model_dir, page_size):
    prompt = sample_prompts(gpu_model_dir, n=2, seed=32)[1]
    llm = make(gpu_model_dir, attn="fi", page_size=page_size)
    vocab = llm.config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=vocab)
    first = llm.generate([prompt], params)[0]
    second = llm.generate([prompt], params)[0]
    assert first.cached_tokens == 0
    assert second.cached_tokens == (len(prompt) - 1) // page_size * page_size
    assert_close_outputs([second], [first], vocab)


@pytest.mark.parametrize("page_size", [1, 16])
def test_eviction_pressure_with_flashinfer(gpu_model_dir, page_size):
    prompts = sharing_prompts(gpu_model_dir) * 2
    longest = max(len(p) for p in prompts) + STEPS
    arrivals = [i // 3 for i in range(len(prompts))]
    outs = {}
    for cache in ("naive", "radix"):
        llm = make(gpu_model_dir, attn="fi", page_size=page_size, cache=cache,
                   num_pages=-(-2 * longest // page_size) + 4)  # fmt: skip
        vocab = llm.config.vocab_size
        evicted = record_evictions(llm)
        outs[cache] = serve_at_steps(llm, prompts, greedy_logprobs(vocab), arrivals,
                                     llm.scheduler.check_integrity, max_steps=5000)  # fmt: skip
        if cache == "radix":
            assert evicted, "the pool was meant to run dry and evict"
    assert_close_outputs(outs["radix"], outs["naive"], vocab)
