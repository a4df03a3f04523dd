"""scripts/gpu_pack.sh: one results.tar from a device call's side-by-side groups."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

from tests import ROOT


def test_the_groups_logs_and_the_calls_new_results_are_packed_into_one_file(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts/gpu_pack.sh", tree / "scripts")
    results = tree / "benchmarks/results/h200"
    results.mkdir(parents=True)
    old = results / "before_h200.json"
    old.write_text("{}")
    marker = tmp_path / "call-start"
    marker.touch()
    past = time.time() - 60
    os.utime(old, (past, past))  # written by an earlier call: stays out
    (results / "new_h200.json").write_text("{}")
    out = tmp_path / "out"
    for group in ("tp", "one"):
        (out / group / "logs").mkdir(parents=True)
        (out / group / "logs" / f"{group}.log").write_text(group)
    (out / "one" / "results.tar").write_bytes(b"a group's own pack")  # superseded: left out
    done = subprocess.run(["bash", str(tree / "scripts/gpu_pack.sh"), str(out), str(marker)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert sorted(p.name for p in out.iterdir()) == ["results.tar"]
    with tarfile.open(out / "results.tar") as tar:
        names = sorted(n.removeprefix("./") for n in tar.getnames() if not tar.getmember(n).isdir())
    assert names == ["benchmarks/results/h200/new_h200.json", "one/logs/one.log", "tp/logs/tp.log"]
    assert "packed 3 files" in done.stdout
