"""final/ against Mini-SGLang, head to head, for the Performance page (docs/serving/performance.md):
the offline workload's output throughput and the batch-1 decode step, each against issue 31's goal.

The best source of a pair is one `versus_minisgl_<gpu>.json` (scripts/bench_versus.py): both engines
measured by the same code in one call, the medians of alternating repeats. Separate results of
the two engines pair too (below), and the newest source wins.

A comparison counts only when both engines ran in the same device call (the same `run_id` in their
result files): the lent machines differ from call to call. So, per GPU and per measure, the pair is
a full-scale result of `final` and one of `mini-sglang` (scripts/bench_peer.py writes those) that
share a `run_id`, the newest such pair winning. Runs with a feature switched off (no CUDA graphs,
overlap off) or tensor parallelism are ablations, not the engine as it serves: they never pair.
Every row says "next GPU run" until its pair exists. The online workload (scripts/bench_server_online.py)
pairs per rate as well: its rows appear once a call has measured both servers at that rate.
"""

from __future__ import annotations

from dataclasses import dataclass

from scripts.results_model import (
    DIRTY_MARK,
    DIRTY_NOTE,
    HEADER,
    Result,
    code,
    device_of,
    device_order,
    dirty,
    format_metric,
    format_ratio,
    format_value,
    server_flags,
)
from scripts.stream_metrics import SMOOTH_MAX_BURSTS as BURST_LIMIT  # issue 27's bound, the streams' too

FINAL, PEER = "final", "mini-sglang"
EMPTY = "next GPU run"
GOAL_DEVICES = ("H100", "H200")  # issue 12 sets its goals on these: their tables show even when empty
SETTINGS = ("attn", "page_size")


@dataclass(frozen=True)
class Measure:
    workload: str
    metric: str
    title: str
    higher_is_better: bool
    goal_on: tuple[str, ...]  # the GPUs the goal is set for
    min_speedup: float | None = None  # the goal as final/'s speed-up over Mini-SGLang
    max_ms: float | None = None  # the goal as a step time final/ must not exceed
    rate: str | None = None  # the online workload's request rate (its results' config["rate"])

    speedup_on: tuple[str, ...] = ()  # GPUs where the goal is a speed-up even though max_ms is set
    unit: str = " ms"  # max_ms's unit in the goal column ("" for a share)
    ours_only: bool = False  # a measure only final/ reports (it needs the engine's clock): no ratio

    def _speedup_goal(self, device: str) -> float | None:
        if self.max_ms is None or device in self.speedup_on:
            return self.min_speedup if self.min_speedup is not None else 1.0
        return None

    def goal(self, device: str) -> str:
        if device not in self.goal_on:
            return "—"
        speedup = self._speedup_goal(device)
        if speedup is not None:
            return f"≥ {speedup:.2f}×"
        return f"≤ {format_metric(self.max_ms or 0)}{self.unit}"

    def met(self, device: str, ours: float, speedup: float) -> str:
        if device not in self.goal_on:
            return ""
        wanted = self._speedup_goal(device)
        if wanted is not None:
            return "met" if speedup >= wanted else "not yet"
        return "met" if self.max_ms is not None and ours <= self.max_ms else "not yet"


# Issue 31's goals: offline throughput at least 1.05x Mini-SGLang's on the H200 and the H100 (the
# must; it aims at 1.15x); the batch-1 decode step (512-token prompt) at most 1.5 ms on the H200
# and no longer than Mini-SGLang's on the H100.
MEASURES = (
    Measure("offline", "output_tok_per_s", "offline (tok/s)", True, GOAL_DEVICES, min_speedup=1.05),
    Measure(
        "latency",
        "decode_step_ms",
        "batch-1 step (ms)",
        False,
        GOAL_DEVICES,
        max_ms=1.5,
        speedup_on=("H100",),
    ),
)
VERSUS_STAGE = "versus"  # scripts/bench_versus.py's results: both engines in one file

# Issue 27's online goals, at the rates gpu_run.sh measures: output throughput at least Mini-SGLang's
# at every rate; TTFT p50 and p99 no worse than its at 32, 64 and saturation (`inf`); smooth
# streams below saturation: at most 5% of a stream's gaps under half the engine's step. ITL p50
# is no goal of its own: a burst of tokens microseconds apart makes it small, not good.
ONLINE_RATES = ("8", "32", "64", "inf")
LOADED_RATES = ("32", "64", "inf")


def _online(metric: str, title: str, rate: str, higher: bool, goal: bool, **kw) -> Measure:
    return Measure("online", metric, f"online {rate} req/s, {title}", higher, GOAL_DEVICES if goal else (), rate=rate, **kw)  # fmt: skip


# Issue 27's smooth-stream line, drawn three ways (scripts/stream_metrics.py): against one median
# decode step for the whole load; against the decode steps around each gap, since a load's batch
# ramps up and down with its arrivals; and the whole load's line over its steady part only (the
# gaps between the running set's filling and the last send, from session 20's calls on). The last
# two need the engine's step times, which Mini-SGLang's server does not report: (metric, title,
# final/ only).
BURST_LINES = (
    ("burst_share_half_step", "gaps < ½ step (share)", False),
    ("burst_share_local_step", "gaps < ½ local step (share)", True),
    ("burst_share_half_decode_step_steady", "gaps < ½ step, steady part (share)", True),
)

ONLINE_MEASURES = tuple(
    m
    for rate in ONLINE_RATES
    for m in (
        _online("output_tok_per_s", "tok/s", rate, True, True, min_speedup=1.0),
        _online("ttft_ms_p50", "TTFT p50 (ms)", rate, False, rate in LOADED_RATES, min_speedup=1.0),
        _online("ttft_ms_p99", "TTFT p99 (ms)", rate, False, rate in LOADED_RATES, min_speedup=1.0),
        *(
            _online(metric, title, rate, False, rate != "inf", max_ms=BURST_LIMIT, unit="", ours_only=ours)
            for metric, title, ours in BURST_LINES
        ),
    )
)


def as_served(result: Result) -> bool:
    """The engine as it serves: full scale, graphs and overlap not switched off, one GPU, a KV cache
    of the model's precision (an FP8 cache is another precision than Mini-SGLang's: issue 32)."""
    config = result.config
    return (
        float(config.get("scale", 1.0)) == 1.0
        and config.get("kv_cache_dtype", "auto") in ("auto", "bf16")
        and config.get("cuda_graph_max_bs") != 0
        and config.get("overlap") not in ("off", False)
        and not config.get("disable_overlap")
        and int(config.get("tp", 1)) == 1
        and not server_flags(config)  # a server started with other flags (--chunk-policy ...)
        # bench_versus --final-attn fi: a kernel-for-kernel comparison, not final/'s default backends
        # (a versus from before that option ran fi, which `auto` then picked: as served)
        and config.get("final_attn", "auto") == "auto"
    )


def usable(results: list[Result], measure: Measure, stage: str, device: str) -> list[Result]:
    needs_metric = not (measure.ours_only and stage == PEER)
    return [
        r
        for r in results
        if r.stage == stage
        and r.workload == measure.workload
        and (measure.metric in r.metrics or not needs_metric)
        and device_of(r) == device
        and r.run_id is not None
        and as_served(r)
        and (measure.rate is None or str(r.config.get("rate")) == measure.rate)
    ]


def pick(results: list[Result]) -> Result:
    """Among several runs of one engine in one call: the ladder step's own run, then the newest."""
    return max(results, key=lambda r: (r.group == "ladder", r.timestamp, r.name))


def pair(results: list[Result], measure: Measure, device: str) -> tuple[Result, Result] | None:
    """(final/'s result, Mini-SGLang's) from the newest device call that has both, or None."""
    ours = usable(results, measure, FINAL, device)
    theirs = usable(results, measure, PEER, device)
    calls = {r.run_id for r in ours} & {r.run_id for r in theirs}
    if not calls:
        return None
    newest = max(calls, key=lambda c: max(r.timestamp for r in theirs if r.run_id == c))
    return (
        pick([r for r in ours if r.run_id == newest]),
        pick([r for r in theirs if r.run_id == newest]),
    )


@dataclass(frozen=True)
class Pair:
    ours: float
    theirs: float | None  # None: a measure only final/ reports
    names: tuple[str, str]  # the result files' names (one for a versus result)
    settings: str
    dirty: tuple[bool, bool]
    timestamp: str


def versus_pair(results: list[Result], measure: Measure, device: str) -> Pair | None:
    """The newest versus result of this GPU that measured the workload, as a pair."""
    keys = (f"{measure.workload}_final", f"{measure.workload}_minisgl")
    found = [
        r
        for r in results
        if r.stage == VERSUS_STAGE and device_of(r) == device and all(k in r.metrics for k in keys)
        and measure.rate is None and as_served(r)
    ]  # fmt: skip
    if not found:
        return None
    r = max(found, key=lambda r: (r.timestamp, r.name))
    attn = r.config.get("final_attn", r.config.get("attn"))  # final/'s backends (older files: one for both)
    settings = f"attn={attn}, page_size={r.config.get('final_page_size')}"
    return Pair(r.metrics[keys[0]], r.metrics[keys[1]], (r.name,), settings, (dirty(r), False), r.timestamp)


def result_pair(results: list[Result], measure: Measure, device: str) -> Pair | None:
    found = pair(results, measure, device)
    if found is None:
        return None
    ours, theirs = found
    settings = ", ".join(f"{k}={format_value(ours.config[k])}" for k in SETTINGS if k in ours.config)
    return Pair(ours.metrics[measure.metric], theirs.metrics.get(measure.metric), (ours.name, theirs.name),
                settings, (dirty(ours), dirty(theirs)), max(ours.timestamp, theirs.timestamp))  # fmt: skip


def best_pair(results: list[Result], measure: Measure, device: str) -> Pair | None:
    """The newest of the versus result and the pair of separate results."""
    found = [p for p in (versus_pair(results, measure, device), result_pair(results, measure, device)) if p]
    return max(found, key=lambda p: p.timestamp) if found else None


def speedup(measure: Measure, ours: float, theirs: float) -> float:
    """Above 1: final/ is ahead (more tokens per second, or a shorter step)."""
    return ours / theirs if measure.higher_is_better else theirs / ours


def devices(results: list[Result]) -> list[str]:
    found = {device_of(r) for r in results if r.stage in (FINAL, PEER) and device_of(r) != "CPU"}
    return sorted(found | set(GOAL_DEVICES), key=device_order)


def render(results: list[Result]) -> str:
    out = [HEADER, ""]
    marked = False
    for device in devices(results):
        out += [f"### {device}", ""]
        out += [
            "| Measure | final/ | Mini-SGLang | speed-up | Goal | Results (settings of final/) |",
            "| --- | ---: | ---: | ---: | --- | --- |",
        ]
        online = [m for m in ONLINE_MEASURES if pair(results, m, device) is not None]
        for measure in (*MEASURES, *online):
            found = best_pair(results, measure, device)
            goal = measure.goal(device)
            if found is None:
                out.append(f"| {measure.title} | {EMPTY} | {EMPTY} |  | {goal} |  |")
                continue
            a, b = found.ours, found.theirs
            ratio = speedup(measure, a, b) if b is not None else None
            met = measure.met(device, a, ratio if ratio is not None else 0.0)
            marks = [DIRTY_MARK if d else "" for d in found.dirty]
            marked = marked or any(marks)
            names = [f"`{name}`{mark}" for name, mark in zip(found.names, marks, strict=False)]
            names[0] += f" ({found.settings})" if found.settings else ""
            out.append(
                f"| {measure.title} | {format_metric(a)} | {'—' if b is None else format_metric(b)} | "
                f"{'—' if ratio is None else format_ratio(ratio)} | "
                f"{goal}{': ' + met if met else ''} | {', '.join(names)} |"
            )
        out.append("")
    out += [
        "Each row pairs final/ with Mini-SGLang measured in the same device call (the same `run_id` "
        "in both result files), on the Qwen3-0.6B-shaped checkpoint in bfloat16; the speed-up is "
        "above 1 when final/ is ahead (more tokens per second, or a shorter step), and the goal says "
        "whether it is met. Runs with CUDA graphs or overlap switched off are ablations and never "
        "pair. A `versus_minisgl_<gpu>` row is one result of "
        f"{code('bash scripts/gpu_run.sh versus')} (scripts/bench_versus.py: both engines through "
        "scripts/bench_peer.py in fresh processes, alternating repeats, the medians); a row saying "
        f"*{EMPTY}* has no pair yet.",
        *(["", DIRTY_NOTE] if marked else []),
    ]
    return "\n".join(out) + "\n"
