"""The stage contract: each stage changes only the files it declares (see docs/stages.md).

The pairwise checks run over every stage and its predecessor; the self-tests below build fake
stages in a temporary folder and check that the checker catches each kind of violation.
"""

from __future__ import annotations

import html
import importlib
import re
from pathlib import Path

import pytest

from scripts import propagate, render_diffs
from scripts import stage_contract as contract
from tests import ROOT

STAGES = contract.list_stages(ROOT)
PAIRS = contract.stage_pairs(ROOT)
FINAL = ROOT / "final"


def _pair_params() -> list:
    if not PAIRS:
        reason = (
            f"only {len(STAGES)} stage(s) under stages/: no stage has a previous stage to compare with yet"
        )
        return [pytest.param(None, None, id="no-stage-pairs", marks=pytest.mark.skip(reason=reason))]
    return [pytest.param(prev, stage, id=f"{prev.name[:2]}-{stage.name}") for prev, stage in PAIRS]


def _package_params() -> list:
    params = [pytest.param(contract.module_name(stage), stage, id=stage.name) for stage in STAGES]
    params.append(
        pytest.param(
            "final",
            None,
            id="final",
            marks=pytest.mark.skipif(not FINAL.is_dir(), reason="final/ does not exist yet"),
        )
    )
    return params


# ---------------------------------------------------------------------------------------------
# The repository's own stages


def test_there_is_a_first_stage() -> None:
    assert STAGES, "no stage folder (stages/NN_name/) found"
    assert STAGES[0].name.startswith("01_")


@pytest.mark.parametrize(("prev", "stage"), _pair_params())
def test_stage_changes_only_declared_files(prev: Path, stage: Path) -> None:
    problems = contract.contract_violations(stage, prev)
    assert not problems, "stage contract broken:\n" + "\n".join(problems)


def test_first_stage_declarations() -> None:
    problems = contract.contract_violations(STAGES[0], None)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("module", "stage"), _package_params())
def test_package_imports_and_has_docstring(module: str, stage: Path | None) -> None:
    package = importlib.import_module(module)
    assert package.__file__ is not None, f"{module} has no __init__.py"
    assert package.__doc__ and package.__doc__.strip(), f"{module}/__init__.py needs a docstring"
    if stage is not None:
        # What `ast` reads must be what the package says at run time.
        assert tuple(getattr(package, "CHANGED_FILES", ())) == contract.changed_files(stage)
        assert tuple(getattr(package, "REMOVED_FILES", ())) == contract.removed_files(stage)


def test_final_imports_nothing_from_stages() -> None:
    if not FINAL.is_dir():
        pytest.skip("final/ does not exist yet")
    files = [p for p in FINAL.rglob("*.py") if "__pycache__" not in p.parts]
    hits = contract.imports_of_stages(files)
    assert not hits, "final/ must be standalone, but imports stages:\n" + "\n".join(hits)


def test_generated_diffs_are_up_to_date() -> None:
    stale = render_diffs.stale_files(ROOT)
    assert not stale, f"out of date: {', '.join(map(str, stale))}; run make docs-gen"


# ---------------------------------------------------------------------------------------------
# Self-tests on fake stages: the checker must be able to fail


def make_stage(
    root: Path, name: str, files: dict[str, str], changed: tuple[str, ...] = (), removed: tuple[str, ...] = ()
) -> Path:
    stage = root / "stages" / name
    stage.mkdir(parents=True)
    init = f'"""Fake stage {name}."""\n\nCHANGED_FILES: tuple[str, ...] = {changed!r}\n'
    if removed:
        init += f"REMOVED_FILES = {removed!r}\n"
    (stage / "__init__.py").write_text(init)
    for path, text in files.items():
        (stage / path).parent.mkdir(parents=True, exist_ok=True)
        (stage / path).write_text(text)
    return stage


BASE = {"model.py": "def forward():\n    return 1\n", "sampling.py": "def sample():\n    return 0\n"}


def test_checker_accepts_a_clean_pair(tmp_path: Path) -> None:
    prev = make_stage(tmp_path, "01_a", BASE, changed=("model.py", "sampling.py"))
    stage = make_stage(
        tmp_path, "02_b", {**BASE, "model.py": "def forward():\n    return 2\n", "pages.py": "X = 1\n"},
        changed=("model.py", "pages.py"),
    )  # fmt: skip
    (stage / "README.md").write_text("# Stage 02\n")  # implicitly changed
    assert contract.contract_violations(stage, prev) == []
    assert contract.all_violations(tmp_path) == []


def test_checker_reports_undeclared_difference(tmp_path: Path) -> None:
    prev = make_stage(tmp_path, "01_a", BASE)
    stage = make_stage(tmp_path, "02_b", {**BASE, "sampling.py": "def sample():\n    return 1\n"})
    problems = contract.contract_violations(stage, prev)
    assert len(problems) == 1
    assert "'sampling.py' differs" in problems[0] and "not declared" in problems[0]


def test_checker_reports_undeclared_new_file(tmp_path: Path) -> None:
    prev = make_stage(tmp_path, "01_a", BASE)
    stage = make_stage(tmp_path, "02_b", {**BASE, "sub/extra.py": "Y = 2\n"})
    assert contract.contract_violations(stage, prev) == [
        "02_b: new file 'sub/extra.py' is not declared in CHANGED_FILES"
    ]


def test_checker_reports_stale_declaration(tmp_path: Path) -> None:
    prev = make_stage(tmp_path, "01_a", BASE)
    stage = make_stage(tmp_path, "02_b", BASE, changed=("model.py",))
    problems = contract.contract_violations(stage, prev)
    assert len(problems) == 1 and "stale declaration" in problems[0] and "model.py" in problems[0]


def test_checker_reports_missing_file_unless_removed(tmp_path: Path) -> None:
    prev = make_stage(tmp_path, "01_a", BASE)
    stage = make_stage(tmp_path, "02_b", {"model.py": BASE["model.py"]})
    problems = contract.contract_violations(stage, prev)
    assert len(problems) == 1 and "'sampling.py' of 01_a is missing" in problems[0]

    removing = make_stage(tmp_path, "03_c", {"model.py": BASE["model.py"]}, removed=("sampling.py",))
    assert contract.contract_violations(removing, prev) == []
    still_there = make_stage(tmp_path, "04_d", BASE, removed=("sampling.py",))
    assert any("still exists" in p for p in contract.contract_violations(still_there, prev))


def test_checker_reports_declared_file_that_does_not_exist(tmp_path: Path) -> None:
    prev = make_stage(tmp_path, "01_a", BASE)
    stage = make_stage(tmp_path, "02_b", BASE, changed=("nope.py",))
    problems = contract.contract_violations(stage, prev)
    assert len(problems) == 1 and "'nope.py', which does not exist" in problems[0]


def test_checker_reports_unreadable_declaration(tmp_path: Path) -> None:
    prev = make_stage(tmp_path, "01_a", BASE)
    stage = make_stage(tmp_path, "02_b", BASE)
    (stage / "__init__.py").write_text('"""Doc."""\nCHANGED_FILES = tuple(["model.py"])\n')
    problems = contract.contract_violations(stage, prev)
    assert len(problems) == 1 and "must be a literal tuple of strings" in problems[0]


def test_changed_files_is_read_without_importing(tmp_path: Path) -> None:
    stage = make_stage(tmp_path, "01_a", BASE, changed=("model.py",))
    (stage / "__init__.py").write_text(
        '"""Doc."""\nimport does_not_exist\n\nCHANGED_FILES: tuple[str, ...] = ("model.py", "sampling.py")\n'
    )
    assert contract.changed_files(stage) == ("model.py", "sampling.py")
    assert contract.removed_files(stage) == ()


def test_listing_and_order(tmp_path: Path) -> None:
    b = make_stage(tmp_path, "02_b", BASE)
    a = make_stage(tmp_path, "01_a", BASE)
    (tmp_path / "stages" / "common").mkdir()
    (tmp_path / "stages" / "notes_x").mkdir()
    (a / "__pycache__").mkdir()
    (a / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"\0")
    (a / "__pycache__" / "junk.py").write_text("")
    (a / "weights.bin").write_bytes(b"\0")
    (a / "README.md").write_text("# A\n")
    assert contract.list_stages(tmp_path) == [a, b]
    assert contract.previous_stage(b) == a and contract.previous_stage(a) is None
    assert contract.stage_pairs(tmp_path) == [(a, b)]
    assert contract.stage_files(a) == ["README.md", "__init__.py", "model.py", "sampling.py"]
    with pytest.raises(ValueError, match="not a stage folder"):
        contract.previous_stage(tmp_path / "stages" / "common")


def test_import_scanner_finds_imports_of_stages(tmp_path: Path) -> None:
    clean = tmp_path / "clean.py"
    clean.write_text("import stages_helper\nfrom final.core import x\n# from stages import nothing\n")
    dirty = tmp_path / "dirty.py"
    dirty.write_text(
        "import os\nfrom stages.common import weights\nimport stages\n"
        "m = importlib.import_module('stages.01_naive_generate')\n"
    )
    assert contract.imports_of_stages([clean]) == []
    hits = contract.imports_of_stages([dirty])
    assert [h.split(":")[1] for h in hits] == ["2", "3", "4"]


# ---------------------------------------------------------------------------------------------
# propagate.py


def test_propagate_copies_forward_until_a_stage_changes_the_file(tmp_path: Path) -> None:
    first = make_stage(tmp_path, "01_a", BASE)
    second = make_stage(tmp_path, "02_b", {**BASE, "model.py": "M = 2\n"}, changed=("model.py",))
    third = make_stage(
        tmp_path, "03_c", {"model.py": "M = 2\n", "sampling.py": "S = 3\n"}, changed=("sampling.py",)
    )
    fourth = make_stage(tmp_path, "04_d", {"model.py": "M = 2\n", "sampling.py": "S = 3\n"})
    fixed = "def sample():\n    return 42  # fixed\n"
    (first / "sampling.py").write_text(fixed)

    report = propagate.propagate(first / "sampling.py", root=tmp_path, dry_run=True)
    assert (second / "sampling.py").read_text() == BASE["sampling.py"]
    assert report[0].startswith("would copy")

    report = propagate.propagate(first / "sampling.py", root=tmp_path)
    assert (second / "sampling.py").read_text() == fixed
    assert (third / "sampling.py").read_text() == "S = 3\n"
    assert (fourth / "sampling.py").read_text() == "S = 3\n"
    assert report[0] == "copied 01_a/sampling.py -> 02_b/sampling.py"
    assert report[1].startswith("stop   03_c")
    assert contract.all_violations(tmp_path) == []

    report = propagate.propagate(first / "sampling.py", root=tmp_path)
    assert report[0] == "same   02_b/sampling.py"


def test_propagate_refuses_what_it_cannot_propagate(tmp_path: Path) -> None:
    first = make_stage(tmp_path, "01_a", BASE)
    with pytest.raises(propagate.PropagateError, match="describes its own stage"):
        propagate.propagate(first / "__init__.py", root=tmp_path)
    with pytest.raises(propagate.PropagateError, match="does not exist"):
        propagate.propagate(first / "missing.py", root=tmp_path)
    with pytest.raises(propagate.PropagateError, match="not inside"):
        propagate.propagate(tmp_path / "elsewhere.py", root=tmp_path)


# ---------------------------------------------------------------------------------------------
# render_diffs.py


def test_diff_fragment_shows_exactly_the_changes(tmp_path: Path) -> None:
    prev = make_stage(tmp_path, "01_a", BASE)
    stage = make_stage(
        tmp_path, "02_b", {"model.py": "def forward():\n    return 2\n", "pages.py": "A = 1\nB = 2\n"},
        changed=("model.py", "pages.py"), removed=("sampling.py",),
    )  # fmt: skip
    text = render_diffs.render_stage_diff(stage, prev)
    table = [line for line in text.splitlines() if line.startswith("| `")]
    # The files that carry the lesson first (most lines changed), the stage's description last.
    assert table == [
        "| `model.py` | changed | +1 | -1 |",
        "| `pages.py` | new | +2 | -0 |",
        "| `sampling.py` | removed | +0 | -2 |",
        "| `__init__.py` | changed | +3 | -2 |",  # the most lines, and still last
    ]
    # Each file's diff in a collapsed block, in the same order.
    blocks = [line for line in text.splitlines() if line.startswith("??? abstract")]
    assert blocks[0] == '??? abstract "model.py · changed, +1 -1 lines"'
    assert [b.split('"')[1].split(" ·")[0] for b in blocks] == [
        "model.py",
        "pages.py",
        "sampling.py",
        "__init__.py",
    ]
    assert "    ```diff\n    --- 01_a/model.py\n    +++ 02_b/model.py\n" in text
    assert "    -    return 1\n    +    return 2\n    ```" in text
    assert "    ```python\n    A = 1\n    B = 2\n    ```" in text
    assert text == render_diffs.render_stage_diff(stage, prev)  # deterministic
    first = render_diffs.render_first_stage(prev)
    assert "first stage" in first and "| `model.py` | 2 |" in first


def test_diff_fences_outgrow_backticks_in_the_source() -> None:
    lines = render_diffs.fenced(['doc = """', "```python", "x", "```", '"""'], "python")
    assert lines[0] == "````python" and lines[-1] == "````"


def test_diff_fragment_survives_snippets(tmp_path: Path) -> None:
    """Section markers and snippet lines in a diff must render as written, not be swallowed."""
    markdown = pytest.importorskip("markdown")
    pytest.importorskip("pymdownx.snippets")
    source = [
        "# --8<-- [start:attention]",
        "x = 1",
        "# --8<-- [end:attention]",
        '--8<-- "nowhere.md"',
        "--8<--",
        "# ;--8<-- [start:already_escaped]",
    ]
    text = "\n".join(source) + "\n"
    prev = make_stage(tmp_path, "01_a", {"changed.md": text, "gone.md": text})
    stage = make_stage(
        tmp_path, "02_b", {"changed.md": "other\n", "new.md": text},
        changed=("changed.md", "new.md"), removed=("gone.md",),
    )  # fmt: skip
    (tmp_path / "diff.md").write_text(render_diffs.render_stage_diff(stage, prev))
    (tmp_path / "page.md").write_text('--8<-- "diff.md"\n')
    md = markdown.Markdown(
        extensions=["pymdownx.snippets", "pymdownx.superfences", "pymdownx.details", "admonition"],
        extension_configs={"pymdownx.snippets": {"base_path": [str(tmp_path)], "check_paths": True}},
    )
    rendered = html.unescape(re.sub(r"<[^>]+>", "", md.convert((tmp_path / "page.md").read_text())))
    for line in source:
        assert f"\n{line}\n" in rendered, f"{line!r} of a new or removed file was not rendered as written"
        assert f"\n-{line}\n" in rendered, f"{line!r} of a diff was not rendered as written"


def test_diff_fragment_starts_with_the_stage_in_its_own_words(tmp_path: Path) -> None:
    prev = make_stage(tmp_path, "01_a", BASE)
    stage = make_stage(
        tmp_path, "02_b", {**BASE, "model.py": "def forward():\n    return 2\n"}, changed=("model.py",)
    )
    init = stage / "__init__.py"
    init.write_text(
        '"""Stage 02: the title line.\n\nPages instead of a buffer,\nso requests share one pool.\n\n'
        'Changed from stage 01: model.py and __main__.py.\n"""\n' + init.read_text().split('"""', 2)[2]
    )
    text = render_diffs.render_stage_diff(stage, prev)
    summary = text.split("Stage 02 (`02_b`)")[0]
    assert "the title line" not in summary
    assert "    Pages instead of a buffer, so requests share one pool.\n" in summary
    assert "    Changed from stage 01: `model.py` and `__main__.py`.\n" in summary
