"""The stage contract, as a small library for the scripts and tests.

A stage is a folder ``stages/NN_name/``. Stage N+1 starts as a copy of stage N, and its
``__init__.py`` declares which files it adds or changes::

    CHANGED_FILES: tuple[str, ...] = ("model.py", "scheduler/policy.py")
    REMOVED_FILES: tuple[str, ...] = ("cache.py",)   # optional

Paths are relative to the stage folder, with forward slashes. ``__init__.py`` and ``README.md``
describe the stage itself, so they are always implicitly changed. Every other file must be
byte-identical to the previous stage's copy. The declarations are read with :mod:`ast` instead
of importing the package: folder names start with digits, and reading a tuple should not need
torch.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE_DIR_RE = re.compile(r"^\d{2}_[A-Za-z0-9_]+$")
# Files every stage owns: they describe the stage, so they differ from stage to stage.
IMPLICIT_CHANGED: tuple[str, ...] = ("__init__.py", "README.md")
# What counts as a source file of a stage.
SOURCE_SUFFIXES: tuple[str, ...] = (".py", ".md")
IGNORED_DIRS = frozenset({"__pycache__", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints"})


class StageDeclarationError(ValueError):
    """A stage's ``__init__.py`` declares ``CHANGED_FILES``/``REMOVED_FILES`` in a form we cannot read."""


def stages_root(root: Path = ROOT) -> Path:
    return Path(root) / "stages"


def list_stages(root: Path = ROOT) -> list[Path]:
    """Stage folders (``NN_name``) under ``root/stages``, in order."""
    base = stages_root(root)
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if p.is_dir() and STAGE_DIR_RE.match(p.name))


def stage_number(stage: Path) -> int:
    return int(Path(stage).name[:2])


def module_name(stage: Path) -> str:
    """The importable name of a stage package, e.g. ``stages.01_naive_generate``."""
    return f"stages.{Path(stage).name}"


def previous_stage(stage: Path) -> Path | None:
    """The stage just before ``stage`` among its siblings, or None for the first one."""
    resolved = Path(stage).resolve()
    siblings = list_stages(resolved.parent.parent)
    names = [p.resolve() for p in siblings]
    if resolved not in names:
        raise ValueError(f"{stage} is not a stage folder (expected stages/NN_name/)")
    index = names.index(resolved)
    return siblings[index - 1] if index > 0 else None


def stage_pairs(root: Path = ROOT) -> list[tuple[Path, Path]]:
    """(previous, stage) for every stage that has a predecessor."""
    stages = list_stages(root)
    return list(zip(stages, stages[1:], strict=False))


def _declared(stage: Path, variable: str) -> tuple[str, ...]:
    init = Path(stage) / "__init__.py"
    if not init.is_file():
        return ()
    tree = ast.parse(init.read_text(encoding="utf-8"), filename=str(init))
    value: ast.expr | None = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == variable for t in node.targets
        ):
            value = node.value
        elif (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == variable
        ):
            value = node.value
    if value is None:
        return ()
    try:
        items = ast.literal_eval(value)
    except ValueError as exc:
        raise StageDeclarationError(
            f"{init}: {variable} must be a literal tuple of strings, got {ast.unparse(value)!r}"
        ) from exc
    if not isinstance(items, (tuple, list)) or not all(isinstance(i, str) for i in items):
        raise StageDeclarationError(f"{init}: {variable} must be a tuple of strings, got {items!r}")
    return tuple(items)


def changed_files(stage: Path) -> tuple[str, ...]:
    """``CHANGED_FILES`` of a stage, as written (without the implicit ``__init__.py``/``README.md``)."""
    return _declared(stage, "CHANGED_FILES")


def removed_files(stage: Path) -> tuple[str, ...]:
    """``REMOVED_FILES`` of a stage: files of the previous stage this one deletes."""
    return _declared(stage, "REMOVED_FILES")


def declared_changes(stage: Path) -> set[str]:
    """Every path the stage may change: declared, removed, and the implicit ones."""
    return set(changed_files(stage)) | set(removed_files(stage)) | set(IMPLICIT_CHANGED)


def is_source_file(path: Path) -> bool:
    return path.is_file() and path.suffix in SOURCE_SUFFIXES


def stage_files(stage: Path) -> list[str]:
    """Source files of a folder (``*.py``, ``*.md``), relative POSIX paths, sorted; caches skipped."""
    stage = Path(stage)
    found = []
    for path in stage.rglob("*"):
        rel = path.relative_to(stage)
        if any(part in IGNORED_DIRS or part.startswith(".") for part in rel.parts):
            continue
        if is_source_file(path):
            found.append(rel.as_posix())
    return sorted(found)


def _bad_path(path: str) -> str | None:
    if not path or path.startswith("/") or "\\" in path:
        return "must be a relative POSIX path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "must not contain empty, '.' or '..' parts"
    return None


def contract_violations(stage: Path, prev: Path | None) -> list[str]:
    """Every way ``stage`` breaks the contract against ``prev``; empty when it keeps it.

    - a file not declared changed must exist in ``prev`` and be byte-identical;
    - a declared file must exist and differ from ``prev`` (or be new): no stale declarations;
    - every file of ``prev`` must still exist, unless declared in ``REMOVED_FILES``.
    """
    stage = Path(stage)
    name = stage.name
    problems: list[str] = []
    if not (stage / "__init__.py").is_file():
        problems.append(f"{name}: __init__.py is missing (a stage is a package that declares CHANGED_FILES)")
    try:
        changed = changed_files(stage)
        removed = removed_files(stage)
    except (StageDeclarationError, SyntaxError) as exc:
        return [*problems, f"{name}: {exc}"]

    for variable, paths in (("CHANGED_FILES", changed), ("REMOVED_FILES", removed)):
        for path in paths:
            reason = _bad_path(path)
            if reason:
                problems.append(f"{name}: {variable} entry {path!r} {reason}")
        for path in sorted({p for p in paths if paths.count(p) > 1}):
            problems.append(f"{name}: {variable} lists {path!r} more than once")
    for path in sorted(set(changed) & set(removed)):
        problems.append(f"{name}: {path!r} is in both CHANGED_FILES and REMOVED_FILES")
    if prev is None:
        for path in removed:
            problems.append(f"{name}: REMOVED_FILES lists {path!r} but the first stage has nothing to remove")
        for path in changed:
            if not (stage / path).is_file():
                problems.append(f"{name}: CHANGED_FILES lists {path!r}, which does not exist")
        return problems

    prev = Path(prev)
    pname = prev.name
    current = set(stage_files(stage))
    before = set(stage_files(prev))
    implicit = set(IMPLICIT_CHANGED)

    for path in sorted(current - set(changed) - implicit):
        if path not in before:
            problems.append(f"{name}: new file {path!r} is not declared in CHANGED_FILES")
        elif (stage / path).read_bytes() != (prev / path).read_bytes():
            problems.append(
                f"{name}: {path!r} differs from {pname}/{path} but is not declared in CHANGED_FILES "
                f"(declare it, or run `python -m scripts.propagate stages/{pname}/{path}`)"
            )
    for path in changed:
        if path in implicit or _bad_path(path):
            continue
        here, there = stage / path, prev / path
        if not here.is_file():
            hint = " (use REMOVED_FILES for a deleted file)" if there.is_file() else ""
            problems.append(f"{name}: CHANGED_FILES lists {path!r}, which does not exist{hint}")
        elif there.is_file() and here.read_bytes() == there.read_bytes():
            problems.append(
                f"{name}: stale declaration: {path!r} is in CHANGED_FILES but identical to {pname}/{path}"
            )
    for path in sorted(before - current - set(removed) - implicit):
        problems.append(f"{name}: {path!r} of {pname} is missing; restore it or declare it in REMOVED_FILES")
    for path in removed:
        if _bad_path(path):
            continue
        if (stage / path).exists():
            problems.append(f"{name}: REMOVED_FILES lists {path!r}, which still exists")
        if not (prev / path).exists():
            problems.append(f"{name}: REMOVED_FILES lists {path!r}, which {pname} does not have")
    return problems


def all_violations(root: Path = ROOT) -> list[str]:
    stages = list_stages(root)
    problems: list[str] = []
    for index, stage in enumerate(stages):
        problems += contract_violations(stage, stages[index - 1] if index else None)
    return problems


_STAGES_IMPORT_RE = re.compile(r"""import_module\(\s*["']stages(\.|["'])""")


def imports_of_stages(files: Iterable[Path]) -> list[str]:
    """``path:line: text`` for every import of the ``stages`` package in ``files``."""
    hits: list[str] = []
    for path in sorted(Path(f) for f in files):
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text, filename=str(path))):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            if any(m == "stages" or m.startswith("stages.") for m in modules):
                hits.append(f"{path}:{node.lineno}: {lines[node.lineno - 1].strip()}")
        for lineno, line in enumerate(lines, 1):
            if _STAGES_IMPORT_RE.search(line):
                hits.append(f"{path}:{lineno}: {line.strip()}")
    return hits
