"""Carry a fix in a stage file forward into the later stages that do not change that file.

    python -m scripts.propagate stages/01_naive_generate/sampling.py   # copy the fix forward
    python -m scripts.propagate --dry-run stages/01_naive_generate/sampling.py
    python -m scripts.propagate --check                                 # list contract violations

A stage that declares the file in CHANGED_FILES (or REMOVED_FILES) has its own version, and so do
the stages after it: propagation stops there, and the fix has to be ported by hand.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scripts.stage_contract import (
    IMPLICIT_CHANGED,
    ROOT,
    STAGE_DIR_RE,
    all_violations,
    changed_files,
    list_stages,
    removed_files,
)


class PropagateError(Exception):
    pass


def locate(path: Path, root: Path = ROOT) -> tuple[Path, str]:
    """Split ``stages/NN_x/a/b.py`` into its stage folder and the path inside it."""
    path = Path(path).resolve()
    base = (Path(root) / "stages").resolve()
    try:
        rel = path.relative_to(base)
    except ValueError:
        raise PropagateError(f"{path} is not inside {base}") from None
    if len(rel.parts) < 2 or not STAGE_DIR_RE.match(rel.parts[0]):
        raise PropagateError(f"{path} is not a file of a stage folder (stages/NN_name/...)")
    return base / rel.parts[0], Path(*rel.parts[1:]).as_posix()


def propagate(path: Path, root: Path = ROOT, dry_run: bool = False) -> list[str]:
    """Copy ``path`` into every later stage until one declares it changed; return what was done."""
    stage, rel = locate(path, root)
    if rel in IMPLICIT_CHANGED:
        raise PropagateError(f"{rel} describes its own stage; every stage keeps its own copy")
    source = stage / rel
    if not source.is_file():
        raise PropagateError(f"{source} does not exist")
    content = source.read_bytes()
    stages = [s.resolve() for s in list_stages(root)]
    later = stages[stages.index(stage) + 1 :]
    report: list[str] = []
    for target_stage in later:
        if rel in changed_files(target_stage) or rel in removed_files(target_stage):
            report.append(
                f"stop   {target_stage.name}: declares {rel} changed; port the fix by hand from here on"
            )
            break
        target = target_stage / rel
        if target.is_file() and target.read_bytes() == content:
            report.append(f"same   {target_stage.name}/{rel}")
            continue
        verb = "would copy" if dry_run else "copied"
        if not dry_run:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        report.append(f"{verb} {stage.name}/{rel} -> {target_stage.name}/{rel}")
    if not later:
        report.append(f"{stage.name} is the last stage; nothing to propagate")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="*", type=Path, help="stage files whose content to carry forward")
    parser.add_argument("--check", action="store_true", help="list stage-contract violations and exit")
    parser.add_argument("--dry-run", action="store_true", help="say what would be copied, copy nothing")
    args = parser.parse_args(argv)
    if not args.check and not args.files:
        parser.error("give files to propagate, or --check")

    for file in args.files:
        try:
            lines = propagate(file, dry_run=args.dry_run)
        except PropagateError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"{file}:")
        for line in lines:
            print(f"  {line}")

    problems = all_violations()
    for problem in problems:
        print(f"violation: {problem}")
    if problems:
        print(f"{len(problems)} stage-contract violation(s)", file=sys.stderr)
        return 1 if args.check else 0
    if args.check:
        print(f"stage contract holds for {len(list_stages())} stage(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
