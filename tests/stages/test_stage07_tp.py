"""Stage 07 on the CPU: tensor parallelism with gloo, every rank a process of its own.

- the shards: every weight's slice at TP=2 and TP=4, the vocabulary padded when the degree does
  not divide it, KV heads replicated where their query heads are when there are fewer of them
  than ranks, and a loader that reads each rank's slices of the checkpoint and nothing more;
- the step message: a rank other than 0 rebuilds, from what rank 0 sends, the very tensors rank
  0's runner computes (pending tokens, chunks, radix hits), and its page table follows rank 0's;
- degrees and flags that cannot work are refused before any rank starts;
- TP=2 and TP=4 give TP=1's tokens and log-probabilities (greedy and seeded, a radix hit, a chunked
  prompt, overlap on and off), in processes the engine starts itself, and over two "nodes" of
  one process each on loopback, each started from the command line;
- a rank that is killed or hangs ends the engine with a message naming it, within a bound, and
  no rank survives.

Starting ranks is the slow part (each imports torch): the tests share engines where they can.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stages.common.errors import UserError
from stages.common.model_config import ModelConfig, load_model_config
from stages.common.sampling import SamplingParams
from tests.fixtures.driving import full_logprobs
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts
from tests.fixtures.tp import alive, counting_safe_open, free_port, processes_below
from tests.stage_list import ROOT, load

stage07 = load("stages.07_tensor_parallel")
distributed = load("stages.07_tensor_parallel.distributed")
model_module = load("stages.07_tensor_parallel.model")
page_table_module = load("stages.07_tensor_parallel.page_table")
ranks_module = load("stages.07_tensor_parallel.ranks")
TPInfo, StepMessage = distributed.TPInfo, distributed.StepMessage

BOUND_S = 20.0  # a lost rank must have ended the engine within this (after a hang: after its silence)
ODD_VOCAB = 509  # prime: padded at every degree
WORKER = b"07_tensor_parallel.worker"


@pytest.fixture(scope="module")
def odd_llama_dir(tmp_path_factory) -> Path:
    """Llama shape (tied embeddings, 4 heads, 2 KV heads) with a vocabulary no degree divides."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("s07_llama_509"), "llama", vocab_size=ODD_VOCAB)


OPEN: list = []  # the tensor-parallel engine whose rank 0 this process is


def engine(model_dir: Path, tp: int = 1, **kwargs):
    if tp > 1:  # rank 0 holds the process group of its process: one tensor-parallel engine at a time
        while OPEN:
            OPEN.pop().close()
    kwargs = {"max_prefill_length": 16, **kwargs}
    llm = stage07.LLM(str(model_dir), device="cpu", dtype="float32", tp=tp, **kwargs)
    if tp > 1:
        OPEN.append(llm)
    return llm


def workers_below(root: int) -> list[int]:
    """Pids of the stage's worker processes below `root` in the process tree."""
    return processes_below(root, WORKER)


def rank_of(pid: int) -> int:
    """A worker's rank, from its command line (`--rank R`)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return int(argv[argv.index("--rank") + 1])


# ---------------------------------------------------------------------------------------------
# The shards


def meta_model(config, tp):
    with torch.device("meta"):
        return model_module.CausalLM(config, tp)


@pytest.mark.parametrize("size", [2, 4])
def test_shards_partition_the_model_and_pad_the_vocabulary(tiny_qwen3_dir, size):
    config = dataclasses.replace(load_model_config(tiny_qwen3_dir, None), vocab_size=ODD_VOCAB)
    hd, heads, kv, hidden, inner = (config.head_dim, config.num_heads, config.num_kv_heads, config.hidden_size,
                                    config.intermediate_size)  # fmt: skip
    models = [meta_model(config, TPInfo(r, size)) for r in range(size)]
    padded = -(-ODD_VOCAB // size) * size
    assert 0 < padded - ODD_VOCAB < size
    local_kv = kv // size if kv >= size else 1  # fewer KV heads than ranks: one each, replicated
    for model in models:
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        assert (attn.num_heads, attn.num_kv_heads) == (heads // size, local_kv)
        assert attn.q_proj.weight.shape == (heads * hd // size, hidden)  # split by output
        assert attn.k_proj.weight.shape == attn.v_proj.weight.shape == (local_kv * hd, hidden)
        assert attn.o_proj.weight.shape == (hidden, heads * hd // size)  # split by input
        assert mlp.gate_proj.weight.shape == mlp.up_proj.weight.shape == (inner // size, hidden)
        assert mlp.down_proj.weight.shape == (hidden, inner // size)
        assert model.model.embed_tokens.weight.shape == model.lm_head.weight.shape == (padded // size, hidden)
        assert model.model.norm.weight.shape == (hidden,)  # replicated
    # The query heads, the MLP and the vocabulary are split without overlap or gap.
    layer0 = [m.model.layers[0] for m in models]
    assert [a.self_attn.q_proj.start for a in layer0] == [r * heads * hd // size for r in range(size)]
    assert [a.mlp.down_proj.start for a in layer0] == [r * inner // size for r in range(size)]
    assert [m.model.embed_tokens.start for m in models] == [r * padded // size for r in range(size)]
    local = TPInfo(size - 1, size).local_config(config)
    assert (local.num_heads, local.num_kv_heads, local.vocab_size) == (heads // size, local_kv, ODD_VOCAB)


def test_kv_heads_go_where_their_query_heads_are():
    """Query head h reads KV head h // (heads / kv_heads): every rank must hold exactly the KV heads
    its query heads read, split or replicated, for every degree the model accepts."""
    for heads, kv_heads in [(4, 2), (8, 2), (8, 8), (16, 8), (32, 8), (12, 4), (9, 3)]:
        group = heads // kv_heads
        config = model_config(num_heads=heads, num_kv_heads=kv_heads)
        for size in range(1, heads + 1):
            try:
                distributed.check_degree(config, size)
            except UserError:
                continue
            for rank in range(size):
                tp = TPInfo(rank, size)
                first, count = tp.kv_head_shard(kv_heads)
                q_start, q_count = tp.shard(heads)
                wanted = sorted({h // group for h in range(q_start, q_start + q_count)})
                assert list(range(first, first + count)) == wanted, (heads, kv_heads, size, rank)
    assert [TPInfo(r, 4).kv_head_shard(2) for r in range(4)] == [(0, 1), (0, 1), (1, 1), (1, 1)]


def model_config(num_heads: int, num_kv_heads: int) -> ModelConfig:
    return ModelConfig(
        architecture="Qwen3ForCausalLM", vocab_size=512, hidden_size=64, intermediate_size=3 * 1024, num_layers=2,
        num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=16, rms_norm_eps=1e-6, max_context=256,
        tie_word_embeddings=False, qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=True, rope_theta=1e4,
    )  # fmt: skip


@pytest.mark.parametrize(("model", "size"), [("tiny_qwen3_dir", 2), ("odd_llama_dir", 4)])
def test_each_rank_reads_only_its_slices(request, monkeypatch, model, size):
    model_dir = request.getfixturevalue(model)
    config = load_model_config(model_dir, None)
    full = load_file(str(model_dir / "model.safetensors"))
    read: list[int] = []  # elements the loader asked safetensors for
    monkeypatch.setattr(model_module, "safe_open", counting_safe_open(model_module.safe_open, read))
    hd, q = config.head_dim, config.num_heads * config.head_dim // size
    rows = -(-config.vocab_size // size)
    for rank in range(size):
        read.clear()
        tp = TPInfo(rank, size)
        model = model_module.load_model(model_dir, config, torch.device("cpu"), torch.float32, tp)
        # What a rank reads is what it holds: its slices and the (small) replicated norms.
        held = sum(p.numel() for p in model.parameters())
        padding = (rows * size - config.vocab_size) * config.hidden_size if rank == size - 1 else 0
        assert sum(read) == held - padding < sum(t.numel() for t in full.values()) / size * 1.2
        layer, prefix = model.model.layers[1], "model.layers.1."
        first_kv, kv_heads = tp.kv_head_shard(config.num_kv_heads)
        kv_rows = slice(first_kv * hd, (first_kv + kv_heads) * hd)
        attn = layer.self_attn
        assert torch.equal(
            attn.q_proj.weight, full[prefix + "self_attn.q_proj.weight"][rank * q : (rank + 1) * q]
        )
        assert torch.equal(attn.k_proj.weight, full[prefix + "self_attn.k_proj.weight"][kv_rows])
        assert torch.equal(attn.v_proj.weight, full[prefix + "self_attn.v_proj.weight"][kv_rows])
        o = full[prefix + "self_attn.o_proj.weight"]
        assert torch.equal(attn.o_proj.weight, o[:, rank * q : (rank + 1) * q])
        embed = model.model.embed_tokens.weight
        real = full["model.embed_tokens.weight"][rank * rows : (rank + 1) * rows]
        assert torch.equal(embed[: len(real)], real) and not embed[len(real) :].any()  # padding rows: zero
        if config.tie_word_embeddings:
            assert model.lm_head.weight is embed  # tied, slice for slice


# ---------------------------------------------------------------------------------------------
# The step message


@pytest.mark.parametrize("pool", ["large", "small"])
def test_the_other_ranks_rebuild_rank0s_step_from_its_message(tiny_qwen3_dir, pool):
    """Rank 0's batches of a workload with overlap on (pending tokens), chunked prompts and radix
    hits, or a pool small enough to preempt (rows released and taken again, pages rewritten),
    sent as `StepMessage`s (pickled, as over the wire): the rebuilt batch prepares the same token
    ids, positions, K/V slots and rows, and a page table that applies the messages' writes stays
    equal to rank 0's."""
    llm = engine(tiny_qwen3_dir, num_pages=None if pool == "large" else 100, disable_overlap=False)
    params = SamplingParams(temperature=0, max_tokens=6 if pool == "large" else 30, ignore_eos=True)
    runner = llm.runner
    runner.page_table.write_log = []
    shadow = page_table_module.PageTable(*runner.page_table.table.shape, torch.device("cpu"))
    shadow.table[runner.padding_row] = runner.padding_page
    original_forward, checked = runner.forward, []

    def fields(batch):
        runner.prepare(batch)
        return [batch.input_ids, batch.positions, batch.out_slots, batch.rows, batch.last_token_index]

    def forward(batch):
        writes, runner.page_table.write_log = runner.page_table.write_log, []
        message = pickle.loads(pickle.dumps(StepMessage.of(batch, writes)))
        for row, start, pages in message.page_writes:
            shadow.write(row, start, pages)
        assert torch.equal(shadow.table, runner.page_table.table)
        rebuilt = message.batch()
        assert (rebuilt.is_prefill, rebuilt.query_lens, rebuilt.seq_lens, rebuilt.sampled) == (
            batch.is_prefill, batch.query_lens, batch.seq_lens, batch.sampled)  # fmt: skip
        for mine, theirs in zip(fields(rebuilt), fields(batch), strict=True):
            assert torch.equal(mine, theirs)
        checked.append(sum(r.num_pending for r in batch.requests))
        return original_forward(batch)

    runner.forward = forward
    first, second = two_waves(tiny_qwen3_dir)
    llm.generate(first, params)
    outs = llm.generate(second, params)
    assert any(checked), "some steps should carry pending tokens (overlap)"
    if pool == "large":
        assert all(o.cached_tokens >= 32 for o in outs), "the second wave should hit the prefix cache"
    else:
        assert llm.scheduler.num_preemptions > 0, "the pool is meant to run dry"


# ---------------------------------------------------------------------------------------------
# Refusals


def test_degrees_and_flags_that_cannot_work_are_refused_before_any_rank_starts(tiny_qwen3_dir):
    config = load_model_config(tiny_qwen3_dir, None)  # 4 heads, 2 KV heads, MLP 128
    with pytest.raises(UserError, match="--tp 3 cannot shard Qwen3ForCausalLM: its 4 attention heads"):
        distributed.check_degree(config, 3)
    odd_kv = dataclasses.replace(config, num_heads=12, num_kv_heads=3)
    for size in (2, 4):  # 3 KV heads neither split over 2 nor replicate over 4
        with pytest.raises(UserError, match="its 3 KV heads"):
            distributed.check_degree(odd_kv, size)
    distributed.check_degree(config, 4)  # 2 KV heads replicate over 4 ranks
    before = workers_below(os.getpid())
    for kwargs, needle in [
        ({"tp": 8}, "--tp 8 cannot shard"),
        ({"tp": 0}, "--tp must be >= 1"),
        ({"tp": 3, "nnodes": 2}, "does not split over --nnodes 2"),
        ({"tp": 2, "nnodes": 2}, "needs --dist-init-addr"),
        ({"tp": 2, "dist_init_addr": "no-port"}, "HOST:PORT"),
    ]:
        with pytest.raises(UserError, match=needle):
            engine(tiny_qwen3_dir, **kwargs)
    assert workers_below(os.getpid()) == before
    cli = load("stages.07_tensor_parallel.__main__")
    with pytest.raises(UserError, match="needs --dist-init-addr"):
        cli.main(["--tp", "2", "--nnodes", "2", "--node-rank", "1"])


# ---------------------------------------------------------------------------------------------
# The watchdog


class FakeProcess:
    def __init__(self, pid: int):
        self.pid, self.code = pid, None

    def poll(self):
        return self.code


def test_the_watchdog_names_the_rank_that_went_first(monkeypatch):
    """One loss brings others (a peer's collective breaks): the rank reported is the one that died
    without a word or fell silent, else the one whose failure came first."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, None, is_master=True, wait_for_workers=False)
    spec = ranks_module.RankSpec("m", None, "cpu", "float32", {}, 4, 2, dist_timeout=10, log_level=0)
    group = ranks_module.RankGroup(spec, torch.device("cpu"))
    group.local = {1: FakeProcess(101)}  # ranks 2 and 3 are another node's
    clock = [100.0]
    monkeypatch.setattr(ranks_module.time, "monotonic", lambda: clock[0])
    beats: dict = {}
    assert group._check(store, beats) is None  # no heartbeat yet (a node still starting): not timed
    clock[0] += 60
    assert group._check(store, beats) is None
    for rank in (1, 2, 3):
        store.add(ranks_module.heartbeat_key(rank), 1)
    assert group._check(store, beats) is None
    clock[0] += 4
    store.add(ranks_module.heartbeat_key(1), 1)
    store.add(ranks_module.heartbeat_key(2), 1)
    assert group._check(store, beats) is None
    clock[0] += 2  # rank 3 has been silent for 6 s, more than half of dist_timeout
    silent = "tensor-parallel rank 3 has not been heard from for more than 5 s (it hung, or its node is gone)"
    assert group._check(store, beats) == silent
    ranks_module.report_failure(store, 2, RuntimeError("connection reset by peer"))  # its peer is gone
    assert group._check(store, beats) == silent  # silent came first
    store.add(ranks_module.heartbeat_key(3), 1)
    assert (
        group._check(store, beats) == "tensor-parallel rank 2 failed: RuntimeError: connection reset by peer"
    )
    group.local[1].code = -9  # killed without a word: the news, whatever failed after it
    assert group._check(store, beats) == "tensor-parallel rank 1 (pid 101) was killed by SIGKILL"
    group.local[1].code = 1
    ranks_module.report_failure(store, 1, MemoryError("out of memory"))  # the second to fail
    assert (
        group._check(store, beats) == "tensor-parallel rank 2 failed: RuntimeError: connection reset by peer"
    )


# ---------------------------------------------------------------------------------------------
# TP=N gives TP=1's tokens


def two_waves(model_dir: Path) -> tuple[list[list[int]], list[list[int]]]:
    """A first wave with a 60-token prompt (chunked under a budget of 16) and a second wave sharing
    its first 40 tokens (a prefix-cache hit)."""
    first = sample_prompts(model_dir, n=5, seed=3)
    head = first[1][:40]
    return first, [head + p[:5] for p in first[2:4]]


def params_for(n: int, vocab: int) -> list[SamplingParams]:
    """Greedy with every log-probability, and seeded sampling: rank 0 samples, the others get its tokens."""
    return [
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=vocab)
        if i % 2 == 0
        else SamplingParams(temperature=0.9, top_k=20, seed=i, max_tokens=10, ignore_eos=True)
        for i in range(n)
    ]


def serve_two_waves(llm, model_dir: Path):
    vocab = llm.config.vocab_size
    first, second = two_waves(model_dir)
    outs = llm.generate(first, params_for(len(first), vocab))
    outs += llm.generate(second, params_for(len(second), vocab))
    llm.scheduler.check_integrity()
    assert not llm.has_unfinished()
    return outs


def assert_same_outputs(got, want, vocab: int) -> None:
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.cached_tokens for o in got] == [o.cached_tokens for o in want]
    for a, b in zip(got, want, strict=True):
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            torch.testing.assert_close(full_logprobs(x, vocab), full_logprobs(y, vocab), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def tp2(tiny_qwen3_dir):
    """One TP=2 engine for the tests below, until one kills its rank 1."""
    llm = engine(tiny_qwen3_dir, tp=2)
    yield llm
    llm.close()


@pytest.mark.parametrize("overlap", [True, False])
def test_tp2_matches_tp1(tiny_qwen3_dir, tp2, overlap):
    ref = engine(tiny_qwen3_dir, disable_overlap=not overlap)
    want = serve_two_waves(ref, tiny_qwen3_dir)
    assert all(o.cached_tokens >= 32 for o in want[-2:]), "the second wave should hit the prefix cache"
    assert want[1].cached_tokens == 0 and len(want[1].prompt_ids) == 60  # chunked under a budget of 16
    tp2.overlap = overlap
    sched = tp2.scheduler  # start with an empty prefix cache, as the reference does
    sched.allocator.free(sched.cache.evict(sched.cache.evictable_pages))
    got = serve_two_waves(tp2, tiny_qwen3_dir)
    assert_same_outputs(got, want, tp2.config.vocab_size)


def test_two_nodes_on_loopback_from_the_command_line(tiny_qwen3_dir):
    """--nnodes 2, each node one process, both started as a user would: node 1 with no prompt (it
    only starts rank 1 and takes every setting from node 0), node 0 with the prompts."""
    address = f"127.0.0.1:{free_port()}"
    prompts = ["The cat sat on", "A dog ran to the"]
    ref = engine(tiny_qwen3_dir)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = ref.generate([ref.tokenizer.encode_prompt(p, chat=False) for p in prompts], params)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = ["--tp", "2", "--nnodes", "2", "--dist-init-addr", address]
    node1 = subprocess.Popen(
        [sys.executable, "-m", "stages.07_tensor_parallel", *common, "--node-rank", "1"], cwd=ROOT, env=env
    )
    try:
        node0 = subprocess.run(
            [sys.executable, "-m", "stages.07_tensor_parallel", *common, "--model", str(tiny_qwen3_dir), "--device",
             "cpu", "--raw", "--max-tokens", "8", "--ignore-eos", "--prompt", prompts[0], "--prompt", prompts[1]],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert node0.returncode == 0, node0.stderr
        assert node1.wait(BOUND_S) == 0
    finally:
        if node1.poll() is None:
            node1.kill()
    answers = node0.stdout.split("--- [")[1:]
    assert [a.split("\n", 1)[1].rstrip("\n") for a in answers] == [o.text for o in want]
    assert "tensor parallelism: 2 ranks" in node0.stderr


# ---------------------------------------------------------------------------------------------
# A lost rank: killed (the shared TP=2 engine's, which it closes), or hung


def test_killed_rank_ends_the_engine_with_its_name(tp2):
    (worker,) = tp2.ranks.local.values()
    tp2.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
    for _ in range(3):
        tp2.step()
    os.kill(worker.pid, signal.SIGKILL)
    started = time.monotonic()
    with pytest.raises(ranks_module.RankFailure) as err:
        for _ in range(1000):
            tp2.step()
    assert time.monotonic() - started < BOUND_S
    assert str(err.value) == f"tensor-parallel rank 1 (pid {worker.pid}) was killed by SIGKILL"
    with pytest.raises(ranks_module.RankFailure, match="tensor-parallel rank 1"):  # and every step after
        tp2.step()
    tp2.close()
    assert not workers_below(os.getpid())


def test_tp4_with_replicated_kv_heads_and_a_padded_vocabulary_then_a_hung_rank(odd_llama_dir):
    """TP=4 on a Llama with tied embeddings, 2 KV heads (each on two ranks) and a vocabulary of 509
    (padded to 512) gives TP=1's outputs. Then rank 2 stops (SIGSTOP): its silence ends the engine
    with its name, and every rank is gone."""
    want = serve_two_waves(engine(odd_llama_dir), odd_llama_dir)
    llm = engine(odd_llama_dir, tp=4, dist_timeout=16)  # a rank silent for 8 s is lost
    workers = [p.pid for p in llm.ranks.local.values()]
    try:
        assert [rank_of(p) for p in workers] == [1, 2, 3] and sorted(workers) == workers_below(os.getpid())
        assert_same_outputs(serve_two_waves(llm, odd_llama_dir), want, ODD_VOCAB)
        llm.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        llm.step()
        os.kill(workers[1], signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(ranks_module.RankFailure) as err:
            for _ in range(1000):
                llm.step()
        assert time.monotonic() - started < BOUND_S
        assert str(err.value) == (
            "tensor-parallel rank 2 has not been heard from for more than 8 s (it hung, or its node is gone)"
        )
    finally:
        llm.close()
    assert not [p for p in workers if alive(p)]


def test_the_ranks_leave_on_rank0s_word_and_together(tiny_qwen3_dir):
    """A clean close: every rank leaves the process groups with rank 0 and exits by itself. On GPUs
    an NCCL group's teardown waits for every rank's, so a rank 0 that waited for its ranks to exit
    before leaving the groups would wait 30 s and then kill them (it did, on four H200s)."""
    llm = engine(tiny_qwen3_dir, tp=2)
    procs = list(llm.ranks.local.values())
    serve_two_waves(llm, tiny_qwen3_dir)
    OPEN.remove(llm)
    started = time.monotonic()
    llm.close()
    assert [p.returncode for p in procs] == [0]  # not killed: it left on its own
    assert time.monotonic() - started < ranks_module.STOP_S / 2
