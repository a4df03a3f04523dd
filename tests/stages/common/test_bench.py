"""Workload generators and the bench harness: seeded workloads of the promised shape, a driver
that respects arrival times and turn order, and result files in the schema the docs render."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.render_results import parse_result
from stages.common import bench
from stages.common import workloads as wl
from stages.common.outputs import RequestOutput
from stages.common.sampling import SamplingParams
from tests.stage_list import ROOT

VOCAB = 49152  # SmolLM2's: above 10000, so ids are Nano-vLLM's


# ---------------------------------------------------------------------------------------------
# Workloads


@pytest.mark.parametrize("name", sorted(wl.WORKLOADS))
def test_workloads_are_deterministic_for_a_seed(name):
    a, b = wl.make_workload(name, VOCAB, seed=3, scale=0.1), wl.make_workload(name, VOCAB, seed=3, scale=0.1)
    assert a.items == b.items
    assert wl.make_workload(name, VOCAB, seed=4, scale=0.1).items != a.items


def test_offline_is_nano_vllms_benchmark_at_scale_1():
    w = wl.offline(VOCAB)
    assert w.num_requests == 256
    assert all(100 <= len(it.prompt_ids) <= 1024 and 100 <= it.params.max_tokens <= 1024 for it in w.items)
    assert all(0 <= t <= 10_000 for it in w.items for t in it.prompt_ids)
    assert all(it.arrival_s == 0 and it.params.ignore_eos and it.params.temperature == 0.6 for it in w.items)
    # Nano-vLLM's bench.py reports 133,966 output tokens for its seed-0 workload.
    assert w.max_output_tokens == 133_966


def test_scale_shrinks_counts_and_lengths_and_vocab_bounds_ids():
    w = wl.offline(vocab_size=300, scale=0.05)
    assert w.num_requests == 13
    assert all(5 <= len(it.prompt_ids) <= 51 and 5 <= it.params.max_tokens <= 51 for it in w.items)
    assert max(t for it in w.items for t in it.prompt_ids) < 300
    lat = wl.latency(VOCAB, scale=0.25)
    (item,) = lat.items
    assert len(item.prompt_ids) == 128 and item.params.max_tokens == 32 and item.params.greedy
    long = wl.long_prompt(VOCAB, scale=0.05)
    longs = [it for it in long.items if it.group == 1]
    assert longs and all(819 <= len(it.prompt_ids) <= 1638 for it in longs)
    assert [it.arrival_s for it in longs] == pytest.approx([0.1 * (i + 1) for i in range(len(longs))])
    assert all(len(it.prompt_ids) == 3 and it.arrival_s == 0 for it in long.items if it.group == 0)


def test_long_context_is_64_prompts_of_4k_to_16k_tokens_at_once():
    w = wl.long_context(VOCAB)
    assert w.num_requests == 64 and all(it.arrival_s == 0 for it in w.items)
    lengths = [len(it.prompt_ids) for it in w.items]
    assert 4096 <= min(lengths) < 6000 and 14_000 < max(lengths) <= 16_384
    assert all(it.params.max_tokens == 128 and it.params.greedy and it.params.ignore_eos for it in w.items)
    assert w.longest_request <= 16_384 + 128


def test_decode_step_is_a_batch_of_equal_requests_whose_batch_does_not_scale():
    w = wl.make_workload("decode-step", VOCAB, scale=0.25, batch=8)
    assert w.num_requests == 8 and w.settings == {"batch": 8, "prompt_len": 128, "output_len": 32}
    assert all(len(it.prompt_ids) == 128 and it.params.max_tokens == 32 for it in w.items)
    assert all(it.arrival_s == 0 and it.params.greedy and it.params.ignore_eos for it in w.items)
    assert len({tuple(it.prompt_ids) for it in w.items}) == 8  # nothing shared: no prefix cache hit
    assert wl.make_workload("decode-step", VOCAB).num_requests == 64
    with pytest.raises(TypeError):
        wl.make_workload("decode-step", VOCAB, batches=8)


def test_shared_prefix_groups_share_a_system_prompt_and_turns_extend_each_other():
    w = wl.shared_prefix(VOCAB, scale=0.25)
    prefix = w.settings["prefix_len"]
    grouped = [it for it in w.items if it.group is not None]
    assert len(grouped) == 4 * 4
    by_group: dict[int, list[list[int]]] = {}
    for it in grouped:
        by_group.setdefault(it.group, []).append(it.prompt_ids)
    heads = {g: {tuple(p[:prefix]) for p in prompts} for g, prompts in by_group.items()}
    assert all(len(h) == 1 for h in heads.values())  # one system prompt per group
    assert len({next(iter(h)) for h in heads.values()}) == len(heads)  # and a different one each
    sessions = [it for it in w.items if it.session is not None]
    assert len(sessions) == 4 * 4
    for s in range(4):
        turns = sorted((it for it in sessions if it.session == s), key=lambda it: it.turn)
        for before, after in zip(turns, turns[1:], strict=False):
            assert after.follows_previous_turn
            grown = len(before.prompt_ids) + w.settings["reply_len"] + w.settings["message_len"]
            assert after.prompt_ids[: len(before.prompt_ids)] == before.prompt_ids
            assert len(after.prompt_ids) == grown


def test_no_sharing_has_the_same_shape_and_shares_nothing():
    shared, unshared = wl.shared_prefix(VOCAB, scale=0.25), wl.no_sharing(VOCAB, scale=0.25)
    assert [len(it.prompt_ids) for it in shared.items] == [len(it.prompt_ids) for it in unshared.items]
    assert [(it.group, it.session, it.turn, it.arrival_s) for it in shared.items] == [
        (it.group, it.session, it.turn, it.arrival_s) for it in unshared.items
    ]
    heads = [tuple(it.prompt_ids[:8]) for it in unshared.items]
    assert len(set(heads)) == len(heads)


def test_online_arrivals_are_poisson_at_the_rate():
    w = wl.online(rate=8.0, vocab_size=VOCAB)
    times = [it.arrival_s for it in w.items]
    assert times == sorted(times) and times[0] > 0
    mean_gap = times[-1] / len(times)
    assert mean_gap == pytest.approx(1 / 8.0, rel=0.2)
    assert [it.prompt_ids for it in w.items] == [it.prompt_ids for it in wl.offline(VOCAB).items]


def test_online_by_name_is_the_online_workload_at_a_moderate_default_rate():
    w = wl.make_workload("online", VOCAB, scale=0.1)
    assert w.settings["rate"] == wl.DEFAULT_ONLINE_RATE
    assert w.items == wl.online(wl.DEFAULT_ONLINE_RATE, VOCAB, scale=0.1).items
    assert wl.make_workload("online", VOCAB, scale=0.1, rate=4).settings["rate"] == 4


# ---------------------------------------------------------------------------------------------
# The driver and the metrics, on a fake engine


class OneStepEngine:
    """Finishes every request one step after it was added; each step takes `step_s`."""

    def __init__(self, step_s: float = 0.01):
        self.step_s, self.queue, self.added, self.next_rid = step_s, [], [], 0

    def add_request(self, prompt: list[int], params: SamplingParams) -> int:
        self.queue.append((self.next_rid, prompt, time.perf_counter()))
        self.added.append(prompt)
        self.next_rid += 1
        return self.next_rid - 1

    def has_unfinished(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[tuple[int, RequestOutput]]:
        time.sleep(self.step_s)
        done, self.queue = self.queue, []
        now = time.perf_counter()
        return [
            (
                rid,
                RequestOutput(
                    prompt, [1, 2], ttft_s=now - t0, latency_s=now - t0, token_times=[now - t0] * 2
                ),
            )
            for rid, prompt, t0 in done
        ]


def test_driver_sends_a_turn_only_after_the_previous_one_finished():
    params = SamplingParams(max_tokens=2)
    items = [
        wl.WorkItem(0.0, [1], params, session=0, turn=0),
        wl.WorkItem(0.0, [1, 2], params, session=0, turn=1),
        wl.WorkItem(0.0, [1, 2, 3], params, session=0, turn=2),
        wl.WorkItem(0.05, [9], params),
    ]
    engine = OneStepEngine()
    records, total_s = bench.drive(engine, wl.Workload("t", items, 0, 1.0), progress=False)
    assert engine.added[:3] == [[1], [1, 2], [1, 2, 3]]  # turn order kept
    by_prompt = {tuple(r.item.prompt_ids): r for r in records}
    for a, b in [((1,), (1, 2)), ((1, 2), (1, 2, 3))]:
        assert by_prompt[b].submitted_s >= by_prompt[a].finished_s
    late = by_prompt[(9,)]
    assert late.scheduled_s == 0.05 and late.submitted_s >= 0.05  # not sent before it arrives
    assert total_s == pytest.approx(max(r.finished_s for r in records))


def test_serial_engine_counts_queueing_in_ttft():
    class Generate:
        def generate(self, prompts, params):
            time.sleep(0.02)
            return [RequestOutput(prompts[0], [5], ttft_s=0.02, latency_s=0.02, token_times=[0.02])]

    engine = bench.SerialEngine(Generate())
    p = SamplingParams(max_tokens=1)
    engine.add_request([1], p), engine.add_request([2], p)
    first, second = engine.step()[0][1], engine.step()[0][1]
    assert first.ttft_s == pytest.approx(0.02, abs=0.01)
    assert second.ttft_s >= 0.04 and second.token_times == [second.ttft_s]


def test_decode_step_metrics_time_only_the_steps_where_the_whole_batch_decodes():
    """Three requests: B's first token comes at t=3 (its prefill was chunked), A finishes at t=8.
    The full-batch steps are 3->5 and 5->8, seen by each of the three. C was submitted later, and
    a little after the others' clock: its times are relative to its submission."""
    params = SamplingParams(max_tokens=5)

    def record(submitted: float, token_times: list[float]) -> bench.Record:
        item = wl.WorkItem(0.0, [1], params)
        out = RequestOutput([1], [7] * len(token_times), token_times=token_times)
        return bench.Record(item, 0.0, submitted, out)

    records = [
        record(0.0, [1.0, 3.0, 5.0, 8.0]),  # A
        record(0.0, [3.0, 5.0, 8.0, 9.0]),  # B
        record(0.5001, [0.5, 2.5, 4.5, 7.5, 8.5, 9.5]),  # C
    ]
    metrics = bench.decode_step_metrics(records, batch=3)
    assert metrics["full_batch_steps"] == 2
    assert metrics["decode_step_ms"] == pytest.approx(2500)  # the median of 2, 2, 2, 3, 3, 3 seconds
    assert metrics["decode_tok_per_s"] == pytest.approx(3 / 2.5)


def fake_record(group: int, token_times: list[float], ttft_s: float) -> bench.Record:
    item = wl.WorkItem(0.0, [1, 2], SamplingParams(max_tokens=len(token_times)), group=group)
    out = RequestOutput([1, 2], list(range(len(token_times))), ttft_s=ttft_s,
                        latency_s=token_times[-1], token_times=token_times)  # fmt: skip
    return bench.Record(item, 0.0, 0.0, out)


def test_long_prompt_metrics_see_a_stall_that_p99_misses():
    # 64 short requests of 256 tokens, 10 ms apart, except that each is stalled once for 500 ms
    # by one long prefill: 64 stalled gaps among 16,320, under 1 %, as on the H200 run.
    short = []
    for _ in range(64):
        times = [0.01 * k for k in range(256)]
        times[100:] = [t + 0.49 for t in times[100:]]
        short.append(fake_record(0, times, ttft_s=0.005))
    long = [fake_record(1, [t], ttft_s=t) for t in (0.6, 0.9, 1.5)]
    metrics = bench.long_prompt_metrics(short + long)
    assert metrics["short_itl_ms_p99"] == pytest.approx(10)  # blind to the stall
    assert metrics["short_itl_ms_max"] == pytest.approx(500)
    assert metrics["short_itl_ms_p999"] == pytest.approx(500)
    assert metrics["short_itl_ms_p50"] == pytest.approx(10)
    assert metrics["long_ttft_ms_p50"] == pytest.approx(900) and metrics["long_ttft_ms_max"] == pytest.approx(
        1500
    )
    assert list(metrics)[:2] == ["short_itl_ms_max", "short_itl_ms_p999"]  # what the chapter reads first


def test_head_keeps_the_first_requests_and_whole_chats():
    full = wl.shared_prefix(VOCAB, scale=0.25)
    for n in (1, 5, 17, 20, len(full.items)):
        head = full.head(n)
        assert len(head.items) == min(n, len(full.items)) and head.settings["max_requests"] == n
        kept = {(it.session, it.turn) for it in head.items}
        assert all((it.session, it.turn - 1) in kept for it in head.items if it.follows_previous_turn)
        assert [it for it in full.items if it in head.items] == head.items  # order kept
    offline = wl.offline(VOCAB)
    assert offline.head(16).items == offline.items[:16]
    with pytest.raises(ValueError, match="at least one"):
        offline.head(0)


def test_percentile_matches_linear_interpolation():
    values = [4.0, 1.0, 3.0, 2.0]
    assert bench.percentile(values, 50) == 2.5
    assert bench.percentile(values, 99) == pytest.approx(3.97)
    assert bench.percentile([7.0], 99) == 7.0


def test_decode_step_end_to_end_with_stage05(tmp_path, tiny_qwen3_dir):
    data = run_bench(tmp_path, tiny_qwen3_dir, "--engine", "stages.05_cuda_graph", "--workload", "decode-step",
                     "--scale", "0.05", "--workload-arg", "batch=3", "--engine-arg", "cuda_graph_max_bs=0")  # fmt: skip
    assert data["config"]["batch"] == 3 and data["config"]["cuda_graph_max_bs"] == 0
    metrics = data["metrics"]
    assert list(metrics)[:4] == [
        "decode_step_ms",
        "decode_tok_per_s",
        "decode_step_ms_p90",
        "full_batch_steps",
    ]
    assert metrics["requests"] == 3 and metrics["output_tokens"] == 3 * 6
    assert (
        metrics["full_batch_steps"] == 5 and metrics["decode_step_ms"] > 0
    )  # 6 tokens: 5 steps after the first


def test_engine_args_parse_numbers_and_strings():
    parsed = bench.parse_engine_args(
        ["attn=fi", "page_size=16", "memory_ratio=0.8", "max-running-requests=4"]
    )
    assert parsed == {"attn": "fi", "page_size": 16, "memory_ratio": 0.8, "max_running_requests": 4}
    assert bench.default_name("stages.02_paged_kv", "offline", "cpu") == "stage02_offline_cpu"


def test_the_parent_process_stays_light():
    assert bench.WORKLOAD_NAMES == tuple(wl.WORKLOADS)
    # Every run starts two interpreters: the parent must not pay for importing torch too.
    code = "import sys, stages.common.bench; assert 'torch' not in sys.modules, 'bench imports torch'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# ---------------------------------------------------------------------------------------------
# End to end: a fresh process per run, a result file the docs can render


def run_bench(tmp_path: Path, model: Path, *args: str) -> dict:
    cmd = [sys.executable, "-m", "stages.common.bench", "--model", str(model), "--device", "cpu"]
    cmd += ["--out", str(tmp_path), "--no-progress", "--name", "t_run", "--threads", "1", *args]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "t_run.json"
    data = json.loads(path.read_text())
    parse_result(data, path.name)  # the schema of benchmarks/README.md, as the renderer checks it
    assert data["hardware"]["gpu"] is None and data["versions"]["torch"]
    assert data["command"].startswith("python -m stages.common.bench ") and "--child" not in data["command"]
    return data


@pytest.mark.parametrize(
    ("engine", "workload", "scale"),
    [
        ("stages.02_paged_kv", "offline", "0.02"),
        ("stages.01_naive_generate", "latency", "0.1"),
        ("hf", "latency", "0.1"),
    ],
)
def test_harness_end_to_end(tmp_path, tiny_qwen3_dir, engine, workload, scale):
    data = run_bench(tmp_path, tiny_qwen3_dir, "--engine", engine, "--workload", workload, "--scale", scale)
    assert data["stage"] == engine.removeprefix("stages.") and data["workload"] == workload
    assert data["config"]["scale"] == float(scale) and data["config"]["dtype"] == "float32"
    assert data["config"]["threads"] == 1 and data["config"]["device"] == "cpu"
    metrics = data["metrics"]
    if workload == "offline":
        w = wl.offline(512, scale=float(scale))
        assert metrics["requests"] == w.num_requests and metrics["output_tokens"] == w.max_output_tokens
        keys = ["output_tok_per_s", "total_s", "ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50", "itl_ms_p99"]
    else:
        assert metrics["prompt_tokens"] == 51 and metrics["output_tokens"] == 13
        keys = ["decode_step_ms", "ttft_ms", "decode_tok_per_s", "prefill_tok_per_s", "total_s"]
    assert list(metrics)[: len(keys)] == keys  # the first four are what the docs plot
    assert all(metrics[k] > 0 for k in keys)


def test_long_prompt_run_keeps_every_repeat_and_the_call_id(tmp_path, tiny_qwen3_dir, monkeypatch):
    monkeypatch.setenv("BENCH_RUN_ID", "call-42")
    data = run_bench(
        tmp_path, tiny_qwen3_dir, "--engine", "stages.04_chunked_prefill", "--workload", "long-prompt",
        "--scale", "0.007", "--repeats", "2", "--engine-arg", "max_prefill_length=32",
    )  # fmt: skip
    assert data["run_id"] == "call-42" and data["config"]["repeats"] == 2
    assert len(data["runs"]) == 2 and all("short_itl_ms_max" in run for run in data["runs"])
    for key in ("short_itl_ms_max", "long_ttft_ms_p50", "long_ttft_ms_max"):
        assert data["metrics"][key] == pytest.approx(sorted(run[key] for run in data["runs"])[0] / 2
                                                    + sorted(run[key] for run in data["runs"])[1] / 2)  # fmt: skip
    assert data["metrics"]["short_itl_ms_max"] >= data["metrics"]["short_itl_ms_p50"] > 0


def test_max_requests_serves_the_first_requests(tmp_path, tiny_qwen3_dir):
    data = run_bench(
        tmp_path, tiny_qwen3_dir, "--engine", "stages.01_naive_generate", "--workload", "offline",
        "--scale", "0.02", "--max-requests", "2",
    )  # fmt: skip
    assert data["config"]["max_requests"] == 2 and data["metrics"]["requests"] == 2
    assert data["metrics"]["output_tokens"] == wl.offline(512, scale=0.02).head(2).max_output_tokens


def test_decode_profile_counts_per_step(tmp_path, tiny_qwen3_dir):
    """The profile's per-step figures are differences of two runs: they must not depend on how many
    steps were measured (the operators of a decode step are the same every step)."""
    from scripts import profile_decode

    def ops(steps: int) -> dict[str, float]:
        args = profile_decode.argparse.Namespace(
            engine="stages.01_naive_generate", model=str(tiny_qwen3_dir), device="cpu", dtype="auto",
            scale=0.1, steps=steps,
        )  # fmt: skip
        metrics, device, dtype = profile_decode.measure(args)
        assert device == "cpu" and dtype == "float32" and "cuda_kernels_per_step" not in metrics
        return metrics

    two, four = ops(2), ops(4)
    assert two["aten_ops_per_step"] == four["aten_ops_per_step"] > 50


def test_final_runs_record_their_kv_cache_and_preemptions(tmp_path, tiny_qwen3_dir):
    """The FP8 cache's measurements (issue 32) read how many tokens final/'s pool held, and how
    often it ran out: four requests of 120-130 tokens do not fit at once in 200."""
    sizes = ["num_requests=4", "min_len=60", "max_len=70", "output_len=60"]
    data = run_bench(tmp_path, tiny_qwen3_dir, "--engine", "final", "--workload", "long-context",
                     *(f"--workload-arg={s}" for s in sizes), "--engine-arg", "num_pages=200",
                     "--engine-arg", "kv_cache_dtype=fp8_e4m3")  # fmt: skip
    assert data["metrics"]["kv_capacity_tokens"] == 200
    assert data["metrics"]["preemptions"] > 0 and data["config"]["kv_cache_dtype"] == "fp8_e4m3"


def test_the_warm_up_samples_as_the_workload_does():
    """A kernel the timed run needs must be compiled before the clock starts: FlashInfer compiles its
    sampling kernels on first use, so the warm-up samples with each kind of params the workload has
    (an H200 offline run read 1,177 tok/s for ~20,000 when only greedy requests warmed it up and a
    kernel compiled inside the timed run)."""
    workload = wl.make_workload("offline", 1000, seed=0, scale=0.05)

    def kind(p):
        return (p.top_k, p.top_p, p.min_p, p.logprobs)

    sampled = list(dict.fromkeys(kind(i.params) for i in workload.items if i.params.temperature > 0))
    assert sampled, "the offline workload samples: nothing to check"
    warm = bench.warmup_workload(1000, workload)
    warm_kinds = {kind(i.params) for i in warm.items if i.params.temperature > 0}
    assert set(sampled[:4]) <= warm_kinds  # the first four kinds, in the workload's order
    assert any(p.temperature == 0 for p in (i.params for i in warm.items))
    assert all(i.params.max_tokens <= 4 for i in warm.items), "a warm-up is short"
    prompts = {tuple(i.prompt_ids[:16]) for i in workload.items}
    assert not any(tuple(i.prompt_ids[:16]) in prompts for i in warm.items), "no radix hit for the timed run"


def test_the_warm_up_prefills_a_prompt_as_long_as_the_workloads_longest_but_not_for_prefill():
    """A batch-1 TTFT is one measurement: a library's first call at a new size must come before the
    clock (an H100's latency run read 342 ms where the prefill workload's median was 14 ms). The
    prefill workload reports its first prompt of each length on purpose and keeps short warm-ups."""
    for name in ("latency", "offline"):
        workload = wl.make_workload(name, 1000, seed=0, scale=0.05)
        longest = max(len(i.prompt_ids) for i in workload.items)
        warm = bench.warmup_workload(1000, workload)
        assert max(len(i.prompt_ids) for i in warm.items) == longest > 16
        assert sum(len(i.prompt_ids) > 16 for i in warm.items) == 1
    prefill = wl.make_workload("prefill", 1000, seed=0, scale=0.05)
    assert max(len(i.prompt_ids) for i in bench.warmup_workload(1000, prefill).items) == 16


def test_a_result_records_the_engine_switches_it_ran_under(monkeypatch):
    """FINAL_* settings in the environment (FINAL_PDL=0 for an A/B, FINAL_PREFILL_GRAPHS, ...) go
    into the result's versions, sorted; none set, no key."""
    from stages.common import hardware

    for key in [k for k in os.environ if k.startswith("FINAL_")]:
        monkeypatch.delenv(key)
    assert "engine_switches" not in hardware.versions()
    monkeypatch.setenv("FINAL_PREFILL_GRAPHS", "65536")
    monkeypatch.setenv("FINAL_PDL", "0")
    monkeypatch.setenv("NOT_FINAL_X", "1")
    assert hardware.versions()["engine_switches"] == "FINAL_PDL=0 FINAL_PREFILL_GRAPHS=65536"
