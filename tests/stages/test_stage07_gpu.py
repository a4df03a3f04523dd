"""Stage 07 on GPUs (NCCL), with CUDA graphs and overlap scheduling on: TP=2, and TP=4 where 4 GPUs
exist, against TP=1 in bfloat16.

bf16 sums in another order under TP (each rank's partial matmul, then the all-reduce), so the
comparison is tests/fixtures/gpu_compare.py's: every step's distribution allclose while the tokens
agree, tokens parting only at a near-tie of the reference. Decode steps must replay their graphs
(the all-reduces inside). And a rank killed while decode steps replay ends the engine, a process
of its own here (rank 0 may have to leave the process to get out of NCCL), with the rank's name
and within a bound, leaving no rank behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from stages.common.sampling import SamplingParams
from tests.fixtures.gpu_compare import assert_agree_until_near_tie, free_gpu_memory
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts
from tests.fixtures.tp import QWEN3_06B_VOCAB, alive, assert_tp_matches_tp1_on_qwen3_06b_shape, tp_degrees
from tests.stage_list import ROOT, load
from tests.stages.test_stage07_tp import rank_of, workers_below

pytestmark = pytest.mark.multi_gpu

stage07 = load("stages.07_tensor_parallel")
ranks_module = load("stages.07_tensor_parallel.ranks")

PAGE_SIZE, POOL_TOKENS = 16, 65536


@pytest.fixture(scope="module")
def gpu_tiny_dir(tmp_path_factory):
    # FlashInfer's kernels are compiled for head_dim 64, 128 and 256: 128 (Qwen3's). 8 heads and 4
    # KV heads: TP=4 splits both.
    return make_tiny_checkpoint(tmp_path_factory.mktemp("s07_gpu_qwen3"), "qwen3", head_dim=128,
                                num_attention_heads=8, num_key_value_heads=4)  # fmt: skip


def count_replays(graphs: dict) -> list[int]:
    """Count the replays of every graph in `graphs` (the count is element 0). A helper of its own so
    that no local name of the caller keeps a graph alive once the engine drops its graphs: NCCL's
    communicator cannot be destroyed while a graph holding its work lives, and the engine's close
    hung in destroy_process_group (2 H100s, 2026-11-27) while a loop variable held the last one."""
    replays = [0]
    for graph in graphs.values():

        def replay(original=graph.replay) -> None:
            replays[0] += 1
            original()

        graph.replay = replay
    return replays


def run(model_dir, tp: int, prompts, params, attn: str = "fi", arrivals: list[int] | None = None,
        max_prefill_length: int = 8192):  # fmt: skip
    """Serve the prompts (prompt i added before step arrivals[i]) with graphs and overlap on."""
    llm = stage07.LLM(str(model_dir), device="cuda", dtype="bfloat16", attn=attn, tp=tp, page_size=PAGE_SIZE,
                      num_pages=POOL_TOKENS // PAGE_SIZE, max_running_requests=16, cuda_graph_max_bs=16,
                      max_prefill_length=max_prefill_length)  # fmt: skip
    try:
        assert llm.overlap and llm.runner.graphs is not None, "graphs and overlap must be on"
        replays = count_replays(llm.runner.graphs.graphs)
        arrivals = arrivals or [0] * len(prompts)
        rids, outs, step = {}, {}, 0
        while len(outs) < len(prompts):
            for i, at in enumerate(arrivals):
                if at == step:
                    rids[llm.add_request(prompts[i], params)] = i
            for rid, out in llm.step():
                outs[rids[rid]] = out
            step += 1
        llm.scheduler.check_integrity()
        assert replays[0] > 10, "decode steps should replay their graphs"
        return [outs[i] for i in range(len(prompts))]
    finally:
        llm.close()
        del llm
        free_gpu_memory()


@pytest.mark.parametrize("size", tp_degrees())
@pytest.mark.parametrize("attn", ["torch", "fi"])  # torch first: it needs no kernel compiled
def test_tp_matches_tp1_on_a_tiny_model(gpu_tiny_dir, size, attn):
    """Staggered arrivals (graphs of several sizes), a 60-token prompt chunked under a budget of 32,
    and a shared 48-token head (a radix hit)."""
    base = sample_prompts(gpu_tiny_dir, n=8, seed=21)
    prompts = base + [base[1][:48] + p[:5] for p in base[2:5]]
    arrivals = [2 * i for i in range(8)] + [30, 30, 31]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=512)
    want = run(gpu_tiny_dir, 1, prompts, params, attn, arrivals, max_prefill_length=32)
    got = run(gpu_tiny_dir, size, prompts, params, attn, arrivals, max_prefill_length=32)
    assert max(o.cached_tokens for o in got) >= 48, "the shared head should hit the prefix cache"
    compared = assert_agree_until_near_tie(got, want, 512, atol=0.1)
    assert compared >= 4 * len(prompts), "the runs parted too early to show anything"


@pytest.mark.parametrize("size", tp_degrees())
def test_tp_matches_tp1_on_qwen3_06b_shape(qwen3_06b_dir, size):
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=QWEN3_06B_VOCAB)
    assert_tp_matches_tp1_on_qwen3_06b_shape(run, qwen3_06b_dir, size, params)


# The torch backend: the all-reduces in the replayed graphs are what this test is about, and it
# needs no FlashInfer kernel compiled on a fresh two-GPU host.
DRIVER = """
import importlib, sys
from stages.common.sampling import SamplingParams
stage07 = importlib.import_module("stages.07_tensor_parallel")
ranks = importlib.import_module("stages.07_tensor_parallel.ranks")
llm = stage07.LLM(sys.argv[1], device="cuda", dtype="bfloat16", attn="torch", tp=int(sys.argv[2]), page_size=16,
                  num_pages=4096, max_running_requests=16, cuda_graph_max_bs=16)
llm.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=3000, ignore_eos=True))
for _ in range(4):
    llm.step()
print("decoding", flush=True)
try:
    while llm.has_unfinished():
        llm.step()
except ranks.RankFailure as err:
    print("error:", err, file=sys.stderr, flush=True)
    sys.exit(ranks.FAILED_EXIT_CODE)
"""


def python_path() -> str:
    """The tree first, then whatever the host had: a lent GPU host's packages (FlashInfer among
    them) live on PYTHONPATH, and the driver without them could not start its engine."""
    return os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))


@pytest.mark.parametrize("size", tp_degrees())
def test_killed_rank_ends_the_engine_during_graph_replay(gpu_tiny_dir, size):
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(gpu_tiny_dir), str(size)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": python_path()},
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "decoding", proc.stderr.read()  # type: ignore[union-attr]
        workers = workers_below(proc.pid)
        assert sorted(rank_of(p) for p in workers) == list(range(1, size))
        victim = max(workers, key=rank_of)  # the last rank
        os.kill(victim, signal.SIGKILL)
        started = time.monotonic()
        _, stderr = proc.communicate(timeout=ranks_module.GRACE_S + 20)
        assert time.monotonic() - started < ranks_module.GRACE_S + 20
    finally:
        if proc.poll() is None:
            proc.kill()
    # The step raised RankFailure, or rank 0 stayed stuck in NCCL and its process left: either way
    # with the rank's name and the failed status.
    assert proc.returncode == ranks_module.FAILED_EXIT_CODE, stderr
    assert f"tensor-parallel rank {size - 1} (pid {victim}) was killed by SIGKILL" in stderr
    deadline = time.monotonic() + 20
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling other processes' exits
    assert not [p for p in workers if alive(p)]
