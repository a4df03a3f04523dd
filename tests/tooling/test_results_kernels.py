"""scripts/results_kernels.py: the Performance page's kernel table, from a versus result's tables."""

from __future__ import annotations

import json
from pathlib import Path

from scripts import results_kernels


def table(total: float, **by: float) -> dict:
    return {"gpu_us_per_step": total, "kernels_per_step": 100.0, "by_category_us": by}


def write_versus(folder: Path, with_base: bool) -> None:
    row = {"batch": 1, "temperature": 0.0, "final": table(90.0, gemm=50.0, **{"kv-store": 30.0}, norm=10.0),
           "mini-sglang": table(100.0, gemm=50.0, **{"kv-store": 20.0}, norm=20.0, rope=10.0)}  # fmt: skip
    if with_base:
        row["final-base"] = table(120.0, gemm=60.0, **{"kv-store": 40.0}, norm=20.0)
    data = {"name": "versus_minisgl_h200", "timestamp": "2026-11-25T00:00:00Z", "run_id": "c1",
            "hardware": {"gpu": "NVIDIA H200"}, "versions": {"git_commit": "abc"}, "kernels": [row]}  # fmt: skip
    (folder / "h200").mkdir(parents=True, exist_ok=True)
    (folder / "h200" / "versus_minisgl_h200.json").write_text(json.dumps(data))


def rows(page: str) -> dict[str, list[str]]:
    lines = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line]
    return {
        cells[0]: cells[1:] for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines)
    }


def test_categories_side_by_side_and_the_fused_kernels_compared_together(tmp_path: Path) -> None:
    write_versus(tmp_path, with_base=True)
    page = results_kernels.render(tmp_path)
    got = rows(page)
    assert got["Category"] == [
        "batch 1, greedy: before",
        "batch 1, greedy: final/",
        "batch 1, greedy: Mini-SGLang",
    ]
    assert got["gemm"] == ["60.0", "50.0", "50.0"] and got["rope"] == ["0", "0", "10.0"]
    assert got["norm + rope + kv-store"] == ["60.0", "40.0", "50.0"]  # 30 + 10 against 20 + 10 + 20
    assert got["**total, GPU µs a step**"] == ["120.0", "90.0", "100.0"]
    assert "### H200" in page and "`versus_minisgl_h200`" in page


def test_without_a_base_there_is_no_before_column(tmp_path: Path) -> None:
    write_versus(tmp_path, with_base=False)
    assert rows(results_kernels.render(tmp_path))["Category"] == [
        "batch 1, greedy: final/",
        "batch 1, greedy: Mini-SGLang",
    ]
    assert "No kernel tables yet" in results_kernels.render(tmp_path / "empty")


def test_the_total_is_the_busy_time_where_a_table_has_it(tmp_path: Path) -> None:
    write_versus(tmp_path, with_base=False)
    path = tmp_path / "h200" / "versus_minisgl_h200.json"
    data = json.loads(path.read_text())
    data["kernels"][0]["final"]["busy_us_per_step"] = 80.0  # overlapped kernels counted once
    path.write_text(json.dumps(data))
    page = results_kernels.render(tmp_path)
    assert rows(page)["**total, GPU µs a step**"] == ["80.0", "100.0"]
    assert "kernel durations summed" in page  # Mini-SGLang's table of that call has no busy time
    data["kernels"][0]["mini-sglang"]["busy_us_per_step"] = 95.0
    path.write_text(json.dumps(data))
    page = results_kernels.render(tmp_path)
    assert rows(page)["**total, GPU µs a step**"] == ["80.0", "95.0"] and "counted once" in page


def test_the_table_is_the_call_where_final_ran_mini_sglangs_attention(tmp_path: Path) -> None:
    """Kernel for kernel: a newer versus whose final/ ran its own backends (`--final-attn auto`)
    does not displace the one where both engines ran FlashInfer."""
    write_versus(tmp_path, with_base=False)
    same = tmp_path / "h200" / "versus_minisgl_fi_h200.json"
    (tmp_path / "h200" / "versus_minisgl_h200.json").rename(same)
    data = json.loads(same.read_text()) | {"config": {"attn": "fi", "final_attn": "fi"}}
    same.write_text(json.dumps(data))
    other = data | {"name": "versus_minisgl_h200", "timestamp": "2026-11-26T00:00:00Z",
                    "config": {"attn": "fi", "final_attn": "auto"}}  # fmt: skip
    (tmp_path / "h200" / "versus_minisgl_h200.json").write_text(json.dumps(other))
    assert results_kernels.versus_files(tmp_path)["H200"]["config"]["final_attn"] == "fi"
    same.unlink()  # with no such call, the newest
    assert results_kernels.versus_files(tmp_path)["H200"]["config"]["final_attn"] == "auto"
    # FlashAttention's prefill with FlashInfer's decode: decode steps kernel for kernel all the same
    prefill_fa = data | {"name": "versus_minisgl_fa-fi_h200", "timestamp": "2026-11-25T00:00:00Z",
                         "config": {"attn": "fi", "final_attn": "fa,fi"}}  # fmt: skip
    (tmp_path / "h200" / "versus_minisgl_fa-fi_h200.json").write_text(json.dumps(prefill_fa))
    assert results_kernels.versus_files(tmp_path)["H200"]["config"]["final_attn"] == "fa,fi"
    # auto, where the result records what it resolved to, counts as that: here the same decode
    resolved = other | {"timestamp": "2026-11-27T00:00:00Z",
                        "config": {"attn": "fi", "final_attn": "auto", "final_attn_resolved": "fa,fi"}}  # fmt: skip
    (tmp_path / "h200" / "versus_minisgl_h200.json").write_text(json.dumps(resolved))
    assert results_kernels.versus_files(tmp_path)["H200"]["config"]["final_attn_resolved"] == "fa,fi"
    resolved["config"]["final_attn_resolved"] = "fi,fa"  # FlashAttention's decode: not Mini-SGLang's
    (tmp_path / "h200" / "versus_minisgl_h200.json").write_text(json.dumps(resolved))
    assert results_kernels.versus_files(tmp_path)["H200"]["config"]["final_attn"] == "fa,fi"


def test_the_verdict_names_each_category_over_by_more_than_three_percent(tmp_path: Path) -> None:
    """The page's "over by more than 3%" line is computed, not written: gemm 50 against 50 passes,
    norm + rope + kv-store is judged together (40 against 50 passes although kv-store alone is
    over), and a category 4% over is named with both figures."""
    write_versus(tmp_path, with_base=False)
    assert "Over Mini-SGLang's by more than 3%: no category." in results_kernels.render(tmp_path)
    path = tmp_path / "h200" / "versus_minisgl_h200.json"
    data = json.loads(path.read_text())
    data["kernels"][0]["final"]["by_category_us"]["gemm"] = 52.0  # 4% over
    data["kernels"][0]["mini-sglang"]["by_category_us"]["sampling"] = 8.0
    data["kernels"][0]["final"]["by_category_us"]["sampling"] = 8.2  # 2.5% over: within
    path.write_text(json.dumps(data))
    page = results_kernels.render(tmp_path)
    assert "Over Mini-SGLang's by more than 3%: batch 1, greedy, gemm (52.0 against 50.0 µs)." in page


def test_the_idle_share_is_the_served_step_less_the_busy_time(tmp_path: Path) -> None:
    write_versus(tmp_path, with_base=False)
    path = tmp_path / "h200" / "versus_minisgl_h200.json"
    data = json.loads(path.read_text())
    assert results_kernels.idle_share(data) is None  # no step time, no busy time: no claim
    data["metrics"] = {"latency_final": 0.1}  # a 100 µs step
    data["kernels"][0]["final"]["busy_us_per_step"] = 93.0
    path.write_text(json.dumps(data))
    assert abs(results_kernels.idle_share(data) - 0.07) < 1e-9
    assert "(0.100 ms) is 7.0% idle GPU time" in results_kernels.render(tmp_path)


def test_a_bar_per_change_only_where_a_call_measured_the_base(tmp_path: Path) -> None:
    """The plot of what each change bought reads the --base final/ of a versus call: drawn (and
    linked from the page) where one exists, absent where none does."""
    link = "../assets/plots/kernel_changes.png"
    write_versus(tmp_path / "without", with_base=False)
    assert not results_kernels.plot(tmp_path / "without", tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists() and link not in results_kernels.render(
        tmp_path / "without", link
    )
    write_versus(tmp_path / "with", with_base=True)
    assert results_kernels.plot(tmp_path / "with", tmp_path / "changes.png")
    assert (tmp_path / "changes.png").stat().st_size > 0
    page = results_kernels.render(tmp_path / "with", link)
    assert f"]({link})" in page and "`versus_minisgl_h200`, 2026-11-25, run `c1`" in page
