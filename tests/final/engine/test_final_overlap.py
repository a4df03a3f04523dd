"""final/'s overlap scheduling (engine/core.py), on the CPU: the loop launches step N+1 before it
collects step N. Its invariants are in engine/core.py's docstring; each has a test here:

- overlap on == off, token for token, greedy and seeded, over mixed workloads (radix hits,
  chunked prompts, EOS mid-batch, stop strings, aborts at random steps, preemption), with the
  pool checked after every step and whole at the end;
- the races by name: a request finishing at step N while N+1 is launched, an abort of a request
  in flight, a preemption while a step is in flight, a prefix-cache insert of a finished request
  while a new request matches it;
- with a simulated device that takes time, the host's work really happens while a step runs.
"""

from __future__ import annotations

import random

import pytest

import final
from final.core.sampling_params import SamplingParams
from final.engine import core as core_module
from tests.fixtures.tiny_models import sample_prompts


def make(model_dir, overlap: str, **kwargs) -> final.LLM:
    return final.LLM(str(model_dir), device="cpu", dtype="float32", overlap=overlap, **kwargs)


def drive(llm: final.LLM, prompts, params, arrivals, aborts: dict[int, int]):
    """Add prompt i at step arrivals[i]; abort it at step aborts[i] (if still running); check the
    pool after every step. Returns the outputs (None for aborted ones) and the step count."""
    rids, outputs, step = {}, {}, 0
    while len(outputs) < len(prompts):
        for i, at in enumerate(arrivals):
            if at == step:
                rids[i] = llm.add_request(prompts[i], params[i])
        for i, at in aborts.items():
            if at == step and i in rids and i not in outputs:
                llm.core.abort(rids[i])
                llm.requests.pop(rids[i], None)
                outputs[i] = None
        by_rid = {rid: i for i, rid in rids.items()}
        for rid, out in llm.step():
            outputs[by_rid[rid]] = out
        llm.core.check_integrity()
        step += 1
        assert step < 3000, "no progress"
    while llm.core.has_work():  # a step may still be in flight (aborted requests' last step)
        llm.step()
    llm.core.check_integrity()
    return [outputs[i] for i in range(len(prompts))], step


def assert_pool_whole(llm: final.LLM) -> None:
    core = llm.core
    assert not core.has_work() and not core.scheduler.retiring
    cache = core.kv.prefix_cache
    assert cache.num_cached_pages == cache.evictable_pages, "a lock was left behind"
    assert core.kv.num_free_pages + cache.num_cached_pages == core.kv.num_pages


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_overlap_on_equals_off(tiny_qwen3_dir, seed):
    rng = random.Random(seed)
    base = sample_prompts(tiny_qwen3_dir, n=10, seed=seed)
    head = base[1][:30]
    prompts = base + [head + p[:6] for p in base[2:6]]  # radix hits on a shared head
    params = []
    for i in range(len(prompts)):
        kind = i % 4
        if kind == 0:  # greedy to a length
            params.append(SamplingParams(temperature=0, max_tokens=rng.randint(3, 20), ignore_eos=True))
        elif kind == 1:  # seeded sampling
            params.append(
                SamplingParams(temperature=0.9, top_k=20, seed=seed * 100 + i, max_tokens=15, ignore_eos=True)
            )
        elif kind == 2:  # "EOS" mid-batch: a stop token the model emits now and then
            params.append(SamplingParams(temperature=0, max_tokens=25, stop_token_ids=[5, 9, 11, 14]))
        else:  # a stop string, applied by the frontend (an abort in the engine)
            params.append(SamplingParams(temperature=0.8, seed=i, max_tokens=25, stop=["e", "a"]))
    arrivals = sorted(rng.randint(0, 20) for _ in prompts)
    aborts = {i: arrivals[i] + rng.randint(0, 6) for i in rng.sample(range(len(prompts)), 3)}
    kwargs = dict(page_size=2, num_pages=60, max_prefill_length=11)  # small pool: preemption
    runs = {}
    for overlap in ("off", "on"):
        llm = make(tiny_qwen3_dir, overlap, **kwargs)
        runs[overlap], _ = drive(llm, prompts, params, arrivals, aborts)
        assert_pool_whole(llm)
        runs[overlap + "_preemptions"] = llm.core.scheduler.num_preemptions
    assert runs["on_preemptions"] > 0 or runs["off_preemptions"] > 0, "the pool should run dry"
    for i, (off, on) in enumerate(zip(runs["off"], runs["on"], strict=True)):
        if i in aborts:
            continue  # aborted at the same step, but a step ahead the loops differ in what ran
        assert on.token_ids == off.token_ids and on.text == off.text, f"request {i}"
        assert on.finish_reason == off.finish_reason


def test_a_request_finishing_at_n_while_n_plus_1_runs(tiny_qwen3_dir):
    """It sits in step N+1 (launched before its token was seen): that token is dropped, and its
    pages go back only when N+1 is collected."""
    llm = make(tiny_qwen3_dir, "on", page_size=4, num_pages=64)
    prompt = sample_prompts(tiny_qwen3_dir, n=1, seed=7)[0]
    plain = make(tiny_qwen3_dir, "off", page_size=4, num_pages=64)
    want = plain.generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[
        0
    ].token_ids
    stop_at = want[4]  # the fifth token is a "stop token": EOS, unpredictable to the scheduler
    rid = llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at]))
    core = llm.core
    finished_at = None
    for step in range(40):
        done = llm.step()
        if done:
            finished_at = step
            ((got_rid, out),) = done
            assert got_rid == rid and out.token_ids == want[: want.index(stop_at) + 1]
            assert out.finish_reason == "stop"
            # The next step was launched with the request in it: its pages wait for it.
            assert core.in_flight and core.scheduler.retiring and core.kv.num_free_pages < 64
            break
    assert finished_at is not None
    llm.step()  # collects that step: its token for the finished request is dropped
    assert not core.in_flight and not core.scheduler.retiring
    assert_pool_whole(llm)


def test_an_admission_waits_for_the_row_a_retiring_request_holds(tiny_qwen3_dir):
    """One row (--max-running-requests 1): the first request stops on a token the scheduler cannot
    see coming, so it retires holding its row while the next step runs; the waiting request is
    admitted after that, not into a missing row (an H200 server at 64 requests a second, more than
    256 requests in the engine, stopped on `pop from empty list`)."""
    prompts = sample_prompts(tiny_qwen3_dir, n=2, seed=7)
    plain = make(tiny_qwen3_dir, "off", page_size=4, num_pages=64)
    first = plain.generate([prompts[0]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    params = [
        SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[first.token_ids[4]]),
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
    ]
    want = [plain.generate([p], sp)[0].token_ids for p, sp in zip(prompts, params, strict=True)]
    llm = make(tiny_qwen3_dir, "on", page_size=4, num_pages=64, max_running_requests=1)
    outs, _ = drive(llm, prompts, params, arrivals=[0, 0], aborts={})
    assert [out.token_ids for out in outs] == want
    assert_pool_whole(llm)


def test_abort_of_a_request_in_flight(tiny_qwen3_dir):
    llm = make(tiny_qwen3_dir, "on", page_size=4, num_pages=64)
    prompts = sample_prompts(tiny_qwen3_dir, n=2, seed=8)
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    a, b = (llm.add_request(p, params) for p in prompts)
    for _ in range(4):
        llm.step()
    core = llm.core
    assert core.in_flight, "a step should be in flight between iterations"
    assert core.abort(a)
    llm.requests.pop(a)
    assert core.scheduler.retiring, "its pages must wait for the step in flight"
    assert not core.abort(a), "a second abort is a no-op"
    out = llm.generate([], params)  # nothing new; drain what runs
    assert out == []
    finished = []
    while llm.core.has_work():
        for rid, _ in llm.step():
            assert rid != a, "an aborted request got a token"
            finished.append(rid)
    assert finished == [b]
    assert_pool_whole(llm)


def test_preemption_waits_for_the_step_in_flight(tiny_qwen3_dir):
    """When the pool runs dry with a step in flight, the scheduler asks for a drain (NeedsDrain)
    instead of preempting under the running step; the outputs are those of the plain loop."""
    prompts = sample_prompts(tiny_qwen3_dir, n=6, seed=9)
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * len(prompts)
    outs = {}
    for overlap in ("off", "on"):
        llm = make(tiny_qwen3_dir, overlap, page_size=2, num_pages=70)
        schedule, drains = llm.core.scheduler.schedule, []

        def counting(can_preempt=True, schedule=schedule, drains=drains):
            try:
                return schedule(can_preempt)
            except core_module.NeedsDrain:
                drains.append(1)
                raise

        llm.core.scheduler.schedule = counting
        got, _ = drive(llm, prompts, params, [0] * len(prompts), {})
        outs[overlap] = [o.token_ids for o in got]
        assert llm.core.scheduler.num_preemptions > 0
        assert bool(drains) == (overlap == "on")
        assert_pool_whole(llm)
    assert outs["on"] == outs["off"]


def test_prefix_insert_of_a_finished_request_while_a_new_one_matches_it(tiny_qwen3_dir):
    """A's prompt and answer enter the prefix cache when it finishes, while its next step is in
    flight; B, which starts with all of A, arrives right then and reuses those pages."""
    prompt = sample_prompts(tiny_qwen3_dir, n=2, seed=10)[1]
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    results = {}
    for overlap in ("off", "on"):
        llm = make(tiny_qwen3_dir, overlap, page_size=2, num_pages=200)
        a = llm.add_request(prompt, greedy)
        answer = None
        while answer is None:
            for rid, out in llm.step():
                if rid == a:
                    answer = out
        follow_up = prompt + answer.token_ids + [7, 8, 9, 10]
        b = llm.add_request(follow_up, greedy)
        while llm.has_unfinished():
            for rid, out in llm.step():
                if rid == b:
                    results[overlap] = out
            llm.core.check_integrity()
        assert results[overlap].cached_tokens >= len(prompt) - 2, "B did not reuse A's pages"
        assert_pool_whole(llm)
    assert results["on"].token_ids == results["off"].token_ids


class SimulatedDevice:
    """A device that takes DEVICE time units per step while the host takes HOST units to prepare
    one: launches queue work, a wait advances the host's clock to the work's end. No sleeps: time
    is a counter, so the test is exact."""

    DEVICE, HOST = 10, 4

    def __init__(self, monkeypatch):
        self.clock = 0  # the host's time
        self.device_free = 0  # when the device finishes what it has been given
        self.events: list[str] = []
        launch, wait = core_module.EngineCore.launch, core_module.StepHandle.wait
        sim = self

        def timed_launch(core, batch, *between_layers):
            sim.clock += sim.HOST  # scheduling and preparing the step
            handle = launch(core, batch, *between_layers)
            sim.device_free = max(sim.device_free, sim.clock) + sim.DEVICE
            handle.sim_done = sim.device_free
            sim.events.append(f"launch@{sim.clock}")
            return handle

        def timed_wait(handle):
            sim.clock = max(sim.clock, handle.sim_done)
            sim.events.append(f"wait@{sim.clock}")
            return wait(handle)

        monkeypatch.setattr(core_module.EngineCore, "launch", timed_launch)
        monkeypatch.setattr(core_module.StepHandle, "wait", timed_wait)


def test_host_work_happens_while_a_step_is_in_flight(tiny_qwen3_dir, monkeypatch):
    prompts = sample_prompts(tiny_qwen3_dir, n=4, seed=11)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    totals, orders = {}, {}
    for overlap in ("off", "on"):
        sim = SimulatedDevice(monkeypatch)
        llm = make(tiny_qwen3_dir, overlap)
        llm.generate(prompts, params, progress=False)
        totals[overlap], orders[overlap] = sim.clock, sim.events
        monkeypatch.undo()
    steps = sum(e.startswith("launch") for e in orders["off"])
    assert steps == sum(e.startswith("launch") for e in orders["on"]) and steps > 10
    # Without overlap every step costs host + device time; with it the host's share hides.
    assert totals["off"] == steps * (SimulatedDevice.HOST + SimulatedDevice.DEVICE)
    assert totals["on"] <= steps * SimulatedDevice.DEVICE + 2 * SimulatedDevice.HOST
    # The order itself: overlap launches step N+1 before it waits for step N.
    assert [e.split("@")[0] for e in orders["off"][:4]] == ["launch", "wait", "launch", "wait"]
    assert [e.split("@")[0] for e in orders["on"][:5]] == ["launch", "launch", "wait", "launch", "wait"]
