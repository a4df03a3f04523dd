"""The performance ladder of the results page: the offline workload on one GPU, stage 01, 02, ...,
final/, and the engines we learn from (Mini-SGLang, Nano-vLLM) as reference rows.

Rows are found by pattern, so a new stage joins the ladder by existing: every stage folder gets a
row (empty, "next GPU run", until a result lands), and every full-scale `offline` result on a GPU
whose stage is `NN_name`, `final`, `mini-sglang` or `nano-vllm` can fill one. A result of the
ladder's own step (`make bench-ladder`, names `ladder_*`) wins; otherwise the newest full-scale
offline run of that engine on that GPU stands in (not one of the attention benchmark's, which
vary the backend on purpose, nor a tensor-parallel run or another model's), and its settings are
shown beside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

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
)
from scripts.stage_contract import list_stages

GROUP = "ladder"
WORKLOAD = "offline"
METRIC = "output_tok_per_s"
PEERS = {"mini-sglang": "Mini-SGLang", "nano-vllm": "Nano-vLLM"}
REFERENCE = "mini-sglang"  # the engine the others are compared with, within one device call
SETTINGS = ("attn", "page_size", "max_requests", "cuda_graph_max_bs", "overlap", "tp")
STAGE_RE = re.compile(r"^(\d\d)_")
EMPTY = "next GPU run"
ATTENTION_GROUP = "attn"  # scripts/results_attention.py's: every backend and pair, one run each


@dataclass(frozen=True)
class Rung:
    key: str  # stage01, final, mini-sglang
    title: str  # what the reader sees
    is_peer: bool
    result: Result | None

    @property
    def value(self) -> float | None:
        return self.result.metrics.get(METRIC) if self.result else None


@dataclass(frozen=True)
class Ladder:
    device: str
    rungs: tuple[Rung, ...]


def engine_key(stage: str) -> str | None:
    m = STAGE_RE.match(stage)
    if m:
        return f"stage{m.group(1)}"
    return stage if stage == "final" or stage in PEERS else None


def stage_title(folder: str) -> str:
    """`04_chunked_prefill` -> `04 · chunked prefill`."""
    return f"{folder[:2]} · {folder[3:].replace('_', ' ')}"


def candidates(results: list[Result]) -> list[Result]:
    return [
        r
        for r in results
        if r.workload == WORKLOAD
        and device_of(r) != "CPU"
        and float(r.config.get("scale", 0)) == 1.0
        and r.config.get("kv_cache_dtype", "auto") in ("auto", "bf16")  # one precision on the ladder
        and r.group != ATTENTION_GROUP  # runs that vary the backend on purpose stand in for nothing
        and int(r.config.get("tp", 1)) == 1  # one GPU: tensor parallelism's runs are chapter 07's
        and engine_key(r.stage) is not None
    ]


def same_model(results: list[Result]) -> list[Result]:
    """The runs of the model the ladder's own step ran (a larger model's offline run, measured for
    another chapter, is no rung); every run where the step has not run on that GPU."""
    models = {r.config.get("model") for r in results if r.group == GROUP}
    return [r for r in results if r.config.get("model") in models] if models else results


def pick(results: list[Result]) -> Result | None:
    """The ladder step's own run first, then the newest."""
    if not results:
        return None
    return max(results, key=lambda r: (r.group == GROUP, r.timestamp, r.name))


def build(root: Path, results: list[Result]) -> list[Ladder]:
    """One ladder per GPU model that has a full-scale offline result (or one empty ladder)."""
    usable = candidates(results)
    titles: dict[str, str] = {f"stage{s.name[:2]}": stage_title(s.name) for s in list_stages(root)}
    for r in usable:  # a stage with results but no folder here (yet) still gets its row
        key = engine_key(r.stage)
        if key and key.startswith("stage") and key not in titles:
            titles[key] = stage_title(r.stage) if STAGE_RE.match(r.stage) else r.stage
    order = [*sorted(titles), "final", *PEERS]
    titles |= {"final": "final/", **PEERS}
    devices = sorted({device_of(r) for r in usable}, key=device_order) or ["GPU"]
    ladders = []
    for device in devices:
        rungs = []
        on_device = same_model([r for r in usable if device_of(r) == device])
        for key in order:
            mine = [r for r in on_device if engine_key(r.stage) == key]
            rungs.append(Rung(key, titles[key], key in PEERS, pick(mine)))
        ladders.append(Ladder(device, tuple(rungs)))
    return ladders


def ratio(a: float | None, b: float | None) -> str:
    return format_ratio(a / b) if a and b else ""


def step_ups(ladder: Ladder) -> list[tuple[str, str]]:
    """Each rung's "× the step before" and the key of that step: its value over the last measured
    engine above it (peers are reference rows and never a step); ("", "") where there is none."""
    out: list[tuple[str, str]] = []
    previous: Rung | None = None
    for rung in ladder.rungs:
        measured = not rung.is_peer and rung.value is not None
        out.append((ratio(rung.value, previous.value), previous.key) if measured and previous else ("", ""))
        if measured:
            previous = rung
    return out


def render(ladders: list[Ladder], plot_link: str) -> str:
    out = [HEADER, ""]
    for ladder in ladders:
        out += [f"### {ladder.device} · `{WORKLOAD}`, output tokens per second", ""]
        out += [
            "| Engine | output (tok/s) | × the step before | vs Mini-SGLang, same call | Settings | Result |",
            "| --- | ---: | ---: | ---: | --- | --- |",
        ]
        reference = next((r.result for r in ladder.rungs if r.key == REFERENCE and r.result), None)
        for rung, (step_up, _) in zip(ladder.rungs, step_ups(ladder), strict=True):
            title = f"*{rung.title}* (reference)" if rung.is_peer else rung.title
            if rung.result is None:
                out.append(f"| {title} | {EMPTY} |  |  |  |  |")
                continue
            r = rung.result
            same_call = reference is not None and r.run_id is not None and r.run_id == reference.run_id
            versus = (
                ratio(rung.value, reference.metrics.get(METRIC)) if same_call and not rung.is_peer else ""
            )
            settings = ", ".join(f"{k}={format_value(r.config[k])}" for k in SETTINGS if k in r.config)
            mark = DIRTY_MARK if dirty(r) else ""
            out.append(
                f"| {title} | {format_metric(rung.value or 0)} | {step_up} | {versus} | {settings} | `{r.name}`{mark} |"
            )
        out.append("")
        if any(r.result and dirty(r.result) for r in ladder.rungs):
            out += [DIRTY_NOTE, ""]
    out += [
        "Every row serves the same 256 requests (Nano-vLLM's benchmark: input and output lengths "
        "uniform in [100, 1024], temperature 0.6, `ignore_eos`, seed 0) on one GPU, with the "
        "Qwen3-0.6B-shaped checkpoint in bfloat16. A `max_requests` setting means the row served only "
        "the first requests: stage 01 serves one request at a time, so its throughput does not depend "
        "on how many there are. A ratio to Mini-SGLang is given only for rows measured in the same "
        "device call as Mini-SGLang's (the same `run_id` in their result files): the lent machines "
        f"differ from call to call. Rows saying *{EMPTY}* have no full-scale result yet; "
        f"{code('make bench-ladder')} (or the `ladder` step of `scripts/gpu_run.sh`) fills them all "
        "in one call. On the plot's log scale a doubling is a short step, so each bar also says how "
        "many times the throughput of the last measured stage above it, `(2.00× 04)`, it serves.",
        "",
        f"![The performance ladder: output tokens per second, one panel per GPU]({plot_link})",
        "",
    ]
    while out and not out[-1]:
        out.pop()
    return "\n".join(out) + "\n"
