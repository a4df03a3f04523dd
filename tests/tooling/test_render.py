"""scripts/render_results.py: benchmark JSON in, docs tables and plots out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scripts import render_results as rr
from scripts import results_versus
from tests import ROOT


def result(name: str, **overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": name,
        "stage": "01_naive_generate",
        "workload": "offline",
        "metrics": {"output_tok_per_s": 1234.56, "ttft_ms_p50": 0.0421},
        "config": {"scale": 0.01, "attn": "torch", "device": "cpu"},
        "hardware": {"cpu": "Test CPU 9000", "gpu": None, "cpu_count": 8},
        "versions": {"python": "3.12.3", "torch": "2.11.0", "transformers": "5.17.0"},
        "command": "python -m stages.common.bench stage01 --scale 0.01",
        "timestamp": "2025-01-02T03:04:05Z",
    }
    data.update(overrides)
    return data


def write(root: Path, relative: str, data: Any) -> None:
    path = root / "benchmarks" / "results" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def make_repo(tmp_path: Path, stages: tuple[str, ...] = ("01_naive_generate", "02_paged_kv")) -> Path:
    for name in stages:
        (tmp_path / "stages" / name).mkdir(parents=True)
    return tmp_path


def test_no_results_still_gives_every_page(tmp_path: Path) -> None:
    root = make_repo(tmp_path)
    report = rr.write_all(root)
    generated = root / "docs" / "generated"
    assert sorted(p.name for p in generated.iterdir()) == [
        "all_results.md",
        "ladder.md",
        "performance_kernels.md",
        "performance_ladder.md",
        "performance_online.md",
        "performance_versus.md",
        "results_stage01.md",
        "results_stage02.md",
    ]
    assert "No benchmark results yet" in (generated / "all_results.md").read_text()
    assert "No benchmark results for `stage02` yet" in (generated / "results_stage02.md").read_text()
    # Only the ladder's plot, every row of it saying "next GPU run".
    assert [p.name for p in (root / "docs/assets/plots").iterdir()] == ["ladder.png"]
    assert all(line.startswith(("wrote", "plotted")) for line in report)
    assert rr.stale_files(root) == []


def test_results_are_grouped_by_name_prefix(tmp_path: Path) -> None:
    root = make_repo(tmp_path)
    write(root, "cpu/stage01_offline_cpu.json", result("stage01_offline_cpu"))
    write(
        root, "stage01_offline_bf16.json",
        result("stage01_offline_bf16", config={"scale": 0.01, "attn": "torch", "device": "cpu", "dtype": "bfloat16"},
               metrics={"output_tok_per_s": 99.5, "ttft_ms_p50": 12.0}),
    )  # fmt: skip
    write(
        root, "h200/final-offline.json",
        result("final-offline", stage="final", hardware={"cpu": "Xeon", "gpu": "NVIDIA H200"},
               metrics={"output_tok_per_s": 21000.0}),
    )  # fmt: skip
    rr.write_all(root)
    generated = root / "docs" / "generated"
    stage01 = (generated / "results_stage01.md").read_text()
    final = (generated / "results_final.md").read_text()

    # One table per device and workload, with short row labels and the columns the chapter reads.
    assert "### CPU · `offline`" in stage01
    assert "| Run | output (tok/s) | TTFT p50 (ms) |" in stage01
    assert "| bf16 | 99.50 | 12 |" in stage01
    assert "| stage 01 | 1,235 | 0.0421 |" in stage01
    assert "The rows differ in `dtype`. Every row: `attn=torch`, `device=cpu`, `scale=0.01`." in stage01
    # Everything else behind a collapsed block: full names, config, every metric, where, how.
    assert '??? note "All metrics, settings and commands (CPU, `offline`)"' in stage01
    assert "    | `stage01_offline_bf16` | `01_naive_generate` | dtype=bfloat16 | 99.50 | 12 |" in stage01
    assert (
        "    Measured on: CPU `Test CPU 9000`; no GPU; cpu_count `8`; python `3.12.3`, torch `2.11.0`"
        in stage01
    )
    assert "`python -m stages.common.bench stage01 --scale 0.01`" in stage01
    assert (
        "![Benchmark results of stage01: one panel per device and workload](../assets/plots/stage01.png)"
        in stage01
    )
    assert "final-offline" not in stage01

    assert "### H200 · `offline`" in final and "| final-offline | 21,000 |" in final
    assert "GPU `NVIDIA H200`" in final
    assert "No benchmark results for `stage02` yet" in (generated / "results_stage02.md").read_text()

    everything = (generated / "all_results.md").read_text()
    assert everything.index("## `stage01`") < everything.index("## `final`")
    assert "## `stage02`" not in everything
    assert "(assets/plots/final.png)" in everything

    plots = root / "docs" / "assets" / "plots"
    assert sorted(p.name for p in plots.iterdir()) == ["final.png", "ladder.png", "stage01.png"]
    assert (plots / "stage01.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


def test_cpu_and_gpu_never_share_a_table_or_a_panel(tmp_path: Path) -> None:
    root = make_repo(tmp_path)
    write(root, "a.json", result("stage02_offline_cpu", stage="02_paged_kv"))
    gpu = {"cpu": "Xeon", "gpu": "NVIDIA H200"}
    write(root, "b.json", result("stage02_offline_fi_h200", stage="02_paged_kv", hardware=gpu))
    write(root, "c.json", result("stage02_latency_h200", stage="02_paged_kv", workload="latency", hardware=gpu,
                                 metrics={"decode_step_ms": 22.0, "ttft_ms": 35.0, "total_s": 2.9}))  # fmt: skip
    page = rr.render_markdown(root)[Path("docs/generated/results_stage02.md")]
    cpu, h200 = page.index("### CPU · `offline`"), page.index("### H200 · `offline`")
    assert cpu < h200 and page.index("### H200 · `latency`") < cpu  # workloads by name, CPU first
    assert page[cpu:h200].count("\n| ") == 3 and "| fi |" in page[h200:]
    assert "| Run | decode step (ms) | TTFT (ms) |" in page  # total_s is not a key column of latency
    panels = rr.results_plots.panels(rr.group_results(root)["stage02"])
    assert [(d, w, [r.name for r in rows], m) for d, w, rows, m in panels] == [
        ("CPU", "offline", ["stage02_offline_cpu"], ["output_tok_per_s"]),
        ("H200", "latency", ["stage02_latency_h200"], ["decode_step_ms", "ttft_ms"]),
        ("H200", "offline", ["stage02_offline_fi_h200"], ["output_tok_per_s"]),
    ]


def test_rows_of_different_days_show_their_day(tmp_path: Path) -> None:
    """Two results of one table measured days apart may be two engines (the Metrics page's final/
    rows of 2026-11-23 and 2026-11-25): the table says each row's day; rows of one day do not."""
    root = make_repo(tmp_path)
    write(root, "a.json", result("stage02_offline_cpu", stage="02_paged_kv"))
    write(
        root,
        "b.json",
        result("stage02_offline_serial_cpu", stage="02_paged_kv", timestamp="2025-01-02T09:00:00Z"),
    )
    page = rr.render_markdown(root)[Path("docs/generated/results_stage02.md")]
    assert "| Run | output (tok/s) | TTFT p50 (ms) |" in page and "measured on different days" not in page
    write(
        root,
        "b.json",
        result("stage02_offline_serial_cpu", stage="02_paged_kv", timestamp="2025-01-05T09:00:00Z"),
    )
    page = rr.render_markdown(root)[Path("docs/generated/results_stage02.md")]
    assert "| Run | measured | output (tok/s) | TTFT p50 (ms) |" in page
    assert "| stage 02 | 2025-01-02 | 1,235 |" in page and "| serial | 2025-01-05 | 1,235 |" in page
    assert "measured on different days" in page


def test_repeats_show_their_spread_and_long_prompt_reads_the_worst_gap(tmp_path: Path) -> None:
    root = make_repo(tmp_path, ("04_chunked_prefill",))
    metrics = {
        "short_itl_ms_max": 500.0,
        "short_itl_ms_p999": 480.0,
        "short_itl_ms_p99": 10.0,
        "short_itl_ms_p50": 9.0,
        "long_ttft_ms_p50": 900.0,
        "output_tok_per_s": 50.0,
        "total_s": 3.0,
    }
    runs = [dict(metrics, short_itl_ms_max=v) for v in (450.0, 500.0, 610.0)]  # fmt: skip
    write(root, "x.json", result("stage04_long_prompt_unchunked_cpu", stage="04_chunked_prefill",
                                 workload="long-prompt", metrics=metrics, runs=runs))  # fmt: skip
    page = rr.render_markdown(root)[Path("docs/generated/results_stage04.md")]
    assert ("| Run | short ITL max (ms) | short ITL p99.9 (ms) | short ITL p99 (ms) | short ITL p50 (ms) "
            "| long TTFT p50 (ms) | output (tok/s) |") in page  # fmt: skip
    assert "| unchunked | 500 (450–610) | 480 | 10 | 9 | 900 | 50 |" in page
    assert "median over the repeats, with the lowest and highest in brackets" in page


def test_labels_and_units() -> None:
    assert rr.metric_label("short_itl_ms_max") == "short ITL max (ms)"
    assert rr.metric_label("output_tok_per_s") == "output (tok/s)"
    assert rr.metric_label("total_s") == "total (s)"
    assert rr.metric_label("peak_memory_gb") == "peak memory (GB)"
    assert rr.metric_label("cache_hit_rate") == "cache hit rate"
    assert rr.metric_label("computed_prefill_tokens") == "computed prefill tokens"
    assert rr.metric_label("ttft_ms_p50") == "TTFT p50 (ms)"
    assert rr.metric_label("us_b64_c16384_fp8_tc") == "b64 c16384 fp8 tc (µs)"  # the unit first

    def labelled(name: str, **kw: Any) -> str:
        return rr.short_label(rr.parse_result(result(name, **kw), name))

    gpu = {"cpu": "Xeon", "gpu": "NVIDIA H200"}
    assert (
        labelled("stage04_long_prompt_mixed_2048_h200", workload="long-prompt", hardware=gpu) == "mixed 2048"
    )
    assert labelled("stage01_latency_hf_cpu", workload="latency") == "hf"
    assert labelled("stage01_latency_cpu", workload="latency") == "stage 01"
    assert labelled("final_online_h200_rate16", stage="final", workload="online", hardware=gpu) == "rate16"
    assert labelled("stage01_x_cpu", label="my label") == "my label"


# ---------------------------------------------------------------------------------------------
# The performance ladder


def ladder_result(name: str, stage: str, tok_s: float, **overrides: Any) -> dict[str, Any]:
    return result(name, stage=stage, metrics={"output_tok_per_s": tok_s, "total_s": 1.0},
                  config={"scale": 1.0, "attn": "fi", "device": "cuda"},
                  hardware={"cpu": "Xeon", "gpu": "NVIDIA H200"}, **overrides)  # fmt: skip


def test_the_ladder_has_a_row_per_stage_and_peer_and_says_what_is_missing(tmp_path: Path) -> None:
    root = make_repo(tmp_path, ("01_naive_generate", "02_paged_kv", "03_radix_cache"))
    write(root, "h200/a.json", ladder_result("stage02_offline_fi_h200", "02_paged_kv", 5000.0))
    write(root, "h200/b.json", ladder_result("ladder_stage02_h200", "02_paged_kv", 6000.0, run_id="c1"))
    write(root, "h200/c.json", ladder_result("ladder_final_h200", "final", 9000.0, run_id="c1"))
    write(root, "h200/d.json", ladder_result("ladder_minisgl_h200", "mini-sglang", 18000.0, run_id="c1"))
    write(root, "h200/e.json", ladder_result("ladder_stage03_h200", "03_radix_cache", 7500.0, run_id="c0"))
    small = ladder_result("stage01_offline_h200", "01_naive_generate", 45.0)
    small["config"]["scale"] = 0.25  # not the ladder's workload
    write(root, "h200/f.json", small)
    write(root, "g.json", result("stage02_offline_cpu", stage="02_paged_kv"))  # a CPU row is no rung
    page = rr.render_markdown(root)[Path("docs/generated/ladder.md")]
    rows = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0] for row in rows] == [
        "| 01 · naive generate", "| 02 · paged kv", "| 03 · radix cache", "| final/",
        "| *Mini-SGLang* (reference)", "| *Nano-vLLM* (reference)",
    ]  # fmt: skip
    assert rows[0] == "| 01 · naive generate | next GPU run |  |  |  |  |"
    assert rows[1].startswith("| 02 · paged kv | 6,000 |  | 0.33× |")  # the ladder's own run wins
    assert rows[2].startswith("| 03 · radix cache | 7,500 | 1.25× |  |")  # another call: no ratio to the peer
    assert rows[3].startswith("| final/ | 9,000 | 1.20× | 0.50× |")
    assert rows[4].startswith("| *Mini-SGLang* (reference) | 18,000 |  |  |")
    assert "next GPU run" in rows[5]
    # The ladder's own files stay off the other pages.
    assert "ladder_final_h200" not in rr.render_markdown(root)[Path("docs/generated/all_results.md")]
    rr.write_all(root)
    assert (root / "docs/assets/plots/ladder.png").read_bytes().startswith(b"\x89PNG")


def test_an_attention_benchmark_run_never_stands_in_for_final_on_the_ladder(tmp_path: Path) -> None:
    root = make_repo(tmp_path)
    write(
        root,
        "h100/a.json",
        ladder_result("kv_offline_bf16_h100", "final", 9000.0, timestamp="2025-01-02T00:00:00Z"),
    )
    newer = ladder_result("attn_offline_fi-trtllm_h100", "final", 8000.0, timestamp="2025-01-03T00:00:00Z")
    write(root, "h100/b.json", newer)
    page = rr.render_markdown(root)[Path("docs/generated/ladder.md")]
    final_row = next(line for line in page.splitlines() if line.startswith("| final/"))
    assert "9,000" in final_row and "attn_offline" not in final_row


def test_the_performance_page_shows_the_same_ladder_with_its_plot_one_folder_down(tmp_path: Path) -> None:
    root = make_repo(tmp_path)
    write(root, "h200/c.json", ladder_result("ladder_final_h200", "final", 9000.0, run_id="c1"))
    pages = rr.render_markdown(root)
    ladder = pages[Path("docs/generated/ladder.md")]
    nested = pages[Path("docs/generated/performance_ladder.md")]
    assert "](assets/plots/ladder.png)" in ladder and "](../assets/plots/ladder.png)" in nested
    assert nested == ladder.replace("](assets/plots/ladder.png)", "](../assets/plots/ladder.png)")


def versus_result(
    name: str, stage: str, workload: str, metric: str, value: float, run_id: str | None,
    gpu: str = "NVIDIA H200", timestamp: str = "2026-01-01T00:00:00Z", **config: Any,
) -> dict[str, Any]:  # fmt: skip
    return result(name, stage=stage, workload=workload, metrics={metric: value}, run_id=run_id,
                  config={"scale": 1.0, "attn": "fi", "device": "cuda", **config},
                  hardware={"cpu": "Xeon", "gpu": gpu}, timestamp=timestamp)  # fmt: skip


def test_final_meets_mini_sglang_only_within_one_device_call(tmp_path: Path) -> None:
    root = make_repo(tmp_path)
    tok, ms = "output_tok_per_s", "decode_step_ms"
    for i, data in enumerate([
        # H200, one call: offline behind, batch-1 ahead; the ablation (graphs off) never pairs
        versus_result("ladder_final_h200", "final", "offline", tok, 9000.0, "c1"),
        versus_result("ladder_minisgl_h200", "mini-sglang", "offline", tok, 18000.0, "c1"),
        versus_result("final_latency_fi_h200", "final", "latency", ms, 1.2, "c1"),
        versus_result("final_latency_eager_h200", "final", "latency", ms, 0.5, "c1",
                      timestamp="2026-02-01T00:00:00Z", cuda_graph_max_bs=0),
        versus_result("minisgl_latency_h200", "mini-sglang", "latency", ms, 1.8, "c1"),
        # H100: final and Mini-SGLang of different calls do not pair; the newest common call wins
        versus_result("final_offline_h100", "final", "offline", tok, 30000.0, "c2", "NVIDIA H100"),
        versus_result("minisgl_offline_h100", "mini-sglang", "offline", tok, 10000.0, "c3", "NVIDIA H100"),
        versus_result("old_final_h100", "final", "offline", tok, 11500.0, "c0", "NVIDIA H100"),
        versus_result("old_minisgl_h100", "mini-sglang", "offline", tok, 10000.0, "c0", "NVIDIA H100",
                      timestamp="2025-06-01T00:00:00Z"),
        versus_result("new_final_h100", "final", "offline", tok, 10000.0, "c4", "NVIDIA H100"),
        versus_result("new_minisgl_h100", "mini-sglang", "offline", tok, 12500.0, "c4", "NVIDIA H100",
                      timestamp="2026-06-01T00:00:00Z"),
        # a scaled-down run is not the workload
        versus_result("small_final_h100", "final", "latency", ms, 0.1, "c4", "NVIDIA H100", scale=0.1),
        versus_result("small_minisgl_h100", "mini-sglang", "latency", ms, 0.2, "c4", "NVIDIA H100"),
    ]):  # fmt: skip
        write(root, f"{i}.json", data)
    page = rr.render_markdown(root)[Path("docs/generated/performance_versus.md")]
    h100, h200 = page.split("### H100")[1].split("### H200")
    rows = table_rows(h200)
    assert rows["offline (tok/s)"][:4] == ["9,000", "18,000", "0.50×", "≥ 1.05×: not yet"]
    assert rows["batch-1 step (ms)"][:4] == ["1.20", "1.80", "1.50×", "≤ 1.50 ms: met"]
    assert "`final_latency_fi_h200` (attn=fi), `minisgl_latency_h200`" in h200 and "eager" not in h200
    rows = table_rows(h100)
    assert rows["offline (tok/s)"][:4] == ["10,000", "12,500", "0.80×", "≥ 1.05×: not yet"]
    assert rows["batch-1 step (ms)"][:4] == ["next GPU run", "next GPU run", "", "≥ 1.00×"]


def test_a_versus_result_pairs_by_itself_and_the_newest_source_wins(tmp_path: Path) -> None:
    """scripts/bench_versus.py's one file holds both engines; it wins over an older pair of separate
    results of the same GPU, and loses to a newer one."""
    root = make_repo(tmp_path)
    tok, ms = "output_tok_per_s", "decode_step_ms"
    metrics = {
        "offline_final": 21000.0,
        "offline_minisgl": 20000.0,
        "latency_final": 1.4,
        "latency_minisgl": 1.75,
    }
    write(root, "v.json", result("versus_minisgl_h200", stage="versus", workload="versus", metrics=metrics,
                                 run_id="c9", config={"attn": "fi", "final_page_size": 16, "scale": 1.0},
                                 hardware={"cpu": "Xeon", "gpu": "NVIDIA H200"}, timestamp="2026-03-01T00:00:00Z"))  # fmt: skip
    write(root, "a.json", versus_result("final_old_h200", "final", "offline", tok, 9000.0, "c1"))
    write(root, "b.json", versus_result("minisgl_old_h200", "mini-sglang", "offline", tok, 18000.0, "c1"))
    write(root, "c.json", versus_result("final_new_h200", "final", "latency", ms, 2.0, "c2", timestamp="2026-04-01T00:00:00Z"))  # fmt: skip
    write(root, "d.json", versus_result("minisgl_new_h200", "mini-sglang", "latency", ms, 1.0, "c2", timestamp="2026-04-01T00:00:00Z"))  # fmt: skip
    page = rr.render_markdown(root)[Path("docs/generated/performance_versus.md")]
    rows = table_rows(page.split("### H200")[1])
    assert rows["offline (tok/s)"][:4] == ["21,000", "20,000", "1.05×", "≥ 1.05×: met"]
    assert "`versus_minisgl_h200` (attn=fi, page_size=16)" in rows["offline (tok/s)"][4]
    assert rows["batch-1 step (ms)"][:4] == ["2", "1", "0.50×", "≤ 1.50 ms: not yet"]  # the newer pair
    # A newer versus with final/ on Mini-SGLang's backend (`--final-attn fi`) is no "as served" row.
    parity = {"attn": "fi", "final_attn": "fi", "final_page_size": 16, "scale": 1.0}
    write(root, "w.json", result("versus_minisgl_fi_h200", stage="versus", workload="versus", run_id="c10",
                                 metrics=metrics | {"offline_final": 1.0}, config=parity,
                                 hardware={"cpu": "Xeon", "gpu": "NVIDIA H200"}, timestamp="2026-05-01T00:00:00Z"))  # fmt: skip
    page = rr.render_markdown(root)[Path("docs/generated/performance_versus.md")]
    assert table_rows(page.split("### H200")[1])["offline (tok/s)"][0] == "21,000"


def table_rows(section: str) -> dict[str, list[str]]:
    """A markdown table's rows by their first cell: the other cells, stripped."""
    rows = [
        [c.strip() for c in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ")
    ]
    return {row[0]: row[1:] for row in rows}


def test_the_goals_are_issue_31s() -> None:
    offline, batch1 = results_versus.MEASURES
    assert offline.met("H100", 0.0, 1.05) == "met" and offline.met("H200", 0.0, 1.04) == "not yet"
    assert batch1.met("H200", 1.5, 0.0) == "met" and batch1.met("H200", 1.51, 9.0) == "not yet"
    assert batch1.goal("H100") == "≥ 1.00×" and batch1.met("H100", 9.0, 1.0) == "met"
    assert batch1.met("H100", 0.1, 0.99) == "not yet"  # the H100's goal is Mini-SGLang's own step


def test_the_performance_page_has_both_goal_gpus_before_any_result(tmp_path: Path) -> None:
    page = rr.render_markdown(make_repo(tmp_path))[Path("docs/generated/performance_versus.md")]
    assert page.index("### H100") < page.index("### H200")
    assert page.count("| next GPU run | next GPU run |") == 4


def test_a_new_stage_joins_the_ladder_by_existing(tmp_path: Path) -> None:
    root = make_repo(tmp_path, ("01_naive_generate", "05_cuda_graph"))
    page = rr.render_markdown(root)[Path("docs/generated/ladder.md")]
    assert "### GPU · `offline`" in page  # no GPU result at all yet: one empty ladder
    assert "| 05 · cuda graph | next GPU run |" in page


def test_rendering_is_deterministic(tmp_path: Path) -> None:
    root = make_repo(tmp_path)
    write(root, "b.json", result("stage02_b", stage="02_paged_kv"))
    write(root, "a.json", result("stage02_a", stage="02_paged_kv", workload="shared-prefix"))
    first = rr.render_markdown(root)
    rr.write_all(root)
    png = (root / "docs/assets/plots/stage02.png").read_bytes()
    rr.write_all(root)
    assert rr.render_markdown(root) == first
    assert (root / "docs/assets/plots/stage02.png").read_bytes() == png
    assert rr.stale_files(root) == []


def test_stale_pages_are_reported_and_removed(tmp_path: Path) -> None:
    root = make_repo(tmp_path)
    write(root, "x.json", result("stage09_x"))
    rr.write_all(root)
    assert (root / "docs/generated/results_stage09.md").is_file()
    (root / "benchmarks/results/x.json").unlink()
    assert rr.stale_files(root) == [
        Path("docs/generated/all_results.md"),
        Path("docs/generated/results_stage09.md"),
    ]
    report = rr.write_all(root)
    assert "removed  docs/generated/results_stage09.md" in report
    assert "removed  docs/assets/plots/stage09.png" in report
    assert rr.stale_files(root) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"metrics": {"tok_per_s": "fast"}}, "metric 'tok_per_s' must be a number"),
        ({"metrics": {"ok": True}}, "metric 'ok' must be a number"),
        ({"hardware": {"cpu": "x"}}, "hardware needs 'gpu'"),
        ({"command": ["python", "-m"]}, "'command' must be a JSON str"),
        ({"name": "_x"}, "must start with letters or digits"),
    ],
)
def test_bad_result_files_get_a_clear_error(tmp_path: Path, change: dict, message: str) -> None:
    root = make_repo(tmp_path)
    write(root, "bad.json", {**result("stage01_bad"), **change})
    with pytest.raises(rr.ResultError, match=message) as info:
        rr.render_markdown(root)
    assert str(info.value).startswith("bad.json:")


def test_missing_key_and_broken_json(tmp_path: Path) -> None:
    root = make_repo(tmp_path)
    data = result("stage01_x")
    del data["versions"]
    write(root, "a.json", data)
    with pytest.raises(rr.ResultError, match="a.json: missing key 'versions'"):
        rr.load_results(root / "benchmarks/results")
    (root / "benchmarks/results/a.json").write_text("{not json")
    with pytest.raises(rr.ResultError, match="a.json: not valid JSON"):
        rr.load_results(root / "benchmarks/results")


def test_formatting_helpers() -> None:
    assert rr.group_of("stage01_offline") == "stage01"
    assert rr.group_of("final-online.h200") == "final"
    assert [rr.format_metric(v) for v in (16543.2, 123.45, 1.6789, 0.0, 0.01234, float("nan"), 7.0)] == [
        "16,543", "123.5", "1.68", "0", "0.0123", "n/a", "7",
    ]  # fmt: skip
    assert rr.code("a`b") == "`` a`b ``"
    assert rr.cell("a|b") == "a\\|b"


def test_committed_result_pages_are_up_to_date() -> None:
    stale = rr.stale_files(ROOT)
    assert not stale, f"out of date: {', '.join(map(str, stale))}; run make docs-gen"


def test_the_committed_sketches_are_up_to_date() -> None:
    """Chapter 05's launches and chapter 07's two ranks are drawn by scripts/draw_sketches.py."""
    from scripts import draw_sketches

    assert draw_sketches.main(["--check"]) == 0, "run python -m scripts.draw_sketches"


def test_a_versus_file_gets_its_table_but_no_bar_under_the_peers_name(tmp_path: Path) -> None:
    """A versus file holds both engines: one bar per result would draw final/'s offline figure
    labelled with the file's name ("minisgl"), so the group gets no panel, hence no plot."""
    gpu = {"cpu": "Xeon", "gpu": "NVIDIA H200"}
    versus = result("versus_minisgl_h200", stage="versus", workload="versus", hardware=gpu,
                    metrics={"offline_final": 21000.0, "offline_minisgl": 19500.0, "offline_ratio": 1.08})  # fmt: skip
    assert rr.results_plots.panels([rr.parse_result(versus, "versus.json")]) == []


def test_a_metric_keeps_its_colour_in_every_panel_of_its_workload() -> None:
    """Chapter 04's plot: the H200 panel lacked the worst gap, and its p99 took the worst gap's
    colour in the CPU panel. Colours follow the metric, not its place among a panel's metrics."""
    color = rr.results_plots.metric_color("long-prompt")
    p99 = color("short_itl_ms_p99", 0)  # drawn first in a panel without the worst gap
    assert p99 == color("short_itl_ms_p99", 1) != color("short_itl_ms_max", 0)
    assert color("something_else_ms", 2) == rr.results_plots.COLORS[2]  # unlisted: by its place


def test_a_tensor_parallel_or_larger_model_run_never_stands_in_for_a_rung(tmp_path: Path) -> None:
    # Chapter 07's grid: TP 1, 2 and 4, two model shapes, all newer than the ladder's own runs.
    root = make_repo(tmp_path, ("06_overlap", "07_tensor_parallel"))
    small, large = "qwen3-0.6b-random", "qwen3-8b-random"

    def run(name, stage, tok_s, model, tp, when, **extra):
        data = ladder_result(name, stage, tok_s, timestamp=when, **extra)
        data["config"] |= {"model": model, "tp": tp}
        return data

    write(
        root,
        "h200/a.json",
        run("ladder_stage06_h200", "06_overlap", 12000.0, small, 1, "2025-01-01T00:00:00Z", run_id="c1"),
    )
    write(
        root,
        "h200/b.json",
        run("final_offline_h200", "final", 18000.0, small, 1, "2025-01-01T00:00:00Z"),
    )
    write(
        root,
        "h200/c.json",
        run(
            "stage07_tp1_offline_small_h200", "07_tensor_parallel", 12100.0, small, 1, "2025-01-02T00:00:00Z"
        ),
    )
    write(
        root,
        "h200/d.json",
        run("stage07_tp1_offline_large_h200", "07_tensor_parallel", 6000.0, large, 1, "2025-01-03T00:00:00Z"),
    )
    write(
        root,
        "h200/e.json",
        run("stage07_tp4_offline_large_h200", "07_tensor_parallel", 9000.0, large, 4, "2025-01-04T00:00:00Z"),
    )
    write(
        root,
        "h200/f.json",
        run("final_tp4_offline_small_h200", "final", 30000.0, small, 4, "2025-01-04T00:00:00Z"),
    )
    page = rr.render_markdown(root)[Path("docs/generated/ladder.md")]
    rows = {line.split(" | ")[0]: line for line in page.splitlines() if line.startswith("| ")}
    assert (
        "12,100" in rows["| 07 · tensor parallel"]
        and "stage07_tp1_offline_small_h200" in rows["| 07 · tensor parallel"]
    )
    assert "18,000" in rows["| final/"]
