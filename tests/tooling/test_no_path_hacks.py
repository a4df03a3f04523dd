"""Nothing in scripts/, tests/ or the notebooks edits `sys.path` to find this repository's packages.

`stages` and `final` come from the editable install, `scripts` and `tests` from the repository
root: scripts run as `python -m scripts.NAME` from there, pytest puts it on the path through
pyproject's `pythonpath`, and mkdocs finds `scripts` through the install. A `sys.path.insert`
that comes back makes a file importable one way and not another (run by path, it once let
scripts/stages.py shadow the stages package), so it fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import ROOT

SCANNED = ("scripts", "tests", "docs/notebooks")
# path -> why its one edit of sys.path is not a way to find this repository's packages.
ALLOWED = {
    "scripts/bench_peer.py": "--final-path imports another checkout's final/ (bench_versus --base), on purpose",
}
PATH_EDITS = {"insert", "append", "extend", "remove", "clear", "pop"}


def path_edits(source: str) -> list[int]:
    """Line numbers of every edit of `sys.path` in `source` (calls, assignments, `+=`), and of
    `site.addsitedir` and pytest's `syspath_prepend`, which edit it too."""

    def is_sys_path(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id == "sys"
        )

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            func = node.func
            if (func.attr in PATH_EDITS and is_sys_path(func.value)) or func.attr in (
                "addsitedir",
                "syspath_prepend",
            ):
                lines.append(node.lineno)
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if is_sys_path(target) or (isinstance(target, ast.Subscript) and is_sys_path(target.value)):
                    lines.append(node.lineno)
    return sorted(lines)


def scanned_files() -> list[Path]:
    return sorted(
        p for folder in SCANNED for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts
    )


def test_no_file_edits_sys_path() -> None:
    found = []
    for path in scanned_files():
        rel = path.relative_to(ROOT).as_posix()
        edits = path_edits(path.read_text(encoding="utf-8"))
        if rel in ALLOWED:
            assert len(edits) == 1, f"{rel}: ALLOWED covers its one edit of sys.path, found lines {edits}"
            continue
        found += [f"{rel}:{line}" for line in edits]
    assert not found, (
        "sys.path edited (import `scripts.*` and `tests.*` as packages, run scripts with "
        "`python -m scripts.NAME` from the repository root):\n" + "\n".join(found)
    )


def test_the_allowed_files_exist() -> None:
    for rel in ALLOWED:
        assert (ROOT / rel).is_file(), f"ALLOWED names {rel}, which is gone: drop its entry"


@pytest.mark.parametrize(
    "source",
    [
        "import sys\nsys.path.insert(0, '.')\n",
        "import sys\nif True:\n    sys.path.append('/x')\n",
        "import sys\nsys.path[:0] = ['/x']\n",
        "import sys\nsys.path += ['/x']\n",
        "import sys\nsys.path = ['/x', *sys.path]\n",
        "import site\nsite.addsitedir('/x')\n",
        "def test(monkeypatch):\n    monkeypatch.syspath_prepend('/x')\n",
    ],
)
def test_each_kind_of_edit_is_caught(source: str) -> None:
    assert path_edits(source), source


def test_reading_sys_path_is_not_an_edit() -> None:
    assert path_edits("import sys\nprint(sys.path[0], list(sys.path))\nx = 'sys.path.insert(0, x)'\n") == []
