"""The "build it yourself" track (scripts/exercise.py): a stage copy with its chapter's code stubbed.

- Every stubbed file parses, keeps every function's signature, decorators and docstring, and only
  the functions inside the chapter's snippet sections change (each to one NotImplementedError).
- The stage's own tests, pointed at the copy by EXERCISE_STAGE_DIR (tests/conftest.py), fail on a
  stub; after `--solution` the same tests pass, and the copy equals the stage again.
"""

from __future__ import annotations

import ast
import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import exercise
from tests import ROOT

STAGE = ROOT / "stages" / "03_radix_cache"
# Fast tree tests that reach match, insert, split and evict: a second or two, not the engine tests.
SUBSET = [
    "-x",
    "-p",
    "no:cacheprovider",
    "-k",
    "insert_split_and_match_as_drawn or evict_takes_least_recently_used",
]


def functions(path: Path) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return dict(exercise._functions(ast.parse(path.read_text(encoding="utf-8"))))


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return ast.dump(ast.Module([type(fn)(fn.name, fn.args, [], fn.decorator_list, fn.returns)], []))


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[exercise.Stub]]:
    out = tmp_path_factory.mktemp("exercises")
    return out, exercise.make_exercise(STAGE, out)


def test_stubs_keep_signatures_docstrings_and_markers(copy):
    out, stubs = copy
    _, regions = exercise.chapter_regions(STAGE)
    stubbed = {(s.region.file, s.function) for s in stubs}
    # Every section the chapter includes from this stage got at least one stub.
    assert {r.name for r in regions} == {s.region.name for s in stubs}
    assert ("radix_cache.py", "RadixCache.match") in stubbed and ("engine.py", "LLM.step") in stubbed
    for original in sorted(STAGE.rglob("*.py")):
        rel = original.relative_to(STAGE).as_posix()
        copied = out / STAGE.name / rel
        if rel not in {r.file for r in regions}:
            assert filecmp.cmp(original, copied, shallow=False), f"{rel} is not taught, yet changed"
            continue
        before, after = functions(original), functions(copied)
        assert before.keys() - after.keys() <= {
            name for name in before if any(name.startswith(f"{f}.<locals>.") for _, f in stubbed)
        }, f"{rel} lost a function"
        for name, fn in after.items():
            assert signature(fn) == signature(before[name]), f"{rel}: {name}'s signature changed"
            assert ast.get_docstring(fn) == ast.get_docstring(before[name])
            body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
            if (rel, name) in stubbed:
                assert len(body) == 1 and isinstance(body[0], ast.Raise), f"{rel}: {name} is not one raise"
                message = ast.literal_eval(body[0].exc.args[0])  # type: ignore[union-attr]
                assert message.startswith("exercise: ") and "docs/chapters/03_radix_cache.md#" in message
            else:
                assert ast.dump(fn) == ast.dump(before[name]), f"{rel}: {name} is not taught, yet changed"
        text = copied.read_text(encoding="utf-8")
        for region in (r for r in regions if r.file == rel):  # the chapter's includes still resolve
            assert f"# --8<-- [start:{region.name}]" in text and f"# --8<-- [end:{region.name}]" in text


def run_subset(out: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, exercise.ENV_VAR: str(out / STAGE.name), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-q", "tests/stages/test_stage03_radix.py", *SUBSET]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_stage_tests_go_red_on_the_stubs_and_green_with_the_solution(tmp_path):
    script = [sys.executable, str(ROOT / "scripts" / "exercise.py"), "03", "--out", str(tmp_path)]
    made = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert "RadixCache.match" in made.stdout and "make exercise-check STAGE=03" in made.stdout

    red = run_subset(tmp_path)
    assert red.returncode == 1, red.stdout + red.stderr
    assert "NotImplementedError: exercise: " in red.stdout
    # The copy ran, not the stage. pytest names a file by its shortest path from the root, so
    # relative when the temporary folder is near the checkout (CI's clone in /tmp), else absolute.
    copy = tmp_path / STAGE.name / "radix_cache.py"
    assert str(copy) in red.stdout or os.path.relpath(copy, ROOT) in red.stdout, red.stdout

    # A second run refuses to overwrite the reader's work.
    again = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "--force" in again.stderr

    restored = subprocess.run([*script, "--solution"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert restored.returncode == 0, restored.stderr
    green = run_subset(tmp_path)
    assert green.returncode == 0 and "2 passed" in green.stdout, green.stdout + green.stderr
    for original in STAGE.rglob("*.py"):
        copied = tmp_path / STAGE.name / original.relative_to(STAGE)
        assert filecmp.cmp(original, copied, shallow=False), f"{copied} differs from the stage"


def test_stage_names_and_bad_requests():
    assert exercise.find_stage("3") == exercise.find_stage("03_radix_cache") == STAGE
    with pytest.raises(exercise.ExerciseError, match="no stage"):
        exercise.find_stage("99")
    _, regions = exercise.chapter_regions(STAGE)
    with pytest.raises(exercise.ExerciseError, match="no region"):
        exercise.select(regions, ["nope"])
    assert exercise.slugify("Pages and the page table") == "pages-and-the-page-table"


@pytest.mark.parametrize("stage", sorted(p.name for p in (ROOT / "stages").iterdir() if p.name[:2].isdigit()))
def test_every_stub_points_to_the_section_that_explains_it(stage):
    """Not to "The code", where every include sits: to a section of the chapter that exists."""
    chapter, regions = exercise.chapter_regions(ROOT / "stages" / stage)
    lines = chapter.read_text(encoding="utf-8").splitlines()
    headings = {exercise.slugify(m["title"]) for line in lines if (m := exercise.HEADING.match(line))}
    for region in regions:
        assert region.anchor != "the-code" and region.anchor in headings, (region.name, region.anchor)
    if stage == "05_cuda_graph":
        found = {r.name: r.section for r in regions}
        assert found["sizes"] == "Padding, and which sizes" and found["graph_memory"].startswith(
            "Capture before"
        )


def test_the_gpu_only_and_untested_marks_are_what_the_cpu_tests_reach(tmp_path):
    """Stage 05's CPU tests, traced: the stubs they never call are exactly those marked GPU only or
    no test, and the six GPU-only ones are CudaGraph's and FlashInferBackend's."""
    stage = ROOT / "stages" / "05_cuda_graph"
    stubs = exercise.make_exercise(stage, tmp_path)
    trace = tmp_path / "trace.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CALL_TRACE_ROOT": str(stage.resolve()),
        "CALL_TRACE_OUT": str(trace),
    }
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.fixtures.call_trace", "-p", "no:cacheprovider",
         "-m", "not gpu and not multi_gpu", *exercise.stage_tests(stage)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:]
    called = {(Path(f).resolve(), line) for f, line in json.loads(trace.read_text())}
    defs = {}
    for stub in stubs:
        fn = dict(exercise.functions(ast.parse((stage / stub.region.file).read_text())))[stub.function]
        defs[stub.function] = (stage / stub.region.file).resolve(), fn.lineno
    unreached = {s.function for s in stubs if defs[s.function] not in called}
    assert unreached == {s.function for s in stubs if s.checked_by != "cpu"}
    gpu = {s.function for s in stubs if s.checked_by == "gpu"}
    assert gpu == {f"{c}.{m}" for c in ("CudaGraph",) for m in ("__init__", "capture", "replay")} | {
        f"FlashInferBackend.{m}"
        for m in ("graph_unsupported_reason", "prepare_for_capture", "prepare_for_replay")
    }
    stubbed = (tmp_path / "05_cuda_graph" / "graph.py").read_text()
    assert "exercise: cuda_graph (only a GPU test checks it), see docs/chapters/05_cuda_graph.md#" in stubbed


def test_the_check_runs_the_conformance_suite_against_the_copy(tmp_path):
    script = [sys.executable, str(ROOT / "scripts" / "exercise.py"), "03", "--out", str(tmp_path)]
    made = subprocess.run(script, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0 and "tests/engines/test_conformance.py -k 03_radix_cache" in made.stdout, (
        made.stdout
    )
    # -k selects no test of the stage's own files, and the conformance suite's greedy tests of 03.
    check = [*script, "--check", "-k", "test_greedy_tokens_match_hf", "-p", "no:cacheprovider"]
    red = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert red.returncode == 1 and "NotImplementedError: exercise: " in red.stdout, red.stdout[-3000:]
    assert "stages.03_radix_cache" in red.stdout and "stages.04_chunked_prefill" not in red.stdout
    subprocess.run([*script, "--solution"], cwd=ROOT, check=True, capture_output=True, timeout=120)
    green = subprocess.run(check, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert green.returncode == 0, green.stdout[-3000:]


def test_the_readers_keyword_narrows_the_conformance_selection():
    assert exercise.with_keyword([], "03_radix_cache") == ["-k", "03_radix_cache"]
    assert exercise.with_keyword(["-x", "-k", "drawn"], "03_radix_cache") == [
        "-x",
        "-k",
        "(03_radix_cache) and (drawn)",
    ]
