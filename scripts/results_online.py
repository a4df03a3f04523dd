"""The online comparison on the Performance page (docs/serving/performance.md, issue 27): final/'s
server against Mini-SGLang's, rate by rate, from one device call, with the ratio of each measure;
final/ under --chunk-policy prefill-first beside it when that call measured it; and a figure of TTFT
and ITL against the rate for every server.

A call is the set of results sharing a `run_id` (scripts/gpu_run.sh's online-policy or
bench-final-online + peers-online). Per GPU and rate the newest call with both servers' online
results at full scale is shown (a session may split the rates over two calls: the caption names
each); nothing typed by hand, and a GPU with no such call says so.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from scripts.results_model import (
    HEADER,
    Result,
    device_of,
    device_order,
    format_metric,
    format_ratio,
    server_flags,
)
from scripts.stream_metrics import SMOOTH_MAX_BURSTS as BURST_LIMIT

FINAL, PEER = "final", "mini-sglang"
PREFILL_FIRST = "--chunk-policy prefill-first"
CATCH_UP = "--stream-catch-up-ms"  # final/'s server with its API process catching up (off by default)
EMPTY = "*No device call has measured both servers online yet: the next GPU run (`scripts/gpu_run.sh online-policy`).*"
# (metric, title, higher is better): the ratio is final/'s speed-up, above 1 when final/ is ahead.
COLUMNS = (
    ("output_tok_per_s", "tok/s", True),
    ("ttft_ms_p50", "TTFT p50 (ms)", False),
    ("ttft_ms_p99", "TTFT p99 (ms)", False),
    ("itl_ms_p50", "ITL p50 (ms)", False),
    ("itl_ms_p99", "ITL p99 (ms)", False),
)
SMOOTH = (  # final/'s own split, and how smooth each server's streams were
    ("step_ms_p50", "engine step (ms)"),
    ("engine_ttft_ms_p50", "first token in the engine p50 (ms)"),  # of the TTFT: door to token
    ("frontend_ms_p50", "engine → client p50 (ms)"),
    ("server_ms_p90", "engine → server's write p90 (ms)"),  # the tail of the server's own part
    ("burst_share_half_step", "gaps < ½ step"),
    ("engine_burst_share", "gaps < ½ step, engine's clock"),  # already short before the frontend
    ("burst_share_half_decode_step", "gaps < ½ decode step"),  # issue 27's line: a decode step's half
    ("burst_share_half_decode_step_steady", "same, steady part"),  # without the ramp and the drain
    ("burst_share_local_step", "gaps < ½ local step"),  # against the step of each gap's moment
    ("burst_share_2ms", "gaps < 2 ms"),
)


def variant(result: Result) -> str | None:
    """Which server a result measured: final/ as it serves, final/ prefill-first, Mini-SGLang."""
    if result.workload != "online" or float(result.config.get("scale", 1.0)) != 1.0 or not result.run_id:
        return None
    if result.stage == PEER:
        return PEER
    if result.stage != FINAL:
        return None
    flags = server_flags(result.config)
    if not flags:
        return FINAL
    if flags == PREFILL_FIRST.split():
        return "prefill-first"
    return "catch-up" if len(flags) == 2 and flags[0] == CATCH_UP else None


def rate_key(rate: str) -> float:
    return float("inf") if rate == "inf" else float(rate)


def newest_call(results: list[Result], device: str) -> dict[str, dict[str, Result]] | None:
    """{variant: {rate: result}} on `device`: per rate, the newest call that measured both servers
    at that rate (a session may measure the rates over two calls; each rate's pair, and final/
    prefill-first beside it, still come from one call). None where no call has both."""
    calls: dict[str, dict[str, dict[str, Result]]] = {}
    for r in results:
        kind = variant(r)
        if kind is not None and device_of(r) == device:
            calls.setdefault(r.run_id or "", {}).setdefault(kind, {})[str(r.config.get("rate"))] = r
    merged: dict[str, dict[str, Result]] = {}
    rates = {rate for call in calls.values() for rate in call.get(FINAL, {})}
    for rate in rates:
        both = [c for c in calls.values() if rate in c.get(FINAL, {}) and rate in c.get(PEER, {})]
        if not both:
            continue
        newest = max(both, key=lambda c: max(kind[rate].timestamp for kind in c.values() if rate in kind))
        for kind, by_rate in newest.items():
            if rate in by_rate:
                merged.setdefault(kind, {})[rate] = by_rate[rate]
    return merged if FINAL in merged else None


def call_caption(call: dict[str, dict[str, Result]], rates: list[str]) -> str:
    """Which device call each rate's pair came from: one call, or the calls with their rates."""
    by_call: dict[str, list[str]] = {}
    for rate in rates:
        by_call.setdefault(call[FINAL][rate].run_id or "", []).append(rate)

    def count(run_id: str) -> str:  # requests a rate: a long load's call sends more than the others
        n = call[FINAL][by_call[run_id][0]].config.get("num_requests")
        return f", {int(n):,} requests a rate" if n else ""

    if len(by_call) == 1:
        run_id = next(iter(by_call))
        return f"One device call (`{run_id}`{count(run_id)})"
    parts = "; ".join(f"`{run_id}`: {', '.join(rs)} req/s{count(run_id)}" for run_id, rs in by_call.items())
    return f"Each rate's pair from one device call ({parts})"


def devices(results: list[Result]) -> list[str]:
    found = {device_of(r) for r in results if variant(r) is not None and device_of(r) != "CPU"}
    return sorted(found, key=device_order)


def _share(value: float) -> str:
    return f"{value:.1%}"


def render(results: list[Result], plot_link: str | None = None) -> str:
    out = [HEADER, ""]
    shown = [d for d in devices(results) if newest_call(results, d) is not None]
    if not shown:
        return "\n".join([*out, EMPTY, ""])
    for device in shown:
        call = newest_call(results, device)
        assert call is not None
        ours, theirs = call[FINAL], call[PEER]
        rates = sorted(set(ours) & set(theirs), key=rate_key)
        out += [
            f"### {device}",
            "",
            f"{call_caption(call, rates)}; the ratio is final/'s speed-up, above 1 when it is ahead.",
            "",
        ]
        head = ["rate (req/s)"] + [f"{title}: final/ · Mini-SGLang · ratio" for _, title, _ in COLUMNS]
        out += ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(COLUMNS)]
        for rate in rates:
            cells = [rate]
            for metric, _, higher in COLUMNS:
                a, b = ours[rate].metrics.get(metric), theirs[rate].metrics.get(metric)
                if a is None or b is None:
                    cells.append("—")
                    continue
                ratio = a / b if higher else b / a
                cells.append(f"{format_metric(a)} · {format_metric(b)} · {format_ratio(ratio)}")
            out.append("| " + " | ".join(cells) + " |")
        out += ["", *_smoothness(call, rates), ""]
    if plot_link:  # one figure, a row of panels per GPU (plot()), so it is shown once, after them all
        where = " and ".join(shown)
        out += [
            f"![TTFT p50 and the share of gaps under half a step (dashed: the 5% goal) against the request rate, {where}]({plot_link})",
            "",
        ]
    return "\n".join(out)


def _smoothness(call: dict[str, dict[str, Result]], rates: list[str]) -> list[str]:
    kinds = [k for k in (FINAL, "prefill-first", "catch-up", PEER) if k in call]
    names = {
        FINAL: "final/",
        "prefill-first": "final/ prefill-first",
        "catch-up": "final/ catching up",
        PEER: "Mini-SGLang",
    }
    head = ["rate (req/s)", "server", "tok/s", "TTFT p50 (ms)", "ITL p50 (ms)", *(t for _, t in SMOOTH)]
    lines = ["| " + " | ".join(head) + " |", "| --- | --- |" + " ---: |" * (len(head) - 2)]
    fmt: dict[str, Callable[[float], str]] = {
        "burst_share_half_step": _share, "burst_share_2ms": _share, "engine_burst_share": _share,
        "burst_share_half_decode_step": _share, "burst_share_local_step": _share,
        "burst_share_half_decode_step_steady": _share,
    }  # fmt: skip
    for rate in rates:
        for kind in kinds:
            r = call[kind].get(rate)
            if r is None:
                continue
            metrics = ("output_tok_per_s", "ttft_ms_p50", "itl_ms_p50", *(m for m, _ in SMOOTH))
            cells = [fmt.get(m, format_metric)(r.metrics[m]) if m in r.metrics else "—" for m in metrics]
            lines.append(f"| {rate} | {names[kind]} | " + " | ".join(cells) + " |")
    return lines


def _few_minor(value: float, _position: int) -> str:
    """A minor tick of a log axis labelled at 2, 3 and 5 times a power of ten, else left bare."""
    mantissa = value / 10 ** math.floor(math.log10(value))
    return f"{value:g}" if round(mantissa, 6) in (2.0, 3.0, 5.0) else ""


def rate_ticks(call: dict[str, dict[str, Result]], rates: list[str]) -> list[str]:
    """Each rate's tick: the rate ("saturation" for inf), and under it the number of requests where
    it is not the most common count of the figure (a long load's rate beside 256-request ones reads
    otherwise as if its queue were the rate's alone)."""
    counts = {rate: next((kind[rate].config.get("num_requests") for kind in call.values() if rate in kind), None)
              for rate in rates}  # fmt: skip
    usual = Counter(counts.values()).most_common(1)[0][0] if counts else None
    ticks = []
    for rate in rates:
        tick = "saturation" if rate == "inf" else rate
        if counts[rate] and counts[rate] != usual:
            tick += f"\n({int(counts[rate]):,} requests)"
        ticks.append(tick)
    return ticks


def plot(results: list[Result], target: Path) -> bool:
    """TTFT p50 and the share of bursts against the rate, a line per server, a row of panels per GPU;
    False (and no file) when no call has both servers. Not ITL p50: a burst of tokens microseconds
    apart makes it small, and a small ITL would read as good."""
    shown = [(d, newest_call(results, d)) for d in devices(results)]
    shown = [(d, c) for d, c in shown if c is not None]
    if not shown:
        return False
    from scripts.results_plots import _pyplot, _save

    plt = _pyplot()
    fig, axes = plt.subplots(len(shown), 2, figsize=(8, 3.0 * len(shown)), squeeze=False)
    styles = {FINAL: ("final/", "#3f6fb5", "o"), "prefill-first": ("final/ prefill-first", "#5aa469", "s"),
              PEER: ("Mini-SGLang", "#8c8c8c", "^")}  # fmt: skip
    for (device, call), row in zip(shown, axes, strict=True):
        panels = (("ttft_ms_p50", "TTFT p50", "ms, log scale", True),
                  ("burst_share_half_step", "gaps under half a step", "share of a stream's gaps", False))  # fmt: skip
        for ax, (metric, title, unit, log) in zip(row, panels, strict=True):
            labels = sorted({rate for kind in call.values() for rate in kind}, key=rate_key)
            for kind, (name, color, marker) in styles.items():
                points = [(i, call[kind][rate].metrics[metric]) for i, rate in enumerate(labels)
                          if kind in call and rate in call[kind] and metric in call[kind][rate].metrics]  # fmt: skip
                if points:
                    ax.plot(*zip(*points, strict=True), marker=marker, color=color, label=name)
            ax.set_xticks(range(len(labels)), rate_ticks(call, labels))
            from matplotlib.ticker import FuncFormatter

            if log:  # plain numbers on the log axis (20, 30, 50, not 2 x 10^1), a few per decade
                ax.set_yscale("log")
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
                ax.yaxis.set_minor_formatter(FuncFormatter(_few_minor))
            else:  # the goal below saturation (issue 27): at most 5% of the gaps
                shares = [y for line in ax.get_lines() for y in line.get_ydata()]
                ax.set_ylim(0, max(2 * BURST_LIMIT, 1.2 * max(shares, default=0)))
                ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.0f}%"))
                ax.axhline(
                    BURST_LIMIT, color="#c0504d", linestyle="--", linewidth=1, label="goal: at most 5%"
                )
            ax.set_xlabel("request rate (req/s)")
            ax.set_ylabel(unit)
            ax.set_title(f"{device} · {title}", loc="left", fontweight="bold")
            ax.grid(alpha=0.3)
        row[0].legend(fontsize=8)
        row[1].legend(handles=row[1].get_lines()[-1:], fontsize=8, loc="upper left")  # the goal's line
    fig.tight_layout()
    _save(fig, target)
    plt.close(fig)
    return True
