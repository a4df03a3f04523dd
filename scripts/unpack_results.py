"""Bring a GPU session's results into the tree: each result from the call that measured it.

    python -m scripts.unpack_results CALL1/results.tar CALL2/results.tar ... --logs benchmarks/logs/h100-2026-11-27-s7

Every device call works on a fresh copy of this checkout, so a call's `results.tar` holds, beside
what it measured, the *committed* copy of every result file an earlier call of the same session
rewrote (`gpu_run.sh` packs the whole `benchmarks/results/<gpu>/`). Unpacking the tars one after
another would let a later call's stale copy overwrite an earlier call's new result (it happened in
session 7 and was caught by hand). So a result or profile file is taken only when its `timestamp`
is newer than the tree's copy and than every other tar's copy; what each call printed (`logs/`) is
copied into `--logs`, and a log of the same name from a later call replaces the earlier one (a step
run twice: say which in the logs' README). Prints one line per file taken.
"""

from __future__ import annotations

import argparse
import json
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ("benchmarks/results/", "benchmarks/profiles/")


def timestamp_of(data: bytes) -> str:
    """A result's or profile's `timestamp` (ISO 8601 sorts as text), or '' when it has none."""
    try:
        value = json.loads(data).get("timestamp", "")
    except (ValueError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def newest_measurements(tars: list[Path], root: Path) -> dict[str, tuple[str, bytes, Path]]:
    """path in the tree -> (timestamp, content, tar) of the newest copy among the tars that is newer
    than the tree's own copy."""
    best: dict[str, tuple[str, bytes, Path]] = {}
    tree: dict[str, str] = {}  # the tree's own copy's timestamp, read once a file
    for tar_path in tars:
        with tarfile.open(tar_path) as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix("./")
                if not member.isfile() or not name.startswith(MEASURED) or not name.endswith(".json"):
                    continue
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                stamp = timestamp_of(data)
                if name not in tree:
                    current = root / name
                    tree[name] = timestamp_of(current.read_bytes()) if current.is_file() else ""
                have = tree[name]
                if stamp and stamp > have and stamp > best.get(name, ("", b"", tar_path))[0]:
                    best[name] = (stamp, data, tar_path)
    return best


def unpack(tars: list[Path], root: Path, logs: Path | None) -> list[str]:
    """Write the newest measurements (and the logs) into root; one report line per file."""
    report = []
    for name, (stamp, data, tar_path) in sorted(newest_measurements(tars, root).items()):
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        report.append(f"took  {name}  ({stamp}, from {tar_path})")
    if logs is not None:
        for tar_path in tars:
            with tarfile.open(tar_path) as tar:
                for member in tar.getmembers():
                    name = member.name.removeprefix("./")
                    if member.isfile() and name.startswith("logs/"):
                        target = logs / Path(name).name
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
                        report.append(f"log   {target}  (from {tar_path})")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("tars", type=Path, nargs="+", help="the calls' results.tar files, in call order")
    parser.add_argument("--logs", type=Path, default=None, help="copy each call's logs/ here")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for line in unpack(args.tars, args.root, args.logs):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
