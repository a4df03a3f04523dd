"""Generated docs fragments on disk: which are stale, writing them, removing orphans.

Shared by render_diffs.py (docs/generated/diff_*.md) and render_results.py (results_*.md and
plots). `rendered` maps paths relative to the repository root to their fresh text.
"""

from __future__ import annotations

from pathlib import Path


def stale_files(root: Path, rendered: dict[Path, str], folder: Path, pattern: str) -> list[Path]:
    """Files that differ from a fresh rendering or are missing, and files in `folder` matching
    `pattern` that no rendering produces any more."""
    stale = [
        p
        for p, text in rendered.items()
        if not (root / p).is_file() or (root / p).read_text(encoding="utf-8") != text
    ]
    stale += sorted(
        p.relative_to(root) for p in (root / folder).glob(pattern) if p.relative_to(root) not in rendered
    )
    return stale


def write_files(root: Path, rendered: dict[Path, str]) -> list[str]:
    """Write what changed (with Unix newlines); one report line per file."""
    report = []
    for path, text in rendered.items():
        target = root / path
        if target.is_file() and target.read_text(encoding="utf-8") == text:
            report.append(f"same     {path}")
        else:
            target.write_text(text, encoding="utf-8", newline="\n")
            report.append(f"wrote    {path}")
    return report


def remove_orphans(root: Path, folder: Path, pattern: str, keep) -> list[str]:
    """Delete the files in `folder` matching `pattern` whose root-relative path is not in `keep`."""
    report = []
    for orphan in sorted((root / folder).glob(pattern)):
        if orphan.relative_to(root) not in keep:
            orphan.unlink()
            report.append(f"removed  {orphan.relative_to(root)}")
    return report
