"""Render benchmark results (``benchmarks/results/**/*.json``) into docs tables and plots.

    python -m scripts.render_results           # write docs/generated/*results*.md, docs/assets/plots/*.png
    python -m scripts.render_results --check   # exit 1 if the committed markdown is out of date

Every result belongs to a group: its ``name`` up to the first ``_``, ``-`` or ``.``
(``stage01_offline_cpu`` -> ``stage01``). Each group gets

- ``docs/generated/results_<group>.md``: a fragment for a chapter (a page one folder below
  ``docs/``, as ``docs/chapters/01_naive_generate.md``), included under "Measure it";
- ``docs/assets/plots/<group>.png``: its plot, when the group has results.

The performance ladder (``docs/generated/ladder.md`` for the results page) is rendered a second
time for the Performance page one folder below (``performance_ladder.md``, its plot linked from
there), beside final/ against Mini-SGLang in the same device call (``performance_versus.md``,
scripts/results_versus.py) and their servers online, rate by rate (``performance_online.md`` and
its figure, scripts/results_online.py).

Every stage has a group ``stageNN`` (and ``final/`` the groups ``final`` and ``attn``, its attention
backends) even before it has results, so a chapter can always include its fragment. ``docs/generated/all_results.md`` holds every group
for ``docs/results.md``. The schema of a result file is documented in ``benchmarks/README.md``.
Nothing here reads a clock: the same JSON files give the same pages.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts import (
    generated,
    results_attention,
    results_kernels,
    results_kv_fp8,
    results_ladder,
    results_online,
    results_plots,
    results_versus,
)
from scripts.results_model import (  # noqa: F401  (re-exported: the tests and other scripts use them)
    DIRTY_MARK,
    DIRTY_NOTE,
    HEADER,
    Result,
    ResultError,
    cell,
    code,
    config_label,
    device_of,
    device_order,
    dirty,
    environment,
    format_metric,
    format_value,
    group_of,
    key_metrics,
    load_results,
    metric_label,
    metric_names,
    parse_result,
    short_label,
    spread,
    varying_config,
)
from scripts.stage_contract import ROOT, list_stages

RESULTS_DIR = Path("benchmarks/results")
GENERATED_DIR = Path("docs/generated")
PLOTS_DIR = Path("docs/assets/plots")
ALL_RESULTS = GENERATED_DIR / "all_results.md"
LADDER = GENERATED_DIR / "ladder.md"
PERFORMANCE_LADDER = GENERATED_DIR / "performance_ladder.md"  # for docs/serving/performance.md
PERFORMANCE_VERSUS = GENERATED_DIR / "performance_versus.md"
PERFORMANCE_KERNELS = (
    GENERATED_DIR / "performance_kernels.md"
)  # final/ against Mini-SGLang, by kernel category
PERFORMANCE_ONLINE = GENERATED_DIR / "performance_online.md"  # scripts/results_online.py
ONLINE_PLOT = PLOTS_DIR / "performance_online.png"
KERNEL_CHANGES_PLOT = PLOTS_DIR / "kernel_changes.png"  # scripts/results_kernels.py's bar per change
LADDER_PLOT = PLOTS_DIR / "ladder.png"
# The attention page's own table and plot (docs/serving/attention.md; scripts/results_attention.py).
ATTENTION = GENERATED_DIR / "attention_backends.md"
ATTENTION_PLOT = PLOTS_DIR / "attention_backends.png"
# The FP8 KV cache's page (docs/serving/kv_fp8.md; scripts/results_kv_fp8.py).
KV_FP8 = GENERATED_DIR / "kv_fp8.md"


def default_groups(root: Path) -> list[str]:
    groups = [f"stage{stage.name[:2]}" for stage in list_stages(root)]
    if (Path(root) / "final").is_dir():
        groups += ["final", "attn"]  # attn: final/'s attention backends (docs/serving/attention.md)
    return groups


# ---------------------------------------------------------------------------------------------
# Markdown


def key_cell(result: Result, metric: str) -> str:
    if metric not in result.metrics:
        return "-"
    text = format_metric(result.metrics[metric])
    low_high = spread(result, metric)
    if low_high and low_high[0] != low_high[1]:
        text += f" ({format_metric(low_high[0])}–{format_metric(low_high[1])})"
    return text


def table(header: list[str], align: list[str], rows: list[list[str]], indent: str = "") -> list[str]:
    out = ["| " + " | ".join(cell(h) for h in header) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return [indent + line for line in out]


def render_group(group: str, results: list[Result], plot_link: str | None) -> str:
    """The fragment of one group: one table per workload and device, hardware and versions under each."""
    if not results:
        text = (
            f"No benchmark results for `{group}` yet. They appear here once a result file whose name starts "
            f"with `{group}_` is under `benchmarks/results/` (see `benchmarks/README.md`) and "
            "`make docs-gen` has run."
        )
        return f"{HEADER}\n\n{text}\n"
    return "\n".join([HEADER, "", *group_body(results, plot_link, group)]) + "\n"


def table_keys(results: list[Result]) -> list[tuple[str, str]]:
    """(workload, device) of every table, workloads in name order, the CPU before the GPUs."""
    keys = {(r.workload, device_of(r)) for r in results}
    return sorted(keys, key=lambda k: (k[0], device_order(k[1])))


def group_body(results: list[Result], plot_link: str | None, group: str) -> list[str]:
    out: list[str] = []
    for workload, device in table_keys(results):
        rows = [r for r in results if r.workload == workload and device_of(r) == device]
        out += workload_table(workload, device, rows)
    if plot_link and has_plot(results):
        out += [f"![Benchmark results of {group}: one panel per device and workload]({plot_link})", ""]
    while out and not out[-1]:
        out.pop()
    return out


def workload_table(workload: str, device: str, rows: list[Result]) -> list[str]:
    varying, common = varying_config(rows)
    keys = key_metrics(workload, rows)
    spreads = any(r.runs for r in rows)
    # Rows of different days may be different engines (a commit between them): the day is shown.
    dated = len({r.timestamp[:10] for r in rows}) > 1
    out = [f"### {device} · `{workload}`", ""]
    out += table(
        ["Run", *(["measured"] if dated else []), *(metric_label(m) for m in keys)],
        ["---", *(["---"] if dated else []), *(["---:"] * len(keys))],
        [
            [
                short_label(r) + (DIRTY_MARK if dirty(r) else ""),
                *([r.timestamp[:10]] if dated else []),
                *(key_cell(r, m) for m in keys),
            ]
            for r in rows
        ],
    )
    out.append("")
    notes = []
    if dated:
        notes.append(
            "The rows were measured on different days, and the engine may have changed in between: "
            "compare rows of one day."
        )
    if spreads:
        notes.append("Each cell is the median over the repeats, with the lowest and highest in brackets.")
    if varying:
        notes.append("The rows differ in " + ", ".join(code(k) for k in varying) + ".")
    if common:
        notes.append(
            "Every row: " + ", ".join(code(f"{k}={format_value(v)}") for k, v in sorted(common.items())) + "."
        )
    if notes:
        out += [" ".join(notes), ""]
    if any(dirty(r) for r in rows):
        out += [DIRTY_NOTE, ""]
    out += [f'??? note "All metrics, settings and commands ({device}, `{workload}`)"', ""]
    metrics = metric_names(rows)
    header = ["Result", "Stage", *(["Config"] if varying else []), *metrics]
    align = ["---", "---", *(["---"] if varying else []), *(["---:"] * len(metrics))]
    body = []
    for r in rows:
        cells = [f"`{r.name}`", f"`{r.stage}`"]
        if varying:
            cells.append(config_label(r, varying))
        body.append(cells + [format_metric(r.metrics[m]) if m in r.metrics else "-" for m in metrics])
    out += table(header, align, body, indent="    ")
    out.append("")
    envs: dict[str, list[str]] = {}
    for r in rows:
        envs.setdefault(environment(r), []).append(r.name)
    for env, names in envs.items():
        who = "" if len(envs) == 1 else " (" + ", ".join(f"`{n}`" for n in names) + ")"
        out += [f"    Measured on: {env}{who}.", ""]
    out += [f"    - `{r.name}`, {r.timestamp}: {code(r.command)}" for r in rows]
    out.append("")
    return out


def render_all_results(groups: dict[str, list[Result]]) -> str:
    out = [HEADER, ""]
    with_results = [g for g, rs in groups.items() if rs]
    if not with_results:
        out += [
            "No benchmark results yet. Each benchmark run writes a JSON file under `benchmarks/results/` "
            "(schema in `benchmarks/README.md`); `make docs-gen` renders them here.",
        ]
        return "\n".join(out) + "\n"
    for group in with_results:
        out += [f"## `{group}`", "", *group_body(groups[group], f"assets/plots/{group}.png", group), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def has_plot(results: list[Result]) -> bool:
    return bool(results_plots.panels(results))


# ---------------------------------------------------------------------------------------------
# Putting it together


def group_results(root: Path) -> dict[str, list[Result]]:
    """Every group's results; the ladder's own runs are shown by the ladder only."""
    groups: dict[str, list[Result]] = {g: [] for g in default_groups(root)}
    for result in load_results(Path(root) / RESULTS_DIR):
        if result.group != results_ladder.GROUP:
            groups.setdefault(result.group, []).append(result)
    return dict(sorted(groups.items(), key=lambda item: _group_order(item[0])))


def _group_order(group: str) -> tuple[int, str]:
    return (0 if group.startswith("stage") else 1 if group == "final" else 2, group)


def render_markdown(root: Path = ROOT) -> dict[Path, str]:
    """Every markdown page, keyed by its path relative to ``root``."""
    groups = group_results(root)
    pages = {
        GENERATED_DIR / f"results_{group}.md": render_group(
            group, results, f"../assets/plots/{group}.png" if results else None
        )
        for group, results in groups.items()
    }
    pages[ALL_RESULTS] = render_all_results(groups)
    results = load_results(Path(root) / RESULTS_DIR)
    ladder = results_ladder.build(root, results)
    pages[LADDER] = results_ladder.render(ladder, f"assets/plots/{LADDER_PLOT.name}")
    pages[PERFORMANCE_LADDER] = results_ladder.render(ladder, f"../assets/plots/{LADDER_PLOT.name}")
    pages[PERFORMANCE_VERSUS] = results_versus.render(results)
    pages[PERFORMANCE_KERNELS] = results_kernels.render(
        Path(root) / RESULTS_DIR, f"../assets/plots/{KERNEL_CHANGES_PLOT.name}"
    )
    pages[PERFORMANCE_ONLINE] = results_online.render(results, f"../assets/plots/{ONLINE_PLOT.name}")
    if (Path(root) / "final").is_dir():
        pages[ATTENTION] = results_attention.render(results, f"../assets/plots/{ATTENTION_PLOT.name}")
        pages[KV_FP8] = results_kv_fp8.render(results)
    return pages


def stale_files(root: Path = ROOT) -> list[Path]:
    root = Path(root)
    return generated.stale_files(root, render_markdown(root), GENERATED_DIR, "results_*.md")


def write_all(root: Path = ROOT) -> list[str]:
    root = Path(root)
    groups = group_results(root)
    pages = render_markdown(root)
    (root / GENERATED_DIR).mkdir(parents=True, exist_ok=True)
    report = generated.write_files(root, pages)
    plots = {PLOTS_DIR / f"{group}.png": results for group, results in groups.items() if has_plot(results)}
    for path, results in plots.items():
        results_plots.plot_group(path.stem, results, root / path)
        report.append(f"plotted  {path}")
    results_plots.plot_ladder(
        results_ladder.build(root, load_results(root / RESULTS_DIR)), root / LADDER_PLOT
    )
    report.append(f"plotted  {LADDER_PLOT}")
    if ATTENTION in pages and results_attention.plot(load_results(root / RESULTS_DIR), root / ATTENTION_PLOT):
        plots[ATTENTION_PLOT] = []
        report.append(f"plotted  {ATTENTION_PLOT}")
    if results_kernels.plot(root / RESULTS_DIR, root / KERNEL_CHANGES_PLOT):
        plots[KERNEL_CHANGES_PLOT] = []
        report.append(f"plotted  {KERNEL_CHANGES_PLOT}")
    if results_online.plot(load_results(root / RESULTS_DIR), root / ONLINE_PLOT):
        plots[ONLINE_PLOT] = []
        report.append(f"plotted  {ONLINE_PLOT}")
    report += generated.remove_orphans(root, GENERATED_DIR, "results_*.md", pages)
    report += generated.remove_orphans(root, PLOTS_DIR, "*.png", {**plots, LADDER_PLOT: None})
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed markdown is out of date"
    )
    args = parser.parse_args(argv)
    try:
        if args.check:
            stale = stale_files()
            for path in stale:
                print(f"out of date: {path}")
            if stale:
                print("run make docs-gen", file=sys.stderr)
                return 1
            print("result pages are up to date")
            return 0
        for line in write_all():
            print(line)
    except ResultError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
