"""scripts/render_results.py: benchmark JSON in, docs tables and plots out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts import render_results as rr  # noqa: E402


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
        "results_stage01.md",
        "results_stage02.md",
    ]
    assert "No benchmark results yet" in (generated / "all_results.md").read_text()
    assert "No benchmark results for `stage02` yet" in (generated / "results_stage02.md").read_text()
    assert not (root / "docs" / "assets" / "plots").exists() or not any(
        (root / "docs/assets/plots").iterdir()
    )
    assert all(line.startswith("wrote") for line in report)
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

    assert "### Workload `offline`" in stage01
    assert "| Result | Stage | Config | output_tok_per_s | ttft_ms_p50 |" in stage01
    # Only the config that differs between rows is a column; the rest is stated once.
    assert "| `stage01_offline_bf16` | `01_naive_generate` | dtype=bfloat16 | 99.50 | 12.00 |" in stage01
    assert "| `stage01_offline_cpu` | `01_naive_generate` |  | 1,235 | 0.0421 |" in stage01
    assert "Config of every row: `attn=torch`, `device=cpu`, `scale=0.01`." in stage01
    assert (
        "Measured on: CPU `Test CPU 9000`; no GPU; cpu_count `8`; python `3.12.3`, torch `2.11.0`" in stage01
    )
    assert "`python -m stages.common.bench stage01 --scale 0.01`" in stage01
    assert "![Benchmark results of stage01](../assets/plots/stage01.png)" in stage01
    assert "final-offline" not in stage01

    assert "| `final-offline` | `final` | 21,000 |" in final
    assert "GPU `NVIDIA H200`" in final
    assert "No benchmark results for `stage02` yet" in (generated / "results_stage02.md").read_text()

    everything = (generated / "all_results.md").read_text()
    assert everything.index("## `stage01`") < everything.index("## `final`")
    assert "## `stage02`" not in everything
    assert "![Benchmark results of final](assets/plots/final.png)" in everything

    plots = root / "docs" / "assets" / "plots"
    assert sorted(p.name for p in plots.iterdir()) == ["final.png", "stage01.png"]
    assert (plots / "stage01.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


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
    assert [rr.format_metric(v) for v in (16543.2, 123.45, 1.6789, 0.0, 0.01234, float("nan"))] == [
        "16,543", "123.5", "1.68", "0.00", "0.0123", "n/a",
    ]  # fmt: skip
    assert rr.code("a`b") == "`` a`b ``"
    assert rr.cell("a|b") == "a\\|b"


def test_committed_result_pages_are_up_to_date() -> None:
    stale = rr.stale_files(ROOT)
    assert not stale, f"out of date: {', '.join(map(str, stale))}; run make docs-gen"
