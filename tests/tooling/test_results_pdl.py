"""scripts/results_pdl.py: the fused kernel's PDL bound read from pdl-ab's kernel tables."""

from __future__ import annotations

import json
from pathlib import Path

from scripts import results_pdl


def table(batch: int, busy: float, fused: float) -> dict:
    return {"engine": "final", "batch": batch, "temperature": 0.0, "gpu_us_per_step": busy + 5, "busy_us_per_step": busy,
            "top": [["gemv_kernel", 113.0, 500.0, 490.0], [results_pdl.FUSED, 28.0, fused + 2, fused]]}  # fmt: skip


def write(folder: Path, variant: str, rows: list[dict]) -> None:
    (folder / f"pdl_kernels_{variant}.json").write_text(json.dumps(rows))


def test_the_bound_is_the_last_batch_where_pdl_everywhere_keeps_up(tmp_path: Path, capsys) -> None:
    write(tmp_path, "off", [table(1, 1100, 45), table(64, 2000, 60), table(256, 5250, 143)])
    write(tmp_path, "shipped", [table(1, 1000, 48), table(64, 1990, 62), table(256, 5250, 143)])
    write(tmp_path, "all", [table(1, 1000, 48), table(64, 2015, 70), table(256, 5340, 236)])  # 64: within 1%
    assert results_pdl.supported_bound(results_pdl.load(tmp_path)) == 64
    assert results_pdl.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "256 | 5,250.0 / 143.0 | 5,250.0 / 143.0 | 5,340.0 / 236.0" in out
    assert "PDL_MAX_TOKENS may be 64" in out
    write(tmp_path, "all", [table(1, 1000, 48), table(64, 2100, 90), table(256, 5200, 140)])  # 64 loses by 5%
    assert results_pdl.supported_bound(results_pdl.load(tmp_path)) == 1  # 256's win does not count past it
    write(tmp_path, "all", [table(1, 1200, 48)])
    assert results_pdl.supported_bound(results_pdl.load(tmp_path)) is None


def test_it_needs_both_ends_of_the_comparison(tmp_path: Path, capsys) -> None:
    write(tmp_path, "off", [table(1, 1100, 45)])
    assert results_pdl.main([str(tmp_path)]) == 2
    assert "pdl_kernels_all.json" in capsys.readouterr().err
