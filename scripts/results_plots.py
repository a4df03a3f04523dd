"""Plots of benchmark results, made to be read: one panel per device and workload (a CPU and an
H200 never share an axis), short row labels, the unit on the axis, a log scale where the values
span more than a factor of `LOG_SPAN`, every bar labelled with its value, and the spread over the
repeats as a whisker when a result kept its runs. Deterministic: the same results give the same
bytes (no timestamps in the PNG)."""

from __future__ import annotations

import math
import re
from pathlib import Path

from scripts.results_ladder import EMPTY, Ladder, step_ups
from scripts.results_model import (
    Result,
    device_of,
    device_order,
    format_metric,
    metric_label,
    metric_names,
    short_label,
    split_unit,
    spread,
)

# What each workload's panel shows: metrics of one unit, side by side. The first that a result has
# decides the unit; metrics of other units are left to the table.
PLOT_METRICS: dict[str, tuple[str, ...]] = {
    "latency": ("decode_step_ms", "ttft_ms"),
    "offline": ("output_tok_per_s",),
    "shared-prefix": ("ttft_ms_p50", "itl_ms_p99"),
    "no-sharing": ("ttft_ms_p50", "itl_ms_p99"),
    "long-prompt": ("short_itl_ms_max", "short_itl_ms_p99", "short_itl_ms_p50", "long_ttft_ms_p50"),
    "online": ("ttft_ms_p50", "ttft_ms_p99", "itl_ms_p50"),
    "decode-profile": ("step_ms", "gpu_busy_ms_per_step"),
    "tp-collectives": ("step_ms", "collective_ms_per_step"),
    "long-context": ("output_tok_per_s",),
    # The FP8 KV cache's (scripts/results_kv_fp8.py has their tables).
    "kv-fp8-accuracy": ("abs_dlogprob_mean", "abs_dlogprob_p99"),
    "kv-capacity": ("kv_tokens",),
    "kv-decode-kernel": tuple(f"us_b64_c16384_{k}" for k in ("bf16", "bf16_tc", "fp8", "fp8_tc")),
    # A full garbage collection per server process before the start-up freeze (after it: 0).
    "gc-freeze": ("api_before_ms", "detokenizer_before_ms", "engine_before_ms"),
    # Where an offline run's time goes (scripts/bench_offline_phases.py): the run's total alone said nothing.
    "offline-phases": ("prefill_s", "decode_s", "tail_s"),
}
# Workloads that get a table but no panel: `startup` times `--help`, which says nothing next to a
# chapter's measurement and took a third of its figure; `versus` holds two engines in one file, so
# a bar per result drew final/'s figure under the file's name ("minisgl"): its table, with both
# engines and their ratio, is on the Performance page.
NO_PANEL = frozenset({"startup", "versus"})
COLORS = ("#3f6fb5", "#e07b39", "#5aa469", "#a05195")
PEER_COLOR = "#8c8c8c"
LOG_SPAN = 20.0


def panel_metrics(workload: str, rows: list[Result]) -> list[str]:
    present = metric_names(rows)
    wanted = [m for m in PLOT_METRICS.get(workload, ()) if m in present] or present[:1]
    if not wanted:
        return []
    unit = split_unit(wanted[0])[1]
    return [m for m in wanted if split_unit(m)[1] == unit]


def panels(results: list[Result]) -> list[tuple[str, str, list[Result], list[str]]]:
    """(device, workload, rows, metrics) of every panel, the CPU's first."""
    keys = sorted({(device_of(r), r.workload) for r in results}, key=lambda k: (device_order(k[0]), k[1]))
    out = []
    for device, workload in keys:
        if workload in NO_PANEL:
            continue
        rows = [r for r in results if device_of(r) == device and r.workload == workload]
        metrics = panel_metrics(workload, rows)
        rows = [r for r in rows if any(_finite(r, m) for m in metrics)]
        if rows and metrics:
            out.append((device, workload, rows, metrics))
    return out


def _finite(result: Result, metric: str) -> bool:
    value = result.metrics.get(metric)
    return value is not None and math.isfinite(value) and value > 0


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 9, "axes.titlesize": 10, "svg.hashsalt": "0"})
    return plt


def _use_log(values: list[float]) -> bool:
    positive = [v for v in values if v > 0]
    return len(positive) > 1 and max(positive) / min(positive) > LOG_SPAN


def _axis_label(unit: str | None, log: bool) -> str:
    return (unit or "value") + (", log scale" if log else "")


def plot_group(group: str, results: list[Result], target: Path) -> None:
    plt = _pyplot()
    chosen = panels(results)
    heights = [1.3 + len(rows) * (0.22 * len(metrics) + 0.2) for _, _, rows, metrics in chosen]
    fig, axes = plt.subplots(
        len(chosen), 1, figsize=(8, sum(heights) + 0.3), squeeze=False, gridspec_kw={"height_ratios": heights}
    )
    for ax, (device, workload, rows, metrics) in zip(axes[:, 0], chosen, strict=True):
        _bars(ax, rows, metrics, metric_color(workload))
        ax.set_title(f"{device} · {workload}", loc="left", fontweight="bold")
    fig.tight_layout()
    _save(fig, target)
    plt.close(fig)


def metric_color(workload: str):
    """A metric's colour, the same in every panel of its workload: by its place in PLOT_METRICS, not
    among the metrics a panel happens to have (an H200 panel without the worst gap drew the p99 in
    the worst gap's blue). A metric the table does not list takes the colour of its place."""
    listed = PLOT_METRICS.get(workload, ())

    def color(metric: str, position: int) -> str:
        return COLORS[(listed.index(metric) if metric in listed else position) % len(COLORS)]

    return color


def variants(rows: list[Result]) -> list[str] | None:
    """Each row's variant, when a one-metric panel compares a switch across sizes: the words of its
    label that are not shared by every row nor hold a number (`decode b64 graphs` -> `graphs`).
    None unless there are 2 to 4 variants and one repeats."""
    words = [short_label(r).split() for r in rows]
    shared = set.intersection(*(set(w) for w in words)) if words else set()
    names = [" ".join(w for w in ws if w not in shared and not re.search(r"\d", w)) for ws in words]
    distinct = list(dict.fromkeys(names))
    if not 2 <= len(distinct) <= len(COLORS) or len(distinct) == len(names) or "" in distinct:
        return None
    return names


def _bars(ax, rows: list[Result], metrics: list[str], color=None) -> None:
    height = 0.8 / len(metrics) if len(metrics) > 1 else 0.55  # one metric: a bar, not a block
    values = [r.metrics[m] for r in rows for m in metrics if _finite(r, m)]
    log = _use_log(values)
    kinds = variants(rows) if len(metrics) == 1 else None
    if kinds is not None:  # one colour per variant (eager, graphs), named in the legend
        _variant_bars(ax, rows, metrics[0], kinds, height, log, values)
        return
    for j, metric in enumerate(metrics):
        ys, xs, errs = [], [], [[], []]
        for i, r in enumerate(rows):
            if not _finite(r, metric):
                continue
            value = r.metrics[metric]
            low, high = spread(r, metric) or (value, value)
            ys.append(i + (j - (len(metrics) - 1) / 2) * height)
            xs.append(value)
            errs[0].append(max(0.0, value - low))
            errs[1].append(max(0.0, high - value))
        label = metric_label(metric).rsplit(" (", 1)[0]
        has_err = any(errs[0]) or any(errs[1])
        bar_color = color(metric, j) if color is not None else COLORS[j % len(COLORS)]
        ax.barh(ys, xs, height=height * 0.9, color=bar_color, label=label,
                xerr=errs if has_err else None, error_kw={"elinewidth": 0.8, "capsize": 2})  # fmt: skip
        for y, x, above in zip(ys, xs, errs[1], strict=True):  # the label right of the whisker
            ax.annotate(
                format_metric(x),
                (x + above, y),
                xytext=(3, 0),
                textcoords="offset points",
                va="center",
                fontsize=7,
            )
    _bar_axis(ax, rows, values, log)
    if len(metrics) == 1:  # one metric: its name and unit ("step (ms)"), not the unit alone
        ax.set_xlabel(metric_label(metrics[0]) + (", log scale" if log else ""))
    else:
        ax.set_xlabel(_axis_label(split_unit(metrics[0])[1], log))
    ax.grid(axis="x", alpha=0.3)
    if len(metrics) > 1:  # beside the axes: inside, "best" still sat on bars (the FP8 kernel panel)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)


def _bar_axis(ax, rows: list[Result], values: list[float], log: bool) -> None:
    """A horizontal bar chart's rows labelled top to bottom, and room right of the longest bar for
    its label (a log axis needs a factor, a linear one a quarter more)."""
    ax.set_yticks(range(len(rows)), [short_label(r) for r in rows])
    ax.invert_yaxis()
    if log:
        ax.set_xscale("log")
        ax.set_xlim(right=max(values) * 8)
    else:
        ax.set_xlim(0, max(values) * 1.25)


def _variant_bars(ax, rows: list[Result], metric: str, kinds: list[str], height: float, log: bool,
                  values: list[float]) -> None:  # fmt: skip
    from matplotlib.patches import Patch

    order = list(dict.fromkeys(kinds))
    for i, (r, kind) in enumerate(zip(rows, kinds, strict=True)):
        if not _finite(r, metric):
            continue
        value = r.metrics[metric]
        low, high = spread(r, metric) or (value, value)
        err = [[value - low], [high - value]] if high > low else None
        color = COLORS[order.index(kind)]
        ax.barh(
            i, value, height=height * 0.9, color=color, xerr=err, error_kw={"elinewidth": 0.8, "capsize": 2}
        )
        ax.annotate(format_metric(value), (max(value, high), i), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=7)  # fmt: skip
    _bar_axis(ax, rows, values, log)
    ax.set_xlabel(metric_label(metric) + (", log scale" if log else ""))
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color=COLORS[k], label=name) for k, name in enumerate(order)], loc="lower right",
              fontsize=7, frameon=True)  # fmt: skip


def plot_ladder(ladders: list[Ladder], target: Path) -> None:
    plt = _pyplot()
    rows_n = max(len(ladder.rungs) for ladder in ladders)
    fig, axes = plt.subplots(
        1, len(ladders), figsize=(7.5 * len(ladders), 0.9 + 0.38 * rows_n), squeeze=False
    )
    for ax, ladder in zip(axes[0], ladders, strict=True):
        values = [r.value for r in ladder.rungs if r.value]
        log = _use_log(values)
        top = max(values) if values else 1.0
        # On a log axis a doubling is a short step: each bar says how much it adds to the one above.
        for i, (rung, (step_up, below)) in enumerate(zip(ladder.rungs, step_ups(ladder), strict=True)):
            if rung.value:
                ax.barh(i, rung.value, color=PEER_COLOR if rung.is_peer else COLORS[0], height=0.7)
                text = format_metric(rung.value) + (
                    f"  ({step_up} {below.removeprefix('stage')})" if step_up else ""
                )
                ax.annotate(text, (rung.value, i), xytext=(3, 0), textcoords="offset points",
                            va="center", fontsize=8)  # fmt: skip
            else:
                ax.annotate(EMPTY, (0.01, i), xycoords=("axes fraction", "data"), va="center", fontsize=8,
                            color="#777777", style="italic")  # fmt: skip
        ax.set_yticks(range(len(ladder.rungs)), [r.title for r in ladder.rungs])
        ax.set_ylim(len(ladder.rungs) - 0.5, -0.5)  # top to bottom, with room for the first and last row
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(values) / 2, top * 8)
        else:
            ax.set_xlim(0, top * 1.3)
        ax.set_xlabel(_axis_label("output tok/s", log))
        ax.set_title(
            f"{ladder.device} · offline workload (grey: reference engines)", loc="left", fontweight="bold"
        )
        ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    _save(fig, target)
    plt.close(fig)


def _save(fig, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110, metadata={"Software": None})
