"""scripts/unpack_results.py: a session's tars unpacked so that each result comes from the call
that measured it, never from a later call's stale copy of the committed file."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

from scripts.unpack_results import main

RESULT = "benchmarks/results/h100/versus_minisgl_h100.json"
OTHER = "benchmarks/results/h100/final_online_h100_rate8.json"


def result(stamp: str, value: float) -> bytes:
    return json.dumps({"name": "x", "timestamp": stamp, "metrics": {"v": value}}).encode()


def make_tar(path: Path, files: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_each_result_comes_from_the_call_that_measured_it(tmp_path, capsys):
    root = tmp_path / "tree"
    (root / RESULT).parent.mkdir(parents=True)
    committed = result("2026-11-25T05:56:24Z", 1.0)
    (root / RESULT).write_bytes(committed)
    (root / OTHER).write_bytes(result("2026-11-25T06:00:00Z", 5.0))
    # Call 1 measured versus anew; call 2 measured the online rate and carries versus as committed.
    first = make_tar(tmp_path / "1.tar", {RESULT: result("2026-11-27T15:04:26Z", 2.0),
                                          OTHER: result("2026-11-25T06:00:00Z", 5.0),
                                          "logs/versus.log": b"call 1"})  # fmt: skip
    second = make_tar(tmp_path / "2.tar", {RESULT: committed, OTHER: result("2026-11-27T15:07:00Z", 6.0),
                                           "logs/online.log": b"call 2"})  # fmt: skip
    assert main([str(first), str(second), "--logs", str(tmp_path / "logs"), "--root", str(root)]) == 0
    assert json.loads((root / RESULT).read_text())["metrics"]["v"] == 2.0  # not call 2's stale copy
    assert json.loads((root / OTHER).read_text())["metrics"]["v"] == 6.0
    assert (tmp_path / "logs" / "versus.log").read_text() == "call 1"
    assert (tmp_path / "logs" / "online.log").read_text() == "call 2"
    took = [line for line in capsys.readouterr().out.splitlines() if line.startswith("took")]
    assert len(took) == 2 and "1.tar" in took[1] and "2.tar" in took[0]


def test_a_tar_with_nothing_newer_changes_nothing(tmp_path):
    root = tmp_path / "tree"
    (root / RESULT).parent.mkdir(parents=True)
    (root / RESULT).write_bytes(result("2026-11-27T00:00:00Z", 1.0))
    old = make_tar(tmp_path / "old.tar", {RESULT: result("2026-11-26T00:00:00Z", 9.0)})
    assert main([str(old), "--root", str(root)]) == 0
    assert json.loads((root / RESULT).read_text())["metrics"]["v"] == 1.0
