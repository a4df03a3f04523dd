"""Build a stage yourself: a copy of the stage with the code its chapter teaches stubbed out.

    python scripts/exercise.py 03                  # writes exercises/03_radix_cache/, lists the stubs
    python scripts/exercise.py 03 --check          # the stage's CPU tests, run against the copy
    python scripts/exercise.py 03 --solution --region match   # put one original body back

The chapter includes code by named snippet sections (`--8<-- "stages/<stage>/<file>.py:<name>"`).
Every function or method that lies wholly inside one of those sections keeps its signature, its
docstring and the comments above its first statement; the rest of its body becomes
`raise NotImplementedError("exercise: <name>, see docs/chapters/<stage>.md#<section>")`. The
snippet markers stay, so `--solution` can splice the original sections back in.

The tests import the stage as `stages.<stage>`; with `EXERCISE_STAGE_DIR=<copy>` set,
tests/conftest.py binds that name to the copy instead (and to nothing else), so the stage's own
tests are the red-to-green checker. `exercises/` is git-ignored: the copy is the reader's.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ROOT / "stages"
CHAPTERS = ROOT / "docs" / "chapters"
DEFAULT_OUT = ROOT / "exercises"
ENV_VAR = "EXERCISE_STAGE_DIR"  # read by tests/conftest.py
MARKER = re.compile(r"^\s*# --8<-- \[(?P<kind>start|end):(?P<name>[\w-]+)\]\s*$")
INCLUDE = re.compile(r'^\s*--8<-- "stages/(?P<stage>[^/"]+)/(?P<file>[^":]+\.py):(?P<name>[\w-]+)"\s*$')
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<title>.+?)\s*$")


class ExerciseError(Exception):
    """A bad request (unknown stage, no chapter, a copy already there): one line for the reader."""


@dataclass(frozen=True)
class Region:
    """A snippet section the chapter includes: where it is taught and which file holds it."""

    file: str  # relative to the stage folder
    name: str
    section: str  # the chapter heading the include sits under
    anchor: str  # that heading's id on the site


@dataclass(frozen=True)
class Stub:
    region: Region
    function: str  # qualified name, e.g. RadixCache.match
    line: int  # of the `def` in the stubbed file


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


def chapter_regions(stage: Path) -> tuple[Path, list[Region]]:
    """The snippet sections of this stage that its chapter includes, in the chapter's order."""
    chapter = CHAPTERS / f"{stage.name}.md"
    if not chapter.is_file():
        raise ExerciseError(f"stage {stage.name} has no chapter ({chapter.relative_to(ROOT)} is missing)")
    regions: list[Region] = []
    section = anchor = ""
    in_fence = False  # a `# comment` in a code block is no heading
    for line in chapter.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_fence = not in_fence
        elif not in_fence and (m := HEADING.match(line)):
            section, anchor = m["title"], slugify(m["title"])
        elif (m := INCLUDE.match(line)) and m["stage"] == stage.name:
            region = Region(m["file"], m["name"], section, anchor)
            if region not in regions:
                regions.append(region)
    return chapter, regions


def region_lines(lines: list[str], name: str) -> tuple[int, int]:
    """1-based line numbers of the start and end markers of section `name`."""
    start = end = 0
    for i, line in enumerate(lines, 1):
        if (m := MARKER.match(line)) and m["name"] == name:
            if m["kind"] == "start":
                start = i
            elif start:
                end = i
                break
    if not (start and end):
        raise ExerciseError(f"no snippet section {name!r} in the file")
    return start, end


# ---------------------------------------------------------------------------------------------
# Stubbing


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function with its qualified name, outer ones before those nested in them."""
    out: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.<locals>.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _has_docstring(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    first = fn.body[0]
    return (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )


def _trivial(statements: list[ast.stmt]) -> bool:
    """`pass` or `...`: nothing to write."""
    return all(
        isinstance(s, ast.Pass)
        or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and s.value.value is ...)
        for s in statements
    )


def stub_message(region: Region, chapter: Path) -> str:
    return f"exercise: {region.name}, see {chapter.relative_to(ROOT).as_posix()}#{region.anchor}"


def stub_file(source: str, regions: list[Region], chapter: Path) -> tuple[str, list[Stub]]:
    """Replace the bodies of the functions that lie wholly inside `regions` (all in this file)."""
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    functions = _functions(tree)
    cuts: list[tuple[int, int, str]] = []  # (first body line, last line, replacement), 1-based
    stubs: list[Stub] = []
    done: set[str] = set()  # a function inside two nested sections is stubbed once
    for region in regions:
        start, end = region_lines(lines, region.name)
        covered_until = 0  # a function nested in one already stubbed goes with it
        for qualname, fn in functions:
            first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
            assert fn.end_lineno is not None
            if first < start or fn.end_lineno > end or fn.lineno <= covered_until or qualname in done:
                continue
            body = fn.body[1:] if _has_docstring(fn) else fn.body
            if not body or _trivial(body) or body[0].lineno == fn.lineno:
                continue  # nothing to write, or a one-line `def f(): return x` (left as it is)
            indent = lines[body[0].lineno - 1][: body[0].col_offset]
            raise_line = f'{indent}raise NotImplementedError("{stub_message(region, chapter)}")\n'
            cuts.append((body[0].lineno, fn.end_lineno, raise_line))
            stubs.append(Stub(region, qualname, fn.lineno))
            covered_until = fn.end_lineno
            done.add(qualname)
    for first, last, replacement in sorted(cuts, reverse=True):
        lines[first - 1 : last] = [replacement]
    ast.parse("".join(lines))  # the stubbed file must still import
    # Line numbers after the cuts above each stub, for the listing.
    shifted = []
    for stub in stubs:
        removed = sum(last - first for first, last, _ in cuts if last < stub.line)
        shifted.append(Stub(stub.region, stub.function, stub.line - removed))
    return "".join(lines), shifted


def splice_originals(exercise: str, original: str, names: list[str]) -> str:
    """Put the original text of the snippet sections `names` back into the exercise file."""
    ex_lines, orig_lines = exercise.splitlines(keepends=True), original.splitlines(keepends=True)
    for name in names:
        start, end = region_lines(ex_lines, name)
        o_start, o_end = region_lines(orig_lines, name)
        ex_lines[start : end - 1] = orig_lines[o_start : o_end - 1]
    return "".join(ex_lines)


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
    for file, file_regions in by_file(regions).items():
        path = target / file
        text, file_stubs = stub_file(path.read_text(encoding="utf-8"), file_regions, chapter)
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
            f"no exercise at {shown(target)}: run `python scripts/exercise.py {stage.name}` first"
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
    files = sorted(ROOT.glob(f"tests/test_stage{number}*.py"))
    return [f.relative_to(ROOT).as_posix() for f in files if not f.stem.endswith("_gpu")]


def shown(path: Path) -> str:
    """A path as the reader would type it from the repository root."""
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def test_command(stage: Path, target: Path) -> str:
    tests = " ".join(stage_tests(stage))
    return f'{ENV_VAR}={shown(target)} python -m pytest -q -m "not gpu and not multi_gpu" {tests}'


def run_check(stage: Path, out: Path, pytest_args: list[str]) -> int:
    target = out / stage.name
    if not target.is_dir():
        raise ExerciseError(
            f"no exercise at {shown(target)}: run `python scripts/exercise.py {stage.name}` first"
        )
    env = {**os.environ, ENV_VAR: str(target.resolve())}
    command = [sys.executable, "-m", "pytest", "-q", "-m", "not gpu and not multi_gpu", *stage_tests(stage)]
    return subprocess.run([*command, *pytest_args], cwd=ROOT, env=env).returncode


def print_stubs(stage: Path, out: Path, stubs: list[Stub]) -> None:
    target = out / stage.name
    chapter = (CHAPTERS / f"{stage.name}.md").relative_to(ROOT).as_posix()
    print(f"{len(stubs)} stubs to write in {shown(target)}/; read {chapter}, section:")
    rows = [(f"{s.region.file}:{s.line}", s.function, f"[{s.region.name}]", s) for s in stubs]
    widths = [max((len(row[i]) for row in rows), default=0) for i in range(3)]
    for where, function, region, stub in rows:
        columns = "  ".join(
            text.ljust(width) for text, width in zip((where, function, region), widths, strict=True)
        )
        print(f"  {columns}  {stub.region.section} (#{stub.region.anchor})")
    print("\nThe stage's tests check them (red until every stub is written):")
    print(f"  make exercise-check STAGE={stage.name[:2]}")
    print(f"  {test_command(stage, target)}")
    print(
        f"Stuck? python scripts/exercise.py {stage.name[:2]} --solution --region NAME puts one section back."
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
