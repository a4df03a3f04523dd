"""Build a stage yourself: a copy of the stage with the code its chapter teaches stubbed out.

    python -m scripts.exercise 03                  # writes exercises/03_radix_cache/, lists the stubs
    python -m scripts.exercise 03 --check          # the stage's CPU tests, run against the copy
    python -m scripts.exercise 03 --solution --region match   # put one original body back

The chapter includes code by named snippet sections (`--8<-- "stages/<stage>/<file>.py:<name>"`).
Every function or method that lies wholly inside one of those sections keeps its signature, its
docstring and the comments above its first statement; the rest of its body becomes
`raise NotImplementedError("exercise: <name>, see docs/chapters/<stage>.md#<section>")`. The
snippet markers stay, so `--solution` can splice the original sections back in.

Each stub names the chapter section that explains it: the section an in-page link in the
include's lead-in points to, else the section of "The problem" that names the most of its
functions, else the heading the include sits under. Stubs that only a GPU test can check, or that
no test checks, say so (scripts/exercise_stubs.py has the rules).

The tests import the stage as `stages.<stage>`; with `EXERCISE_STAGE_DIR=<copy>` set,
tests/conftest.py binds that name to the copy instead (and to nothing else), so the stage's own
tests and the conformance suite's tests of that stage are the red-to-green checker. `exercises/`
is git-ignored: the copy is the reader's.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from scripts.exercise_stubs import (  # noqa: F401  (re-exported: the tests use them)
    ExerciseError,
    Region,
    Stub,
    functions,
    region_lines,
    splice_originals,
    stub_file,
)

_functions = functions  # the name the tests have always used
ROOT = Path(__file__).resolve().parents[1]
STAGES = ROOT / "stages"
CHAPTERS = ROOT / "docs" / "chapters"
DEFAULT_OUT = ROOT / "exercises"
ENV_VAR = "EXERCISE_STAGE_DIR"  # read by tests/conftest.py
INCLUDE = re.compile(r'^\s*--8<-- "stages/(?P<stage>[^/"]+)/(?P<file>[^":]+\.py):(?P<name>[\w-]+)"\s*$')
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<title>.+?)\s*$")


# ---------------------------------------------------------------------------------------------
# Which stage, which chapter, which regions


def find_stage(spec: str) -> Path:
    """`03`, `3` or `03_radix_cache` -> stages/03_radix_cache."""
    stages = sorted(p for p in STAGES.iterdir() if p.is_dir() and p.name[:2].isdigit())
    wanted = spec.strip().rstrip("/").removeprefix("stages/")
    if wanted.isdigit():
        wanted = f"{int(wanted):02d}"
    for stage in stages:
        if stage.name == wanted or stage.name.split("_", 1)[0] == wanted:
            return stage
    names = ", ".join(s.name for s in stages)
    raise ExerciseError(f"no stage {spec!r} (stages: {names})")


def slugify(title: str) -> str:
    """The heading id the site gives a chapter section: mkdocs' toc extension's own slugify."""
    from markdown.extensions.toc import slugify as toc_slugify  # with mkdocs, in the venv

    return toc_slugify(title, "-")


LINK = re.compile(r"\]\(#(?P<anchor>[\w-]+)\)")
CODE_SECTION = "The code"


def chapter_regions(stage: Path) -> tuple[Path, list[Region]]:
    """The snippet sections of this stage that its chapter includes, in the chapter's order, each
    with the section that explains it."""
    chapter = CHAPTERS / f"{stage.name}.md"
    if not chapter.is_file():
        raise ExerciseError(f"stage {stage.name} has no chapter ({chapter.relative_to(ROOT)} is missing)")
    sections: list[tuple[str, str, list[str]]] = []  # (title, anchor, body lines) in order
    regions: list[Region] = []
    lead_in: list[str] = []  # the prose since the last include or heading
    in_fence = False  # a `# comment` in a code block is no heading
    for line in chapter.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and (m := HEADING.match(line)):
            sections.append((m["title"], slugify(m["title"]), []))
            lead_in = []
            continue
        elif (m := INCLUDE.match(line)) and m["stage"] == stage.name and sections:
            if regions and not any(x.strip() and not x.lstrip().startswith(("```", "~~~")) for x in lead_in):
                title, anchor = regions[-1].section, regions[-1].anchor  # right after the last one
            else:
                title, anchor = explained_in(stage, m["file"], m["name"], lead_in, sections)
            region = Region(m["file"], m["name"], title, anchor)
            if region not in regions:
                regions.append(region)
            lead_in = []
            continue
        if sections:
            sections[-1][2].append(line)
        lead_in.append(line)
    return chapter, regions


def explained_in(
    stage: Path, file: str, name: str, lead_in: list[str], sections: list[tuple[str, str, list[str]]]
) -> tuple[str, str]:
    """The (title, anchor) of the section that explains snippet `name`: an in-page link in its
    lead-in (the chapters give one), else the section before "The code" that names most of its
    functions and classes in code (`GraphRunner`, `capture_sizes`), else the heading the include
    sits under. An include right after another, with no prose between, shares its section."""
    anchors = {anchor: title for title, anchor, _ in sections}
    for link in reversed(LINK.findall("\n".join(lead_in))):
        if link in anchors:
            return anchors[link], link
    names = region_names(stage / file, name)
    best, best_score = sections[-1][:2], 0
    for title, anchor, body in sections:
        if title == CODE_SECTION:
            break
        text = "\n".join(body)
        score = sum(len(re.findall(rf"`[\w.]*\b{re.escape(n)}\b[\w.()]*`", text)) for n in names)
        if score > best_score:
            best, best_score = (title, anchor), score
    return best


def region_names(path: Path, name: str) -> set[str]:
    """The functions (short names, no dunders) and classes defined inside snippet section `name`."""
    source = path.read_text(encoding="utf-8")
    start, end = region_lines(source.splitlines(keepends=True), name)
    tree = ast.parse(source)
    inside = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
              and start <= n.lineno <= end]  # fmt: skip
    return {n.name for n in inside if not n.name.startswith("__")}


# ---------------------------------------------------------------------------------------------
# The three commands


def select(regions: list[Region], wanted: list[str] | None) -> list[Region]:
    if not wanted:
        return regions
    unknown = sorted(set(wanted) - {r.name for r in regions})
    if unknown:
        raise ExerciseError(
            f"no region {unknown} in the chapter (regions: {', '.join(r.name for r in regions)})"
        )
    return [r for r in regions if r.name in wanted]


def by_file(regions: list[Region]) -> dict[str, list[Region]]:
    files: dict[str, list[Region]] = {}
    for region in regions:
        files.setdefault(region.file, []).append(region)
    return files


def make_exercise(stage: Path, out: Path, wanted: list[str] | None = None, force: bool = False) -> list[Stub]:
    """Copy `stage` to `out/<stage name>` and stub the chapter's regions there."""
    chapter, regions = chapter_regions(stage)
    regions = select(regions, wanted)
    target = out / stage.name
    if target.exists():
        if not force:
            raise ExerciseError(
                f"{shown(target)} exists (your work?): --solution restores the originals, --force starts over"
            )
        shutil.rmtree(target)
    shutil.copytree(stage, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    stubs: list[Stub] = []
    trees = [ast.parse(p.read_text(encoding="utf-8")) for p in sorted(stage.rglob("*.py"))]
    for file, file_regions in by_file(regions).items():
        path = target / file
        text, file_stubs = stub_file(path.read_text(encoding="utf-8"), file_regions, chapter, ROOT, trees)
        path.write_text(text, encoding="utf-8")
        stubs += file_stubs
    return stubs


def restore_solution(stage: Path, out: Path, wanted: list[str] | None = None) -> list[Region]:
    """Splice the original regions (all, or `wanted`) back into the exercise copy."""
    _, regions = chapter_regions(stage)
    regions = select(regions, wanted)
    target = out / stage.name
    if not target.is_dir():
        raise ExerciseError(
            f"no exercise at {shown(target)}: run `python -m scripts.exercise {stage.name}` first"
        )
    for file, file_regions in by_file(regions).items():
        path = target / file
        original = (stage / file).read_text(encoding="utf-8")
        path.write_text(
            splice_originals(path.read_text(encoding="utf-8"), original, [r.name for r in file_regions])
        )
    return regions


def stage_tests(stage: Path) -> list[str]:
    """The stage's CPU test files (its GPU files are skipped without CUDA anyway)."""
    number = stage.name.split("_", 1)[0]
    files = sorted(ROOT.glob(f"tests/stages/test_stage{number}*.py"))
    return [f.relative_to(ROOT).as_posix() for f in files if not f.stem.endswith("_gpu")]


CONFORMANCE = "tests/engines/test_conformance.py"


def shown(path: Path) -> str:
    """A path as the reader would type it from the repository root."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def test_commands(stage: Path, target: Path) -> list[str]:
    """The stage's own tests, then the conformance suite's tests of this stage (HF's tokens)."""
    env = f"{ENV_VAR}={shown(target)}"
    return [
        f'{env} python -m pytest -q -m "not gpu and not multi_gpu" {" ".join(stage_tests(stage))}',
        f"{env} python -m pytest -q {CONFORMANCE} -k {stage.name}",
    ]


def with_keyword(args: list[str], keyword: str) -> list[str]:
    """`args` with `-k keyword` added, or and-ed into the reader's own `-k`."""
    out, found = list(args), False
    for i, arg in enumerate(out):
        if arg in ("-k", "--keyword") and i + 1 < len(out):
            out[i + 1], found = f"({keyword}) and ({out[i + 1]})", True
    return out if found else [*out, "-k", keyword]


def run_check(stage: Path, out: Path, pytest_args: list[str]) -> int:
    """The stage's CPU tests, then its conformance tests, both against the copy; 0 when both pass
    (a `-k` of the reader's that selects no test of one of them counts as passing there)."""
    target = out / stage.name
    if not target.is_dir():
        raise ExerciseError(
            f"no exercise at {shown(target)}: run `python -m scripts.exercise {stage.name}` first"
        )
    env = {**os.environ, ENV_VAR: str(target.resolve())}
    pytest = [sys.executable, "-m", "pytest", "-q", "-m", "not gpu and not multi_gpu"]
    own = subprocess.run([*pytest, *stage_tests(stage), *pytest_args], cwd=ROOT, env=env).returncode
    print(f"\nThe conformance suite, against {shown(target)}:", flush=True)
    conformance = subprocess.run(
        [*pytest, CONFORMANCE, *with_keyword(pytest_args, stage.name)], cwd=ROOT, env=env
    )
    return max(0 if code == 5 else code for code in (own, conformance.returncode))  # 5: none selected


CHECKED = {"cpu": "", "gpu": "GPU only", "none": "no test"}


def print_stubs(stage: Path, out: Path, stubs: list[Stub]) -> None:
    target = out / stage.name
    chapter = (CHAPTERS / f"{stage.name}.md").relative_to(ROOT).as_posix()
    gpu = sum(s.checked_by == "gpu" for s in stubs)
    untested = sum(s.checked_by == "none" for s in stubs)
    print(f"{len(stubs)} stubs to write in {shown(target)}/; read {chapter}, section:")
    rows = [
        (f"{s.region.file}:{s.line}", s.function, f"[{s.region.name}]", CHECKED[s.checked_by], s)
        for s in stubs
    ]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(4)]
    for *texts, stub in rows:
        columns = "  ".join(text.ljust(width) for text, width in zip(texts, widths, strict=True))
        print(f"  {columns}  {stub.region.section} (#{stub.region.anchor})")
    print("\nThe stage's tests and its conformance tests check them (red until every stub is written):")
    print(f"  make exercise-check STAGE={stage.name[:2]}")
    for command in test_commands(stage, target):
        print(f"  {command}")
    if gpu:
        print(f"{gpu} stubs marked GPU only are run by no CPU test: tests/stages/test_stage{stage.name[:2]}_gpu.py "
              "checks them on a CUDA host (make gpu-test).")  # fmt: skip
    if untested:
        print(f"{untested} stubs marked no test are base-class defaults that every backend of the stage "
              "overrides: nothing runs them.")  # fmt: skip
    print(
        f"Stuck? python -m scripts.exercise {stage.name[:2]} --solution --region NAME puts one section back."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("stage", help="a stage: 03, 3 or 03_radix_cache")
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="folder the copy goes in (default: exercises/)"
    )
    parser.add_argument(
        "--region", action="append", help="only this snippet section (repeatable; default: all)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite an existing copy")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="run the stage's CPU tests against the copy")
    mode.add_argument("--solution", action="store_true", help="put the original sections back into the copy")
    args, pytest_args = parser.parse_known_args(argv)
    if pytest_args and not args.check:
        parser.error(f"unrecognized arguments: {' '.join(pytest_args)}")
    out = args.out.resolve()
    try:
        stage = find_stage(args.stage)
        if args.check:
            return run_check(stage, out, pytest_args)
        if args.solution:
            restored = restore_solution(stage, out, args.region)
            print(f"restored {', '.join(r.name for r in restored)} in {shown(out / stage.name)}/")
            return 0
        print_stubs(stage, out, make_exercise(stage, out, args.region, args.force))
    except ExerciseError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
