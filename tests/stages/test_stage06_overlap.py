"""Stage 06 on the CPU: overlap scheduling. The engine launches step N+1 before it processes step
N; engine.py's docstring lists the invariants that keep that correct, and each has a test here:

- overlap on == off, token for token, greedy and seeded, over mixed workloads (radix hits,
  chunked prompts, EOS mid-batch, stop strings, aborts at random steps, preemption), with the
  pool checked after every step and back to its baseline at the end; with the CPU stand-in for
  CUDA graphs too (the graph reads its input tokens from the token table);
- the races other engines hit, by name: a request finishing at step N while N+1 is launched
  (Mini-SGLang #67, #102, PR #89), an abort of a request in flight (PR #111), a preemption of a
  request whose next token is in flight, a prefix-cache insert of a finished request while a new
  request matches it;
- with a simulated GPU that takes time (a clock, no sleeps), the host's work on step N+1 happens
  while step N runs, and the GPU never waits for the host;
- the switch: `--overlap`/`--disable-overlap`, `disable_overlap=True`, STAGE06_DISABLE_OVERLAP=1;
  off by default on the CPU (final/'s --overlap auto).

On a CPU the "device" runs each operation at once, so a step is complete when `launch` returns;
the loop is still the overlapped one: the next step is scheduled and launched before the host has
looked at the tokens of the previous one, which exist only in the token table until `process`.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from stages.common.sampling import SamplingParams
from tests.fixtures.tiny_models import sample_prompts
from tests.stage_list import load

stage06 = load("stages.06_overlap")
engine_module = load("stages.06_overlap.engine")
graph = load("stages.06_overlap.graph")
scheduler_module = load("stages.06_overlap.scheduler")
cli = load("stages.06_overlap.__main__")
page_table_module = load("stages.06_overlap.page_table")
flashinfer_backend = load("stages.06_overlap.attention.flashinfer_backend")
request_module = load("stages.06_overlap.request")


def make(model_dir, overlap: bool, **kwargs):
    return stage06.LLM(str(model_dir), device="cpu", dtype="float32", disable_overlap=not overlap, **kwargs)


def drive(llm, prompts, params, arrivals, aborts=None):
    """Add prompt i at step arrivals[i], abort it at step aborts[i] (if it is still running), check
    the pool after every step. Returns the outputs (None for an aborted request)."""
    aborts = aborts or {}
    rids: dict[int, int] = {}
    outputs: dict[int, object] = {}
    step = 0
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
            assert by_rid[rid] not in outputs, f"request {by_rid[rid]} returned twice, or after its abort"
            outputs[by_rid[rid]] = out
        llm.scheduler.check_integrity()
        step += 1
        assert step < 3000, "no progress"
    return [outputs[i] for i in range(len(prompts))]


def assert_pool_at_baseline(llm) -> None:
    """Nothing runs, nothing retires, every page is free or cached, no cached prefix is locked."""
    sched = llm.scheduler
    assert not llm.has_unfinished() and llm.in_flight is None
    assert not sched.retiring and not sched.retired_pages
    cache, allocator = sched.cache, sched.allocator
    assert cache.evictable_pages == len(cache.all_pages()), "a cache lock was left behind"
    assert allocator.num_free + len(cache.all_pages()) == allocator.num_pages
    assert len(sched.page_table.free_rows) == llm.runner.max_running, "a page-table row leaked"
    sched.check_integrity()


def mixed_workload(model_dir, seed: int):
    """Greedy to a length, seeded sampling, a stop token (EOS mid-batch), stop strings; a shared
    head (radix hits); arrivals over the first 20 steps; three aborts at random steps."""
    rng = random.Random(seed)
    base = sample_prompts(model_dir, n=10, seed=seed)
    head = base[1][:30]
    prompts = base + [head + p[:6] for p in base[2:6]]
    params = []
    for i in range(len(prompts)):
        kind = i % 4
        if kind == 0:
            params.append(SamplingParams(temperature=0, max_tokens=rng.randint(3, 20), ignore_eos=True))
        elif kind == 1:
            params.append(SamplingParams(temperature=0.9, top_k=20, seed=100 * seed + i, max_tokens=15,
                                         ignore_eos=True))  # fmt: skip
        elif kind == 2:  # an EOS the scheduler cannot see coming: a stop token the model emits now and then
            params.append(SamplingParams(temperature=0, max_tokens=25, stop_token_ids=[5, 9, 11, 14]))
        else:
            params.append(SamplingParams(temperature=0.8, seed=i, max_tokens=25, stop=["e", "a"]))
    arrivals = sorted(rng.randint(0, 20) for _ in prompts)
    aborts = {i: arrivals[i] + rng.randint(0, 6) for i in rng.sample(range(len(prompts)), 3)}
    return prompts, params, arrivals, aborts


# --------------------------------------------------------------------------------------------
# Overlap on == overlap off


@pytest.mark.parametrize("seed", [0, 1])
def test_overlap_on_equals_off_over_a_mixed_workload(tiny_qwen3_dir, seed):
    prompts, params, arrivals, aborts = mixed_workload(tiny_qwen3_dir, seed)
    kwargs = dict(page_size=2, num_pages=60, max_prefill_length=11)  # a small pool: preemption
    runs, engines = {}, {}
    for overlap in (False, True):
        llm = make(tiny_qwen3_dir, overlap, **kwargs)
        pending_inputs = count_pending_inputs(llm)
        runs[overlap] = drive(llm, prompts, params, arrivals, aborts)
        assert_pool_at_baseline(llm)
        engines[overlap] = llm
        assert (pending_inputs[0] > 0) == overlap, "with overlap, decode inputs come from the token table"
    assert any(e.scheduler.num_preemptions for e in engines.values()), "the pool should run dry"
    assert max(o.cached_tokens for o in runs[True] if o) >= 30, "the shared head should hit the cache"
    reasons = {o.finish_reason for o in runs[False] if o}
    assert reasons == {"stop", "length"}
    by_string = [
        o for o, p in zip(runs[False], params, strict=True) if o and p.stop and o.finish_reason == "stop"
    ]
    assert by_string, "no request stopped on a stop string"
    for i, (off, on) in enumerate(zip(runs[False], runs[True], strict=True)):
        if i in aborts:
            assert off is None and on is None, "an aborted request was returned"
            continue
        assert on.token_ids == off.token_ids and on.text == off.text, f"request {i}"
        assert on.finish_reason == off.finish_reason


def count_pending_inputs(llm) -> list[int]:
    """Count the inputs the runner reads from the token table (requests with a pending token)."""
    counter = [0]
    forward = llm.runner.forward

    def counting(batch):
        counter[0] += sum(1 for r in batch.requests if r.num_pending)
        return forward(batch)

    llm.runner.forward = counting
    return counter


def test_the_overlapped_loop_schedules_what_the_serial_loop_does(tiny_qwen3_dir):
    """A prompt enters the prefix cache when the step that computes its end is launched, not one
    step later when the host processes it: requests that share a 40-token head and wait a step
    for it hit the cache in the next step either way. With nothing finishing early, the two
    loops run the same batches."""
    base = sample_prompts(tiny_qwen3_dir, n=6, seed=4)
    prompts = [base[1][:40] + p[:5] for p in base] + base[2:5]
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)] * len(prompts)
    arrivals = [0, 0, 0, 1, 4, 4, 5, 5, 9]
    batches, outs = {}, {}
    for overlap in (False, True):
        llm = make(tiny_qwen3_dir, overlap, page_size=2, num_pages=400, max_prefill_length=32)
        batches[overlap] = []
        launch = llm.launch

        def recording_launch(batch, launch=launch, seen=batches[overlap]):
            seen.append([(r.rid, q) for r, q in zip(batch.requests, batch.query_lens, strict=True)])
            return launch(batch)

        llm.launch = recording_launch
        outs[overlap] = drive(llm, prompts, params, arrivals)
    assert batches[True] == batches[False]
    assert [o.cached_tokens for o in outs[True]] == [o.cached_tokens for o in outs[False]]
    assert sum(o.cached_tokens >= 40 for o in outs[True]) >= 4


class CountingGraph(graph.EagerGraph):
    def __init__(self, replays: list[int]):
        super().__init__()
        self.replays = replays

    def replay(self) -> None:
        self.replays[0] += 1
        super().replay()


@pytest.mark.parametrize("budget, num_pages", [(9, 60), (1, 40)])
def test_graph_replay_reads_pending_tokens_from_the_token_table(tiny_qwen3_dir, budget, num_pages):
    """With the CPU stand-in for CUDA graphs: a replayed decode step reads every row's token from
    the token table (pending ones the previous step wrote there; host-known ones, such as a
    prompt's one-token chunk with budget 1, written there first). Tokens and distributions equal
    the eager loop without overlap."""
    base = sample_prompts(tiny_qwen3_dir, n=8, seed=5)
    prompts = base + [base[1][:24] + p[:6] for p in base[2:4]]
    arrivals = [0, 0, 1, 2, 2, 3, 5, 8, 9, 12]
    vocab = 512
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=vocab)] * len(prompts)
    kwargs = dict(page_size=2, num_pages=num_pages, max_prefill_length=budget, max_running_requests=8)
    want = drive(make(tiny_qwen3_dir, False, **kwargs), prompts, params, arrivals)
    llm = make(tiny_qwen3_dir, True, **kwargs)
    replays = [0]
    llm.runner.graphs = graph.GraphRunner(llm.runner, 8, lambda pool: CountingGraph(replays))
    pending_inputs = count_pending_inputs(llm)
    got = drive(llm, prompts, params, arrivals)
    assert replays[0] > 10 and pending_inputs[0] > 10
    assert llm.scheduler.num_preemptions > 0
    assert_pool_at_baseline(llm)
    for w, g in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids
        for a, b in zip(g.logprobs, w.logprobs, strict=True):
            assert a["top_ids"][:3] == b["top_ids"][:3]
            assert a["token_logprob"] == pytest.approx(b["token_logprob"], abs=1e-4)


# --------------------------------------------------------------------------------------------
# The races, by name


def request(llm, rid: int):
    return next(r for r in [*llm.scheduler.running, *llm.scheduler.waiting, *llm.scheduler.retiring]
                if r.rid == rid)  # fmt: skip


def test_a_request_finishing_at_step_n_while_n_plus_1_is_launched(tiny_qwen3_dir):
    """Mini-SGLang #67, #102 and PR #89: a request finished by a token of step N already sits in
    step N+1 (launched before that token was seen). Its token from N+1 is dropped, and its pages,
    row and cache locks stay taken until N+1 is complete."""
    prompt = sample_prompts(tiny_qwen3_dir, n=2, seed=7)[1]
    want = make(tiny_qwen3_dir, False).generate([prompt], SamplingParams(temperature=0, max_tokens=12,
                                                                         ignore_eos=True))[0].token_ids  # fmt: skip
    stop_at = want[4]  # the fifth token is a stop token: EOS, as far as the scheduler can tell
    llm = make(tiny_qwen3_dir, True, page_size=4, num_pages=64)
    rid = llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop_at]))
    finished = []
    while not finished:
        req = request(llm, rid)
        finished = llm.step()
    ((got_rid, out),) = finished
    assert got_rid == rid and out.token_ids == want[: want.index(stop_at) + 1] and out.finish_reason == "stop"
    sched = llm.scheduler
    # The step in flight holds it: its pages, row and cache lock wait for that step.
    assert req in llm.in_flight.requests and req.num_pending == 1
    assert sched.retiring == [req] and req not in sched.running
    assert req.pages and not set(req.pages) & set(sched.allocator.free_pages)
    assert req.row not in sched.page_table.free_rows
    sched.check_integrity()
    assert llm.step() == []  # completes that step: its token for the finished request is dropped
    assert out.token_ids == want[: want.index(stop_at) + 1] and req.num_pending == 0
    assert_pool_at_baseline(llm)


def test_an_abort_of_a_request_in_flight(tiny_qwen3_dir):
    """Mini-SGLang PR #111: an abort of a request the step in flight holds. It leaves at once, its
    token from that step is dropped, its pages wait for the step; a second abort, or an abort of a
    request that has just finished, is a no-op (no double free)."""
    prompts = sample_prompts(tiny_qwen3_dir, n=3, seed=8)
    greedy = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    alone = make(tiny_qwen3_dir, False).generate([prompts[1]], greedy)[0].token_ids
    llm = make(tiny_qwen3_dir, True, page_size=4, num_pages=64)
    a, b = (llm.add_request(p, greedy) for p in prompts[:2])
    short = llm.add_request(prompts[2], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    for _ in range(3):
        llm.step()
    req_a = request(llm, a)
    assert req_a in llm.in_flight.requests and req_a.num_pending == 1
    assert llm.abort(a)
    assert llm.scheduler.retiring == [req_a] and req_a.pages, "its pages must wait for the step in flight"
    assert not llm.abort(a), "a second abort is a no-op"
    llm.scheduler.check_integrity()
    # The short request finishes now, while the next step (which holds it) is launched.
    finished = dict(llm.step())
    assert short in finished and request(llm, short) in llm.scheduler.retiring
    assert not llm.abort(short), "an abort racing a finish frees nothing"
    assert not llm.abort(12345), "an unknown request"
    llm.scheduler.check_integrity()
    outs = {}
    while llm.has_unfinished():
        for rid, out in llm.step():
            assert rid != a, "an aborted request got an output"
            outs[rid] = out
        llm.scheduler.check_integrity()
    assert outs[b].token_ids == alone
    assert_pool_at_baseline(llm)


def test_abort_of_a_waiting_request_frees_nothing(tiny_qwen3_dir):
    llm = make(tiny_qwen3_dir, True, page_size=4, num_pages=64, max_running_requests=1)
    prompts = sample_prompts(tiny_qwen3_dir, n=2, seed=3)
    first, waiting = (llm.add_request(p, SamplingParams(temperature=0, max_tokens=4)) for p in prompts)
    llm.step()
    assert request(llm, waiting) in llm.scheduler.waiting
    assert llm.abort(waiting) and not llm.scheduler.retiring
    while llm.has_unfinished():
        assert all(rid == first for rid, _ in llm.step())
    assert_pool_at_baseline(llm)


def test_an_admission_waits_for_the_row_a_retiring_request_holds(tiny_qwen3_dir):
    """A finished request keeps its page-table row until the step in flight is done, so the
    running count alone does not say a row is free: with one row, the second request is admitted
    only once the first has retired (admitting it earlier took a row from an empty list; an H200
    server under 64 requests a second crashed on it)."""
    prompts = sample_prompts(tiny_qwen3_dir, n=2, seed=7)
    first = make(tiny_qwen3_dir, False).generate([prompts[1]], SamplingParams(temperature=0, max_tokens=12,
                                                                              ignore_eos=True))[0].token_ids  # fmt: skip
    # The first request stops on a token the scheduler cannot see coming, so the step launched
    # before that token was read holds it: it retires only when that step is done.
    params = [SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[first[4]]),
              SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)]  # fmt: skip
    order = [prompts[1], prompts[0]]
    alone = [
        make(tiny_qwen3_dir, False).generate([p], sp)[0].token_ids
        for p, sp in zip(order, params, strict=True)
    ]
    llm = make(tiny_qwen3_dir, True, page_size=4, num_pages=64, max_running_requests=1)
    outs = drive(llm, order, params, arrivals=[0, 0])
    assert [out.token_ids for out in outs] == alone
    assert_pool_at_baseline(llm)


def test_preemption_never_takes_a_request_whose_next_token_is_in_flight(tiny_qwen3_dir):
    """When the pool runs dry with a step in flight, the scheduler raises NeedsDrain; the engine
    completes that step, then preempts. No victim ever has a pending token; outputs equal the
    loop without overlap."""
    prompts = sample_prompts(tiny_qwen3_dir, n=6, seed=9)
    params = [SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)] * len(prompts)
    outs = {}
    for overlap in (False, True):
        llm = make(tiny_qwen3_dir, overlap, page_size=2, num_pages=70)
        sched, drains, victims = llm.scheduler, [0], []
        schedule, preempt = sched.schedule, sched._preempt

        def counting_schedule(can_preempt=True, schedule=schedule, drains=drains):
            try:
                return schedule(can_preempt)
            except scheduler_module.NeedsDrain:
                drains[0] += 1
                raise

        def recording_preempt(req, preempt=preempt, victims=victims, llm=llm, sched=sched):
            if sched.can_preempt:  # a preemption that happens (not one refused with NeedsDrain)
                victims.append((req.num_pending, llm.in_flight))
            return preempt(req)

        sched.schedule, sched._preempt = counting_schedule, recording_preempt
        outs[overlap] = [o.token_ids for o in drive(llm, prompts, params, [0] * len(prompts))]
        assert victims and all(pending == 0 and in_flight is None for pending, in_flight in victims)
        assert (drains[0] > 0) == overlap
        assert_pool_at_baseline(llm)
    assert outs[True] == outs[False]


def test_a_prefix_insert_of_a_finished_request_while_a_new_one_matches_it(tiny_qwen3_dir):
    """A's prompt and answer enter the prefix cache when A finishes, while the next step (which
    still holds A) runs; B, which starts with all of A, arrives right then, is admitted while A
    is retiring, and reuses A's pages. B's tokens are those of an engine without a prefix cache."""
    prompt = sample_prompts(tiny_qwen3_dir, n=2, seed=10)[1]
    greedy = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    want = make(tiny_qwen3_dir, False).generate([prompt], greedy)[0].token_ids
    # A stops on a token (EOS, for the scheduler): a step that holds it is in flight when it finishes.
    a_params = SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[want[6]])
    results = {}
    for overlap, cache in ((False, "naive"), (False, "radix"), (True, "radix")):
        llm = make(tiny_qwen3_dir, overlap, page_size=2, num_pages=200, cache=cache)
        a = llm.add_request(prompt, a_params)
        answer = None
        while answer is None:
            answer = dict(llm.step()).get(a)
        assert answer.token_ids == want[: want.index(want[6]) + 1]
        retiring_at_admission = []
        admit = llm.scheduler._admit

        def recording_admit(req, *args, admit=admit, seen=retiring_at_admission, sched=llm.scheduler):
            seen.append([r.rid for r in sched.retiring])
            return admit(req, *args)

        llm.scheduler._admit = recording_admit
        b = llm.add_request(prompt + answer.token_ids + [7, 8, 9, 10], greedy)
        while llm.has_unfinished():
            results[overlap, cache] = dict(llm.step()).get(b, results.get((overlap, cache)))
            llm.scheduler.check_integrity()
        assert retiring_at_admission == [[a] if overlap else []]
        if cache == "radix":
            assert results[overlap, cache].cached_tokens >= len(prompt) + len(answer.token_ids) - 2
        assert_pool_at_baseline(llm)
    assert (
        results[True, "radix"].token_ids
        == results[False, "radix"].token_ids
        == results[False, "naive"].token_ids
    )


def test_duplicate_pages_dropped_by_a_prefix_insert_wait_for_the_step_in_flight(tiny_qwen3_dir):
    """Two requests with the same short prompt are prefilled in one step, each into its own pages.
    When that step is launched, their prompts enter the prefix cache and the second one switches
    to the first one's pages: its own copies are duplicates, which the step in flight is writing.
    They go back once it is complete."""
    prompt = sample_prompts(tiny_qwen3_dir, n=2, seed=12)[1][:20]  # shorter than MIN_SHARED_TO_WAIT
    llm = make(tiny_qwen3_dir, True, page_size=2, num_pages=64)
    for _ in range(2):
        llm.add_request(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    sched = llm.scheduler
    llm.step()  # launches the prefill of both: the cache takes the prompt
    duplicates = list(sched.retired_pages)
    assert len(duplicates) == len(prompt) // 2, "the second copy of the prompt's pages"
    assert not set(duplicates) & set(sched.allocator.free_pages)
    sched.check_integrity()
    llm.step()  # launches the next step, then processes the prefill: that step is complete
    assert not sched.retired_pages and set(duplicates) <= set(sched.allocator.free_pages)
    while llm.has_unfinished():
        llm.step()
    assert_pool_at_baseline(llm)


# --------------------------------------------------------------------------------------------
# The host works while the GPU runs


class SimulatedGPU:
    """Time as a counter, no sleeps. Launching a step costs the host LAUNCH units (scheduling and
    preparing it) and gives the GPU KERNELS units of work, queued behind what it has; processing a
    step's tokens costs the host PROCESS units once it has waited for them. The GPU's busy time and
    the host's clock come out exact."""

    LAUNCH, PROCESS, KERNELS = 3, 4, 10

    def __init__(self, monkeypatch):
        self.clock = 0  # the host's time
        self.gpu_free_at = 0  # when the GPU finishes everything queued so far
        self.log: list[tuple[str, int]] = []  # (what, step number), in the host's order
        self.gpu_end: list[int] = []  # per step: when the GPU finishes it
        self.processed_at: list[int] = []  # per step: when the host has processed it
        launch, process, wait = (
            engine_module.LLM.launch,
            engine_module.LLM.process,
            engine_module.Launched.wait,
        )
        sim = self

        def timed_launch(llm, batch):
            sim.clock += sim.LAUNCH
            launched = launch(llm, batch)
            start = max(sim.gpu_free_at, sim.clock)
            sim.gpu_free_at = start + sim.KERNELS
            launched.simulated_end = sim.gpu_free_at
            sim.gpu_end.append(sim.gpu_free_at)
            launched.simulated_step = len(sim.gpu_end) - 1
            sim.log.append(("launch", launched.simulated_step))
            return launched

        def timed_wait(launched):
            sim.clock = max(sim.clock, launched.simulated_end)
            return wait(launched)

        def timed_process(llm, launched):
            finished = process(llm, launched)  # waits for the step first
            sim.clock += sim.PROCESS
            sim.log.append(("processed", launched.simulated_step))
            sim.processed_at.append(sim.clock)
            return finished

        monkeypatch.setattr(engine_module.LLM, "launch", timed_launch)
        monkeypatch.setattr(engine_module.LLM, "process", timed_process)
        monkeypatch.setattr(engine_module.Launched, "wait", timed_wait)


def test_the_host_works_on_step_n_plus_1_while_step_n_runs(tiny_qwen3_dir, monkeypatch):
    prompts = sample_prompts(tiny_qwen3_dir, n=4, seed=11)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    sims = {}
    for overlap in (False, True):
        sim = SimulatedGPU(monkeypatch)
        outs = make(tiny_qwen3_dir, overlap).generate(prompts, params)
        assert all(len(o.token_ids) == 16 for o in outs)
        sims[overlap] = sim
        monkeypatch.undo()
    steps = len(sims[False].gpu_end)
    assert steps == len(sims[True].gpu_end) > 10, "ignore_eos: both loops run the same steps"
    host, gpu = SimulatedGPU.LAUNCH + SimulatedGPU.PROCESS, SimulatedGPU.KERNELS
    # Without overlap every step costs the host's time and the GPU's, one after the other: the GPU
    # idles for the host's share of every step.
    assert sims[False].clock == steps * (host + gpu)
    # With overlap the host's share hides behind the GPU's: the GPU idles only before the first
    # launch and after the last step's processing (host < gpu here).
    assert sims[True].clock == SimulatedGPU.LAUNCH + steps * gpu + SimulatedGPU.PROCESS
    # The order itself: step N+1 is launched before step N is processed, and the host is done
    # with step N (tokens appended, stop checks, detokenizing) before the GPU is done with N+1.
    sim = sims[True]
    order = {event: i for i, event in enumerate(sim.log)}
    for n in range(steps - 1):
        assert order["launch", n + 1] < order["processed", n]
        assert sim.processed_at[n] <= sim.gpu_end[n + 1], f"the GPU waited for the host after step {n}"
    assert sims[False].log[:4] == [("launch", 0), ("processed", 0), ("launch", 1), ("processed", 1)]


# --------------------------------------------------------------------------------------------
# No waiting on the launch path (what a CPU can check of it)


def test_page_lists_are_built_without_asking_the_device():
    """Stage 05's pages_of read the largest page count back from the device and selected with a
    boolean mask; stage 06's takes the counts from the host. Same pages, in the same order."""
    torch.manual_seed(0)
    table = page_table_module.PageTable(9, 12, torch.device("cpu"))
    table.table.copy_(torch.randint(0, 500, table.table.shape, dtype=torch.int32))
    rows, counts = torch.tensor([3, 0, 7, 5]), [4, 1, 12, 0]
    want = torch.cat([table.table[r, :n] for r, n in zip(rows.tolist(), counts, strict=True)])
    assert torch.equal(table.pages_of(rows, counts), want)


class FakeEvent:
    def __init__(self, log: list[str]):
        self.log, self.name = log, f"event{sum(e.startswith('record') for e in log) + 1}"

    def record(self) -> None:
        self.log.append(f"record {self.name}")

    def synchronize(self) -> None:
        self.log.append(f"wait {self.name}")


def test_flashinfer_plans_only_after_the_previous_plans_copy(monkeypatch):
    """plan() fills a pinned host buffer and queues its copy: the next plan must wait for an event
    recorded after the previous one (Mini-SGLang PR #103), and for nothing else. A fake wrapper
    and fake events record the order on the CPU."""
    log: list[str] = []
    monkeypatch.setattr(torch.cuda, "Event", lambda: FakeEvent(log))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)  # no CUDA here
    page_size = 4
    table = page_table_module.PageTable(4, 8, torch.device("cpu"))
    table.table[1, :3] = torch.tensor([7, 8, 9], dtype=torch.int32)
    table.table[2, :1] = torch.tensor([5], dtype=torch.int32)
    backend = object.__new__(flashinfer_backend.FlashInferBackend)
    config = SimpleNamespace(num_heads=4, num_kv_heads=2, head_dim=8)
    backend.config, backend.page_table, backend.last_plan = config, table, None
    backend.pool = SimpleNamespace(page_size=page_size, k=torch.zeros(1, dtype=torch.bfloat16))

    class Wrapper:
        def plan(self, indptr, indices, last_page_len, *args, **kwargs):
            log.append("plan")
            self.planned = (indptr.tolist(), indices.tolist(), last_page_len.tolist())

    wrapper = Wrapper()
    batch = request_module.Batch(requests=[], is_prefill=False, query_lens=[1, 1], seq_lens=[10, 3],
                                 sampled=[True, True], rows=torch.tensor([1, 2]))  # fmt: skip
    backend._plan(wrapper, batch)
    assert wrapper.planned == ([0, 3, 4], [7, 8, 9, 5], [2, 3])
    backend._plan(wrapper, batch)
    assert log == ["plan", "record event1", "wait event1", "plan", "record event2"]


# --------------------------------------------------------------------------------------------
# The switch


def test_the_switch(tiny_qwen3_dir, monkeypatch):
    assert make(tiny_qwen3_dir, True).overlap and not make(tiny_qwen3_dir, False).overlap
    # auto, as final/'s --overlap: off on the CPU, where nothing runs asynchronously
    monkeypatch.delenv(engine_module.DISABLE_OVERLAP_ENV, raising=False)
    assert not stage06.LLM(str(tiny_qwen3_dir), device="cpu").overlap
    monkeypatch.setenv(engine_module.DISABLE_OVERLAP_ENV, "1")
    assert not stage06.LLM(str(tiny_qwen3_dir), device="cpu").overlap
    assert stage06.LLM(str(tiny_qwen3_dir), device="cpu", disable_overlap=False).overlap
    monkeypatch.setenv(engine_module.DISABLE_OVERLAP_ENV, "0")
    assert stage06.LLM(str(tiny_qwen3_dir), device="cpu").overlap
    assert cli.parse_args(["--prompt", "a", "--disable-overlap"]).overlap == "off"
    assert cli.parse_args(["--prompt", "a", "--overlap", "on"]).overlap == "on"
    assert cli.parse_args(["--prompt", "a"]).overlap == "auto"
    assert cli.OVERLAP_MODES == {"auto": None, "on": False, "off": True}


def test_the_chapters_schematic_is_up_to_date():
    from scripts import draw_overlap_timeline

    assert draw_overlap_timeline.main(["--check"]) == 0, "run make docs-gen"
