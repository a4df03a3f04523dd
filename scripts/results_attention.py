"""The attention backends side by side, for docs/serving/attention.md and for `--attn auto`.

    python -m scripts.results_attention benchmarks/results/h200    # which backend wins each phase

`bash scripts/gpu_run.sh bench-attn` measures every `--attn` pair on one GPU at page size 16:
`attn_offline_<pair>_<gpu>.json` (the offline workload), `attn_latency_<pair>_<gpu>.json` (batch-1
decode) and `attn_prefill_<pair>_<gpu>.json` (batch-1 prefill at 512, 2048 and 8192 tokens). Per
GPU, this makes one table of the pairs, one plot, and the winners of each phase:

- prefill: the highest geometric mean over the prompt lengths of prompt tokens per second (the
  median over the pairs that prefill with it: a prefill-only run measures one kernel);
- decode: per decode backend, the batch-1 decode step and the offline throughput (each the median
  over the pairs it decodes in), weighed equally: the geometric mean of each against the best
  backend's (a decode backend serves the lone user and the full batch; neither alone decides);
- offline: the pair with the highest output throughput, both phases together.

The winners are set beside what `auto` picks there: the first candidates of the descriptors'
`Auto` ranks for the compute capability (final/attention/registry.py), to be edited when they differ.
`auto` ranks per compute capability, not per GPU: where two GPUs of one capability were measured
(the H100 and the H200), it follows the one measured last (`auto_basis`), since the newer table ran
the newer engine; the older one's verdict says so instead of asking for a change.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from final.attention.registry import auto_candidates, reference_backend  # (no torch: light)
from scripts.results_model import (
    HEADER,
    Result,
    ResultError,
    device_of,
    device_order,
    format_metric,
    load_results,
)

GROUP = "attn"
WORKLOADS = ("offline", "latency", "prefill")
PAIR_ORDER = ("fi", "fa", "fi,fa", "fa,fi", "fi,trtllm", "fa,trtllm", "trtllm")
PREFILL_METRIC = re.compile(r"^prefill_tok_per_s_(\d+)$")
COMMITS_DIFFER = (
    "The rows were measured at more than one commit of final/ (last column): a change to the engine "
    "between them (a faster decode step, say) moves every backend's figures, not one pair's."
)


@dataclass
class Pair:
    """One `--attn` value on one GPU: the newest result of each workload."""

    spec: str
    results: dict[str, Result]

    @property
    def prefill_backend(self) -> str:
        return self.spec.split(",")[0]

    @property
    def decode_backend(self) -> str:
        return self.spec.split(",")[-1]

    def metric(self, workload: str, name: str) -> float | None:
        result = self.results.get(workload)
        value = result.metrics.get(name) if result else None
        return value if value is not None and math.isfinite(value) and value > 0 else None

    def commits(self) -> str:
        """The commit(s) of final/ its results measured (a row may span two calls)."""
        found = {str(r.versions.get("git_commit", "?"))[:7] for r in self.results.values()}
        return ", ".join(f"`{c}`" for c in sorted(found))

    def prefill_speeds(self) -> dict[int, float]:
        result = self.results.get("prefill")
        found = {
            int(m[1]): v
            for k, v in (result.metrics.items() if result else ())
            if (m := PREFILL_METRIC.match(k))
        }
        return {n: v for n, v in sorted(found.items()) if v > 0}


def pairs_by_device(results: list[Result]) -> dict[str, list[Pair]]:
    found: dict[str, dict[str, dict[str, Result]]] = {}
    for r in results:
        spec = str(r.config.get("attn", ""))
        if r.group != GROUP or r.workload not in WORKLOADS or not spec:
            continue
        slot = found.setdefault(device_of(r), {}).setdefault(spec, {})
        if r.workload not in slot or (r.timestamp, r.name) > (
            slot[r.workload].timestamp,
            slot[r.workload].name,
        ):
            slot[r.workload] = r
    order = {spec: i for i, spec in enumerate(PAIR_ORDER)}
    return {
        device: [
            Pair(s, found[device][s]) for s in sorted(found[device], key=lambda s: (order.get(s, 99), s))
        ]
        for device in sorted(found, key=device_order)
    }


@dataclass
class Winners:
    """Each phase's candidates with their score, the best first."""

    prefill: list[tuple[str, float]]  # backend, geometric mean of prompt tok/s
    decode: list[tuple[str, float]]  # backend, batch-1 decode step in ms; best decode score first
    decode_offline: dict[str, float]  # backend, median offline tok/s of the pairs it decodes in
    offline: list[tuple[str, float]]  # pair, output tok/s
    lengths: list[int]  # the prompt lengths the prefill score averages


def common_lengths(pairs: list[Pair]) -> list[int]:
    measured = [set(p.prefill_speeds()) for p in pairs if p.prefill_speeds()]
    return sorted(set.intersection(*measured)) if measured else []


def winners(pairs: list[Pair]) -> Winners:
    lengths = common_lengths(pairs)
    prefill: dict[str, list[float]] = {}
    decode: dict[str, list[float]] = {}
    decode_offline: dict[str, list[float]] = {}
    for p in pairs:
        speeds = p.prefill_speeds()
        if lengths and all(n in speeds for n in lengths):
            prefill.setdefault(p.prefill_backend, []).append(
                statistics.geometric_mean(speeds[n] for n in lengths)
            )
        if (step := p.metric("latency", "decode_step_ms")) is not None:
            decode.setdefault(p.decode_backend, []).append(step)
        if (tok_s := p.metric("offline", "output_tok_per_s")) is not None:
            decode_offline.setdefault(p.decode_backend, []).append(tok_s)
    offline = [(p.spec, v) for p in pairs if (v := p.metric("offline", "output_tok_per_s")) is not None]
    decode_tok_s = {b: statistics.median(v) for b, v in decode_offline.items()}
    return Winners(
        prefill=sorted(((b, statistics.median(v)) for b, v in prefill.items()), key=lambda x: -x[1]),
        decode=decode_ranking({b: statistics.median(v) for b, v in decode.items()}, decode_tok_s),
        decode_offline=decode_tok_s,
        offline=sorted(offline, key=lambda x: -x[1]),
        lengths=lengths,
    )


def decode_ranking(steps: dict[str, float], offline: dict[str, float]) -> list[tuple[str, float]]:
    """(backend, batch-1 step) by decode score, best first: the geometric mean of the backend's step
    against the shortest and its offline tok/s against the highest (the step alone where a backend
    has no offline run)."""
    shortest, highest = min(steps.values(), default=1.0), max(offline.values(), default=1.0)

    def score(backend: str) -> float:
        parts = [shortest / steps[backend]]
        if backend in offline:
            parts.append(offline[backend] / highest)
        return statistics.geometric_mean(parts)

    return sorted(((b, steps[b]) for b in steps), key=lambda x: (-score(x[0]), x[1]))


def capability_of(pairs: list[Pair]) -> int | None:
    majors = (
        str(r.hardware.get("compute_capability", "")).split(".")[0] for p in pairs for r in p.results.values()
    )
    return next((int(m) for m in majors if m.isdigit()), None)


def measured_at(pairs: list[Pair]) -> str:
    """When this GPU's table was measured: its newest result's timestamp."""
    return max((r.timestamp for p in pairs for r in p.results.values()), default="")


def auto_basis(by_device: dict[str, list[Pair]]) -> dict[int | None, str]:
    """Compute-capability major -> the GPU whose table `auto` follows there: the one measured last."""
    basis: dict[int | None, str] = {}
    for device, pairs in by_device.items():
        major = capability_of(pairs)
        if major not in basis or measured_at(pairs) > measured_at(by_device[basis[major]]):
            basis[major] = device
    return basis


def deferred_to(by_device: dict[str, list[Pair]]) -> dict[str, str | None]:
    """GPU -> the GPU of its compute capability measured after it, whose table `auto` follows
    instead (None: `auto` follows this GPU's own table): each table's `follows` for `verdict`."""
    basis = auto_basis(by_device)
    return {device: None if basis[capability_of(pairs)] == device else basis[capability_of(pairs)]
            for device, pairs in by_device.items()}  # fmt: skip


def verdict(pairs: list[Pair], follows: str | None = None) -> str:
    """What wins each phase here, against what `auto` picks on this GPU. `follows`: the GPU of the
    same compute capability measured after this one, whose table `auto` follows instead."""
    w = winners(pairs)
    major = capability_of(pairs)
    picked = auto_picks(major)  # what auto takes where every library is installed
    best = (w.prefill[0][0] if w.prefill else None, w.decode[0][0] if w.decode else None)
    lengths = ", ".join(map(str, w.lengths))
    parts = []
    if w.prefill:
        parts.append(
            f"fastest prefill `{best[0]}` ({format_metric(w.prefill[0][1])} prompt tok/s, geometric mean over {lengths} tokens)"
        )
    if w.decode:
        offline = w.decode_offline.get(best[1])
        over = f", {format_metric(offline)} tok/s offline over its pairs" if offline else ""
        parts.append(f"best decode `{best[1]}` ({format_metric(w.decode[0][1])} ms a batch-1 step{over})")
    if w.offline:
        parts.append(f"best offline pair `{w.offline[0][0]}` ({format_metric(w.offline[0][1])} tok/s)")
    where = f"compute capability {major}.x" if major is not None else "this GPU"
    agree = all(b is None or b == a for a, b in zip(picked, best, strict=True))
    says = (
        "agrees"
        if agree
        else f"differs: it follows the {follows} table, measured later"
        if follows
        else "does not agree yet: the Auto ranks in final/attention/registry.py are out of date"
    )
    text = "; ".join(parts) + f". `auto` on {where} picks `{_pair(*picked)}`, which {says}."
    return text[:1].upper() + text[1:]


def auto_picks(major: int | None) -> tuple[str, str]:
    """(prefill, decode): the backend `auto` ranks first per phase on a GPU of this major."""
    first = [
        (auto_candidates(phase, major) or [reference_backend()])[0].name for phase in ("prefill", "decode")
    ]
    return first[0], first[1]


def _pair(prefill: str, decode: str) -> str:
    return prefill if prefill == decode else f"{prefill},{decode}"


def render(results: list[Result], plot_link: str) -> str:
    by_device = pairs_by_device(results)
    if not by_device:
        return (
            f"{HEADER}\n\nNo attention benchmarks yet: `bash scripts/gpu_run.sh bench-attn` writes "
            "`benchmarks/results/<gpu>/attn_*.json`, and `make docs-gen` renders them here.\n"
        )
    out = [HEADER, ""]
    follows = deferred_to(by_device)
    for device, pairs in by_device.items():
        lengths = common_lengths(pairs)
        columns = [("offline", "output_tok_per_s", "offline (tok/s)", True),
                   ("latency", "decode_step_ms", "batch-1 decode step (ms)", False),
                   *(("prefill", f"ttft_ms_{n}", f"TTFT {n} (ms)", False) for n in lengths[:1]),
                   *(("prefill", f"prefill_tok_per_s_{n}", f"prefill {n} (tok/s)", True) for n in lengths)]  # fmt: skip
        best = {c[1]: _best([p.metric(c[0], c[1]) for p in pairs], c[3]) for c in columns}
        out += [f"### {device}", "", "| `--attn` | " + " | ".join(c[2] for c in columns) + " | commit |"]
        out.append("| --- |" + " ---: |" * len(columns) + " --- |")
        for p in pairs:
            cells = [_cell(p.metric(c[0], c[1]), best[c[1]]) for c in columns]
            out.append(f"| `{p.spec}` | " + " | ".join(cells) + f" | {p.commits()} |")
        out += ["", verdict(pairs, follows[device]), ""]
        if len({p.commits() for p in pairs}) > 1:
            out += [COMMITS_DIFFER, ""]
    settings = [r.config for ps in by_device.values() for p in ps for r in p.results.values()]
    pages = ", ".join(sorted({str(c.get("page_size", "auto")) for c in settings}))
    prompts = ", ".join(sorted({str(c["per_length"]) for c in settings if "per_length" in c}))
    out += [
        f"Page size {pages}; one fresh process per workload, its warm-up excluded; the prefill columns "
        f"are medians over {prompts or '-'} prompts of each length, served one at a time. Bold: the best "
        "of the column. Every setting, version and command is under *All results* below.",
        "",
        f"![The attention backends: prefill, offline and decode, one row of panels per GPU]({plot_link})",
    ]
    return "\n".join(out) + "\n"


def _best(values: list[float | None], higher: bool) -> float | None:
    present = [v for v in values if v is not None]
    return None if not present else max(present) if higher else min(present)


def _cell(value: float | None, best: float | None) -> str:
    if value is None:
        return "-"
    text = format_metric(value)
    return f"**{text}**" if value == best else text


def plot(results: list[Result], target: Path) -> bool:
    """Per GPU: prefill tok/s by prompt length, offline tok/s, batch-1 decode step. False: nothing to plot."""
    by_device = pairs_by_device(results)
    if not by_device:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from scripts.results_plots import COLORS

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10})
    rows = max(len(pairs) for pairs in by_device.values())
    fig, axes = plt.subplots(
        len(by_device), 3, figsize=(13, 0.9 + 0.45 * rows * len(by_device)), squeeze=False
    )
    for (device, pairs), panel in zip(by_device.items(), axes, strict=True):
        labels = [p.spec for p in pairs]
        lengths = common_lengths(pairs)
        height = 0.8 / max(1, len(lengths))
        for j, n in enumerate(lengths):
            ys = [i + (j - (len(lengths) - 1) / 2) * height for i in range(len(pairs))]
            xs = [p.prefill_speeds().get(n, 0.0) for p in pairs]
            panel[0].barh(ys, xs, height=height * 0.9, color=COLORS[j % len(COLORS)], label=f"{n} tokens")
        if lengths:  # room on the right for the legend, clear of the longest bars
            panel[0].set_xlim(0, max([v for p in pairs for v in p.prefill_speeds().values()] + [1.0]) * 1.6)
            panel[0].legend(loc="center right", fontsize=7)
        _simple(panel[1], [p.metric("offline", "output_tok_per_s") or 0.0 for p in pairs], COLORS[0])
        _simple(panel[2], [p.metric("latency", "decode_step_ms") or 0.0 for p in pairs], COLORS[1])
        titles = ("batch-1 prefill (prompt tok/s)", "offline (output tok/s)", "batch-1 decode step (ms)")
        for ax, title in zip(panel, titles, strict=True):
            ax.set_yticks(range(len(pairs)), labels)
            ax.set_ylim(len(pairs) - 0.5, -0.5)
            ax.set_title(f"{device} · {title}", loc="left", fontweight="bold")
            ax.grid(axis="x", alpha=0.3)
            ax.xaxis.set_major_formatter(
                matplotlib.ticker.FuncFormatter(lambda x, _: f"{x / 1000:g}k" if x >= 1000 else f"{x:g}")
            )
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return True


def _simple(ax, values: list[float], color: str) -> None:
    ax.barh(range(len(values)), values, height=0.6, color=color)
    for i, v in enumerate(values):
        if v:
            ax.annotate(format_metric(v), (v, i), xytext=(3, 0), textcoords="offset points", va="center",
                        fontsize=7)  # fmt: skip
    ax.set_xlim(0, max(values + [1.0]) * 1.3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", type=Path, help="a folder of attn_*.json (e.g. benchmarks/results/h200)")
    args = parser.parse_args(argv)
    try:
        by_device = pairs_by_device(load_results(args.results))
    except ResultError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not by_device:
        print(f"no attn_* results under {args.results}", file=sys.stderr)
        return 1
    follows = deferred_to(by_device)
    for device, pairs in by_device.items():
        w = winners(pairs)
        print(f"{device} (compute capability {capability_of(pairs)}.x)")
        print("  prefill, prompt tok/s (geomean over " + ", ".join(map(str, w.lengths)) + "): "
              + ", ".join(f"{b} {format_metric(v)}" for b, v in w.prefill))  # fmt: skip
        print("  decode, batch-1 step ms (offline tok/s), best score first: " + ", ".join(
            f"{b} {format_metric(v)} ({format_metric(w.decode_offline.get(b, 0))})" for b, v in w.decode))  # fmt: skip
        print("  offline pairs, output tok/s: " + ", ".join(f"{s} {format_metric(v)}" for s, v in w.offline))
        order = (tuple(b for b, _ in w.prefill), tuple(b for b, _ in w.decode))
        print(f"  auto order from these numbers, compute capability {capability_of(pairs)}: {order}")
        print("  " + verdict(pairs, follows[device]).replace("`", ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
