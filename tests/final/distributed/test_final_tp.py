"""final/'s tensor parallelism (--tp N) on the CPU, every rank a process of its own, with gloo:

- the shards: shapes, vocabulary padding, fewer KV heads than ranks, and a loader that reads
  each rank's slices of the checkpoint and nothing more;
- the step channel's framing, and the checks that refuse a degree or flags that cannot work;
- TP=2 and TP=4 give TP=1's greedy tokens (and seeded samples), with a prefix-cache hit and a
  chunked prompt: offline (LLM), through the engine process, the server, the shell, and split
  over two "nodes" of one process each on loopback;
- a killed or hung rank ends the engine with a message naming it, within a bound, and leaves no
  process behind.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import torch
from safetensors.torch import load_file

import final
from final.__main__ import main as final_main
from final.core.config import EngineConfig
from final.core.errors import UserError
from final.core.forward_batch import StepInput
from final.core.model_config import load_model_config
from final.core.sampling_params import SamplingParams
from final.distributed.step_channel import FRAME_INTS, StepChannel, StepMessage
from final.distributed.tp import TPInfo
from final.frontend.client import SyncEngineClient
from final.frontend.tokenizer import Tokenizer
from final.models import weights as weights_module
from final.models.llama import LlamaForCausalLM
from final.models.loader import check_tp_degree, load_model
from final.runtime.process import ENGINE_FAILED_EXIT, launch_engine
from final.runtime.ranks import RankFailure
from final.runtime.watchdog import Watchdog, failure_key, heartbeat_key
from final.server.launch import ENGINE_LOST_EXIT
from tests import ROOT
from tests.final.server.test_final_server import Server
from tests.fixtures.tiny_models import make_tiny_checkpoint, sample_prompts
from tests.fixtures.tp import alive, counting_safe_open, free_port, processes_below

BOUND_S = 20.0  # a lost rank must have ended the engine within this (the watchdog polls every 0.2 s)
ODD_VOCAB = 509  # prime: padded at every degree


@pytest.fixture(scope="module")
def odd_llama_dir(tmp_path_factory) -> Path:
    """Llama shape (tied embeddings, 2 KV heads) with a vocabulary no degree divides."""
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny_llama_509"), "llama", vocab_size=ODD_VOCAB)


def rank_processes(root: int) -> list[int]:
    """Pids of the `final.runtime.worker` processes below `root` in the process tree."""
    return processes_below(root, b"final.runtime.worker")


def wait_until_gone(pids: list[int], timeout: float = BOUND_S) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling another process's exit
    return [p for p in pids if alive(p)]


# ---------------------------------------------------------------------------------------------
# Shards


def meta_model(config, tp: TPInfo) -> LlamaForCausalLM:
    with torch.device("meta"):
        return LlamaForCausalLM(config, tp)


@pytest.mark.parametrize("size", [2, 4])
def test_shards_partition_the_model_and_pad_the_vocabulary(tiny_qwen3_dir, size):
    config = dataclasses.replace(load_model_config(tiny_qwen3_dir, None), vocab_size=ODD_VOCAB)
    hd, heads, kv = config.head_dim, config.num_heads, config.num_kv_heads
    ranks = [meta_model(config, TPInfo(r, size)) for r in range(size)]
    padded = -(-ODD_VOCAB // size) * size
    assert padded % size == 0 and 0 < padded - ODD_VOCAB < size  # 509 is prime: always padded
    for model in ranks:
        attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
        local_kv = kv // size if kv >= size else 1  # fewer KV heads than ranks: one, replicated
        assert attn.qkv_proj.output_sizes == [heads // size * hd, local_kv * hd, local_kv * hd]
        assert tuple(attn.o_proj.weight.shape) == (config.hidden_size, heads * hd // size)
        assert tuple(mlp.gate_up_proj.weight.shape) == (
            2 * config.intermediate_size // size,
            config.hidden_size,
        )
        assert tuple(mlp.down_proj.weight.shape) == (config.hidden_size, config.intermediate_size // size)
        assert model.model.embed_tokens.weight.shape[0] == model.lm_head.weight.shape[0] == padded // size
        assert model.model.norm.weight.shape == (config.hidden_size,)  # replicated
    # The query heads, the MLP and the vocabulary are split without overlap or gap.
    starts = [m.model.embed_tokens.start for m in ranks]
    assert starts == [r * padded // size for r in range(size)]
    q_slices = [m.model.layers[0].self_attn.qkv_proj.part_shards[0] for m in ranks]
    assert q_slices == [(r * heads * hd // size, heads * hd // size) for r in range(size)]


def test_fewer_kv_heads_than_ranks_are_replicated_where_their_queries_are():
    tp4 = [TPInfo(r, 4) for r in range(4)]
    # 2 KV heads, 8 query heads: ranks 0-1 hold queries 0-3, which use KV head 0; ranks 2-3 head 1.
    assert [tp.kv_head_shard(2) for tp in tp4] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert [TPInfo(r, 8).kv_head_shard(4) for r in range(8)] == [(h // 2, 1) for h in range(8)]
    assert [TPInfo(r, 2).kv_head_shard(4) for r in range(2)] == [(0, 2), (2, 2)]


@pytest.mark.parametrize("size", [2, 4])
def test_each_rank_reads_only_its_slices(tiny_qwen3_dir, monkeypatch, size):
    config = load_model_config(tiny_qwen3_dir, None)
    full = load_file(str(tiny_qwen3_dir / "model.safetensors"))
    read: list[int] = []  # elements the loader asked safetensors for
    monkeypatch.setattr(weights_module, "safe_open", counting_safe_open(weights_module.safe_open, read))
    hd, q = config.head_dim, config.num_heads * config.head_dim // size
    for rank in range(size):
        read.clear()
        tp = TPInfo(rank, size)
        model = load_model(tiny_qwen3_dir, config, torch.device("cpu"), torch.float32, tp)
        # What a rank reads is what it holds: its slices, plus the (small) replicated norms.
        held = sum(p.numel() for p in model.parameters())
        assert sum(read) == held < sum(t.numel() for t in full.values()) / size * 1.1
        layer, prefix = model.model.layers[1], "model.layers.1."
        first_kv, kv_heads = tp.kv_head_shard(config.num_kv_heads)
        qkv = layer.self_attn.qkv_proj.weight
        k_rows = slice(first_kv * hd, (first_kv + kv_heads) * hd)
        assert torch.equal(qkv[:q], full[prefix + "self_attn.q_proj.weight"][rank * q : (rank + 1) * q])
        assert torch.equal(qkv[q : q + kv_heads * hd], full[prefix + "self_attn.k_proj.weight"][k_rows])
        assert torch.equal(qkv[q + kv_heads * hd :], full[prefix + "self_attn.v_proj.weight"][k_rows])
        o = full[prefix + "self_attn.o_proj.weight"]
        assert torch.equal(layer.self_attn.o_proj.weight, o[:, rank * q : (rank + 1) * q])
        rows = config.vocab_size // size
        embed = full["model.embed_tokens.weight"][rank * rows : (rank + 1) * rows]
        assert torch.equal(model.model.embed_tokens.weight, embed)


def test_padding_rows_of_the_vocabulary_are_zero(odd_llama_dir):
    config = load_model_config(odd_llama_dir, None)
    full = load_file(str(odd_llama_dir / "model.safetensors"))["model.embed_tokens.weight"]
    last = load_model(odd_llama_dir, config, torch.device("cpu"), torch.float32, TPInfo(3, 4))
    rows = last.model.embed_tokens.weight  # rows 384..511 of a 512-row padded table; 509 are real
    assert rows.shape[0] == 128
    assert torch.equal(rows[:125], full[384:]) and not rows[125:].any()
    assert last.lm_head.weight is last.model.embed_tokens.weight  # tied, shard for shard


# ---------------------------------------------------------------------------------------------
# The step channel and the checks


def test_step_messages_cross_the_channel_in_one_frame_or_two(monkeypatch):
    sent: list[torch.Tensor] = []
    sender, receiver = StepChannel(TPInfo(0, 2)), StepChannel(TPInfo(1, 2))
    monkeypatch.setattr(sender, "_broadcast", lambda x: sent.append(x.clone()) or x)
    monkeypatch.setattr(receiver, "_broadcast", lambda x: x.copy_(sent.pop(0)))
    decode = StepInput([3, 0, 7], [1, 1, 1], [10, 4, 8], [True, True, True], [0, 11, 0], [True, False, True])
    writes = ([3, 7], [9, 7], [40, 41])
    big_ids = list(range(5000))  # a prefill longer than a frame: the rest follows in a second broadcast
    prefill = StepInput([1, 2], [4000, 1000], [4000, 1200], [False, True], big_ids, [False, False])
    prefill_writes = (list(range(3000)), list(range(3000)), list(range(3000, 6000)))
    for step, page_writes, frames in [(decode, writes, 1), (prefill, prefill_writes, 2)]:
        sender.send(step, page_writes)
        assert len(sent) == frames
        assert receiver.receive() == StepMessage(step, page_writes)
        assert not sent
    assert 5 * 3 + 3 + 6 + 5 < FRAME_INTS < 5000
    sender.send_shutdown()
    assert receiver.receive() is None


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"tp": 3, "nnodes": 2}, "does not split over --nnodes 2"),
        ({"tp": 2, "nnodes": 2}, "needs --dist-init-addr"),
        ({"tp": 2, "nnodes": 2, "node_rank": 2, "dist_init_addr": "h:1"}, "--node-rank must be in"),
        ({"tp": 0}, "--tp must be >= 1"),
        ({"tp": 2, "dist_timeout": 0}, "--dist-timeout must be > 0"),
    ],
)
def test_bad_tp_flags_are_refused(kwargs, needle):
    with pytest.raises(UserError, match=needle):
        EngineConfig(**kwargs)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--tp", "2", "--dist-init-addr", "no-port"], "HOST:PORT"),
        (["--tp", "2", "--device", "cpu", "--dist-init-addr", "h:99999"], "HOST:PORT"),
        (["--tp", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "h"], "HOST:PORT"),
    ],
)
def test_cli_refuses_bad_rendezvous_before_starting_anything(argv, needle):
    with pytest.raises(UserError, match=needle):
        final_main(argv)


def test_degrees_that_cannot_shard_the_model_are_refused_before_any_rank_starts(tiny_qwen3_dir):
    config = load_model_config(tiny_qwen3_dir, None)  # 4 heads, 2 KV heads, MLP 128
    with pytest.raises(UserError, match="--tp 3 cannot shard Qwen3ForCausalLM: its 4 attention heads"):
        check_tp_degree(config, 3)
    odd_kv = dataclasses.replace(config, num_heads=12, num_kv_heads=3)
    for size in (2, 4):  # 3 KV heads neither split over 2 nor replicate over 4
        with pytest.raises(UserError, match="its 3 KV heads"):
            check_tp_degree(odd_kv, size)
    # The default model's shape: 9 heads, 3 KV heads, MLP 1536 (which 9 does not divide).
    smollm = dataclasses.replace(config, num_heads=9, num_kv_heads=3, intermediate_size=1536)
    with pytest.raises(UserError, match="the degrees that work for this model: 1, 3$"):
        check_tp_degree(smollm, 2)
    with pytest.raises(UserError, match="works? for this model: 1, 2, 4$"):
        check_tp_degree(config, 3)
    check_tp_degree(config, 4)  # 2 KV heads replicate over 4 ranks
    before = set(rank_processes(os.getpid()))
    with pytest.raises(UserError, match="--tp 8 cannot shard"):
        final.LLM(str(tiny_qwen3_dir), device="cpu", tp=8)
    assert set(rank_processes(os.getpid())) == before
    with pytest.raises(UserError, match="runs no engine of its own"):
        final.LLM(str(tiny_qwen3_dir), device="cpu", tp=2, nnodes=2, node_rank=1, dist_init_addr="h:1")


def test_watchdog_names_the_lost_rank(monkeypatch):
    store = torch.distributed.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False)

    class Exited:
        pid, code = 4242, None

        def poll(self):
            return self.code

    proc, clock = Exited(), [100.0]
    dog = Watchdog(store, 3, {1: proc}, silence_s=5, on_failure=lambda m: None)  # type: ignore[arg-type]
    monkeypatch.setattr("final.runtime.watchdog.time.monotonic", lambda: clock[0])
    assert dog.check() is None  # no heartbeat yet (a node still starting): not timed
    clock[0] += 60
    assert dog.check() is None
    store.add(heartbeat_key(1), 1)
    store.add(heartbeat_key(2), 1)
    assert dog.check() is None
    clock[0] += 4
    store.add(heartbeat_key(1), 1)  # rank 1 beats, rank 2 (another node's) falls silent
    assert dog.check() is None
    clock[0] += 2
    assert (
        dog.check() == "tensor-parallel rank 2 has not been heard from for 6 s (it hung, or its node is gone)"
    )
    store.add(heartbeat_key(2), 1)
    assert dog.check() is None
    store.set(failure_key(2), "OutOfMemoryError: CUDA out of memory")
    assert dog.check() == "tensor-parallel rank 2 failed: OutOfMemoryError: CUDA out of memory"
    proc.code = -9
    assert dog.check() == "tensor-parallel rank 1 (pid 4242) was killed by SIGKILL"
    store.set(failure_key(1), "RuntimeError: boom")
    proc.code = 1
    assert dog.check() == "tensor-parallel rank 1 (pid 4242) exited with code 1: RuntimeError: boom"


# ---------------------------------------------------------------------------------------------
# TP=N gives TP=1's tokens


def prompts_for(model_dir: Path, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    """A first wave (a 60-token prompt that --max-prefill-length 16 cuts into chunks) and a second
    wave that shares 40 tokens with the first (a prefix-cache hit)."""
    first = [[t % vocab for t in p] for p in sample_prompts(model_dir, n=5, seed=3)]
    head = first[1][:40]
    return first, [head + p[:5] for p in first[2:4]]


def params_for(n: int) -> list[SamplingParams]:
    """Greedy with logprobs, and seeded sampling (one rank samples; the others get its tokens)."""
    return [
        SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=5)
        if i % 2 == 0
        else SamplingParams(temperature=0.9, top_k=30, seed=i, max_tokens=10, ignore_eos=True)
        for i in range(n)
    ]


def serve_two_waves(llm: final.LLM, first, second):
    outs = llm.generate(first, params_for(len(first)), progress=False)
    outs += llm.generate(second, params_for(len(second)), progress=False)
    llm.core.check_integrity()
    assert not llm.core.has_work()
    return outs


def assert_same_outputs(got, want) -> None:
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    for a, b in zip(got, want, strict=True):
        assert a.cached_tokens == b.cached_tokens
        for x, y in zip(a.logprobs, b.logprobs, strict=True):
            assert x["top_ids"][0] == y["top_ids"][0]
            mine = dict(zip(x["top_ids"], x["top_logprobs"], strict=True))
            theirs = dict(zip(y["top_ids"], y["top_logprobs"], strict=True))
            assert len(mine.keys() & theirs.keys()) >= 4  # the 5th may swap with the 6th in a near-tie
            for token in mine.keys() & theirs.keys():
                assert abs(mine[token] - theirs[token]) < 1e-4


@pytest.mark.parametrize(("model", "size"), [("tiny_qwen3_dir", 2), ("odd_llama_dir", 4)])
def test_tp_matches_tp1_offline(request, model, size):
    """Qwen3 at TP=2; at TP=4 a Llama with tied embeddings, 2 KV heads (replicated) and a
    vocabulary of 509 (padded to 512)."""
    model_dir = request.getfixturevalue(model)
    vocab = load_model_config(model_dir, None).vocab_size
    first, second = prompts_for(model_dir, vocab)
    kwargs = {"device": "cpu", "max_prefill_length": 16}
    want = serve_two_waves(final.LLM(str(model_dir), **kwargs), first, second)
    assert all(o.cached_tokens >= 32 for o in want[-2:]), "the second wave must hit the prefix cache"
    with final.LLM(str(model_dir), tp=size, **kwargs) as llm:
        procs = list(llm.core.ranks.local.values())
        assert len(procs) == size - 1
        got = serve_two_waves(llm, first, second)
    assert_same_outputs(got, want)
    assert [p.returncode for p in procs] == [0] * (size - 1)  # they left on rank 0's word


def test_tp_with_preemption_and_overlap_matches_tp1(tiny_qwen3_dir):
    """A pool too small for the batch: requests are preempted, readmitted in other rows and
    recomputed, which rewrites the page table: every rank's copy must follow rank 0's. The TP run
    also takes overlap's code path (on the CPU it runs, it just hides nothing)."""
    prompts = sample_prompts(tiny_qwen3_dir, n=6, seed=8)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    kwargs = {"device": "cpu", "num_pages": 160, "max_prefill_length": 32}
    ref_llm = final.LLM(str(tiny_qwen3_dir), **kwargs)
    want = ref_llm.generate(prompts, params, progress=False)
    assert ref_llm.core.scheduler.num_preemptions > 0
    with final.LLM(str(tiny_qwen3_dir), tp=2, overlap="on", **kwargs) as llm:
        assert llm.core.overlap
        got = llm.generate(prompts, params, progress=False)
        assert llm.core.scheduler.num_preemptions > 0
        llm.core.check_integrity()
    assert [o.token_ids for o in got] == [o.token_ids for o in want]


def test_two_nodes_on_loopback(tiny_qwen3_dir):
    """--nnodes 2: node 1 is `python -m final --node-rank 1`, which starts rank 1 and takes its
    flags from node 0; node 0 is this process's LLM."""
    address = f"127.0.0.1:{free_port()}"
    node1 = subprocess.Popen(
        [sys.executable, "-m", "final", "--tp", "2", "--nnodes", "2", "--node-rank", "1",
         "--dist-init-addr", address, "--log-level", "warning"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        first, _ = prompts_for(tiny_qwen3_dir, 10**9)
        params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
        want = final.LLM(str(tiny_qwen3_dir), device="cpu").generate(first, params, progress=False)
        with final.LLM(str(tiny_qwen3_dir), device="cpu", tp=2, nnodes=2, dist_init_addr=address) as llm:
            assert not llm.core.ranks.local  # rank 1 is node 1's
            got = llm.generate(first, params, progress=False)
        assert [o.token_ids for o in got] == [o.token_ids for o in want]
        assert node1.wait(BOUND_S) == 0
    finally:
        if node1.poll() is None:
            node1.kill()


# ---------------------------------------------------------------------------------------------
# A lost rank ends the engine, with its name, within a bound


@pytest.mark.parametrize("how", ["killed", "hung"])
def test_lost_rank_fails_the_offline_engine_with_its_message(tiny_qwen3_dir, how):
    # A hung rank is found by its silence: 4 s here (at most 30 s by default).
    llm = final.LLM(str(tiny_qwen3_dir), device="cpu", tp=2, dist_timeout=4 if how == "hung" else 600)
    try:
        (worker,) = llm.core.ranks.local.values()
        llm.add_request([5, 6, 7], SamplingParams(temperature=0, max_tokens=100, ignore_eos=True))
        for _ in range(3):
            llm.step()
        os.kill(worker.pid, signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        started = time.monotonic()
        with pytest.raises(RankFailure) as err:
            for _ in range(1000):
                llm.step()
        assert time.monotonic() - started < BOUND_S
        expected = (
            f"tensor-parallel rank 1 (pid {worker.pid}) was killed by SIGKILL"
            if how == "killed"
            else "tensor-parallel rank 1 has not been heard from for 4 s (it hung, or its node is gone)"
        )
        assert str(err.value) == expected
        with pytest.raises(RankFailure, match="tensor-parallel rank 1"):  # and every step after it
            llm.step()
        assert llm.core.failed
    finally:
        llm.close()
    assert not wait_until_gone([worker.pid])


def test_engine_process_matches_tp1_then_fails_cleanly_on_a_lost_rank(tiny_qwen3_dir):
    first, _ = prompts_for(tiny_qwen3_dir, 10**9)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    want = final.LLM(str(tiny_qwen3_dir), device="cpu").generate(first, params, progress=False)
    engine = launch_engine(
        EngineConfig(model=str(tiny_qwen3_dir), device="cpu", tp=2), tiny_qwen3_dir, "warning"
    )
    client = SyncEngineClient(engine)
    try:
        (worker,) = rank_processes(engine.process.pid)
        for prompt, ref in zip(first, want, strict=True):
            got = [t for delta in client.generate(prompt, params) for t in delta.token_ids]
            assert got == ref.token_ids
        stream = client.generate([5, 6, 7], SamplingParams(temperature=0, max_tokens=200, ignore_eos=True))
        next(stream)
        os.kill(worker, signal.SIGSTOP)  # the request cannot finish while rank 1 is stopped
        os.kill(worker, signal.SIGKILL)
        started = time.monotonic()
        last = [delta for delta in stream][-1]
        assert last.finish_reason == "error"
        assert (
            last.error
            == f"the engine failed: RankFailure: tensor-parallel rank 1 (pid {worker}) was killed by SIGKILL"
        )
        engine.process.join(BOUND_S)
        assert time.monotonic() - started < BOUND_S
        assert engine.process.exitcode == ENGINE_FAILED_EXIT
    finally:
        client.close()
        engine.shutdown()
    assert not wait_until_gone([worker])


# ---------------------------------------------------------------------------------------------
# The faces: the server and the shell


def test_server_with_tp_answers_then_reports_a_lost_rank(tiny_qwen3_dir, tmp_path):
    prompt = [5, 6, 7, 8, 9]
    ref = final.LLM(str(tiny_qwen3_dir), device="cpu").generate(
        [prompt], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), progress=False
    )[0]
    server = Server(
        tiny_qwen3_dir, tmp_path / "server.log", "--tp", "2", "--device", "cpu", "--log-level", "warning"
    )
    workers = rank_processes(server.proc.pid)
    try:
        assert len(workers) == 1
        client = server.client()
        model = tiny_qwen3_dir.name
        answer = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0)
        assert answer.choices[0].text == ref.text
        stream = client.completions.create(
            model=model, prompt=prompt, max_tokens=200, temperature=0, stream=True
        )
        chunks = iter(stream)
        next(chunks)
        os.kill(workers[0], signal.SIGSTOP)
        os.kill(workers[0], signal.SIGKILL)
        with pytest.raises(openai.APIError) as lost:
            for _ in chunks:
                pass
        # The client learns that the engine is dead, not which process died of which signal: that
        # is for the log. The server then exits for its supervisor to restart it.
        assert lost.value.code == "engine_dead" and "rank" not in lost.value.message, lost.value
        assert server.proc.wait(BOUND_S) == ENGINE_LOST_EXIT, server.log()
        assert "tensor-parallel rank 1" in server.log_path.read_text()
    finally:
        server.stop()
    assert not wait_until_gone(workers)


def test_shell_with_tp(tiny_qwen3_dir):
    ids = Tokenizer(tiny_qwen3_dir).encode_chat([{"role": "user", "content": "Hello there"}])
    params = SamplingParams(temperature=0, max_tokens=8)
    want = final.LLM(str(tiny_qwen3_dir), device="cpu").generate([ids], params, progress=False)[0].text
    proc = subprocess.run(
        [sys.executable, "-m", "final", "--shell", "--tp", "2", "--model", str(tiny_qwen3_dir), "--device", "cpu",
         "--temperature", "0", "--max-tokens", "8"],
        input="Hello there\n/exit\n", capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert want and f"> {want}\n" in proc.stdout
