"""The stubbing half of scripts/exercise.py: which functions a chapter's sections hold, what each
stub becomes, which of them only a GPU can check, and splicing the originals back.

A stub can only be checked on a GPU when the CPU tests never run it: every method of a class that
a CPU cannot construct (its `__init__` creates a CUDA object or imports a GPU library, outside any
condition: stage 05's `CudaGraph`, every stage's `FlashInferBackend`). A stub that no test runs
at all is a base-class default every subclass of the stage overrides (stage 05's
`AttentionBackend.prepare_for_replay`): written for completeness, checked by nothing.
tests/tooling/test_exercise.py traces stage 05's CPU tests to confirm both rules.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

MARKER = re.compile(r"^\s*# --8<-- \[(?P<kind>start|end):(?P<name>[\w-]+)\]\s*$")
GPU_LIBRARIES = ("flashinfer", "flash_attn")
Function = ast.FunctionDef | ast.AsyncFunctionDef


class ExerciseError(Exception):
    """A bad request (unknown stage, no chapter, a copy already there): one line for the reader."""


@dataclass(frozen=True)
class Region:
    """A snippet section the chapter includes: which file holds it, and where it is explained."""

    file: str  # relative to the stage folder
    name: str
    section: str  # the chapter section that explains it
    anchor: str  # that section's id on the site


@dataclass(frozen=True)
class Stub:
    region: Region
    function: str  # qualified name, e.g. RadixCache.match
    line: int  # of the `def` in the stubbed file
    checked_by: str = "cpu"  # "cpu", "gpu" (only a GPU runs it) or "none" (no test runs it)


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


def functions(tree: ast.Module) -> list[tuple[str, Function]]:
    """Every function with its qualified name, outer ones before those nested in them."""
    out: list[tuple[str, Function]] = []

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


def _has_docstring(fn: Function) -> bool:
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


# ---------------------------------------------------------------------------------------------
# Which test can check a stub


def _unconditional(node: ast.AST):
    """The nodes below `node` that run whenever it runs: not under an `if` or a conditional expression."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If | ast.IfExp | ast.FunctionDef | ast.Lambda):
            continue
        yield child
        yield from _unconditional(child)


def _needs_gpu(fn: Function) -> bool:
    """The function always creates a CUDA object (`torch.cuda.X(...)`) or imports a GPU library."""
    for node in _unconditional(fn):
        if isinstance(node, ast.Call) and ast.unparse(node.func).startswith("torch.cuda."):
            return True
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            if any(str(n).split(".")[0] in GPU_LIBRARIES for n in names):
                return True
    return False


def gpu_only_classes(tree: ast.Module) -> set[str]:
    """Classes a CPU cannot construct: their `__init__` needs a GPU."""
    return {
        cls.name
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        and any(isinstance(f, ast.FunctionDef) and f.name == "__init__" and _needs_gpu(f) for f in cls.body)
    }


def overridden_everywhere(trees: list[ast.Module]) -> set[str]:
    """`Class.method` of a base class whose every subclass in the stage defines the method too."""
    classes = [c for tree in trees for c in ast.walk(tree) if isinstance(c, ast.ClassDef)]
    methods = {c.name: {f.name for f in c.body if isinstance(f, ast.FunctionDef)} for c in classes}
    out: set[str] = set()
    for base in classes:
        subclasses = [c for c in classes if any(ast.unparse(b).split(".")[-1] == base.name for b in c.bases)]
        if subclasses:
            out |= {
                f"{base.name}.{m}"
                for m in methods[base.name]
                if all(m in methods[c.name] for c in subclasses)
            }
    return out


def checked_by(qualname: str, gpu_classes: set[str], unreached: set[str]) -> str:
    owner = qualname.split(".")[0]
    if qualname in unreached:
        return "none"
    return "gpu" if owner in gpu_classes else "cpu"


# ---------------------------------------------------------------------------------------------
# Stubbing and restoring


def stub_message(region: Region, chapter: Path, root: Path, checked: str = "cpu") -> str:
    note = {"gpu": " (only a GPU test checks it)", "none": " (no test checks it)"}.get(checked, "")
    return f"exercise: {region.name}{note}, see {chapter.relative_to(root).as_posix()}#{region.anchor}"


def stub_file(
    source: str, regions: list[Region], chapter: Path, root: Path, stage_trees: list[ast.Module] | None = None
) -> tuple[str, list[Stub]]:
    """Replace the bodies of the functions that lie wholly inside `regions` (all in this file)."""
    lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    gpu_classes = gpu_only_classes(tree)
    unreached = overridden_everywhere(stage_trees or [tree])
    cuts: list[tuple[int, int, str]] = []  # (first body line, last line, replacement), 1-based
    stubs: list[Stub] = []
    done: set[str] = set()  # a function inside two nested sections is stubbed once
    for region in regions:
        start, end = region_lines(lines, region.name)
        covered_until = 0  # a function nested in one already stubbed goes with it
        for qualname, fn in functions(tree):
            first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
            assert fn.end_lineno is not None
            if first < start or fn.end_lineno > end or fn.lineno <= covered_until or qualname in done:
                continue
            body = fn.body[1:] if _has_docstring(fn) else fn.body
            if not body or _trivial(body) or body[0].lineno == fn.lineno:
                continue  # nothing to write, or a one-line `def f(): return x` (left as it is)
            checked = checked_by(qualname, gpu_classes, unreached)
            indent = lines[body[0].lineno - 1][: body[0].col_offset]
            message = stub_message(region, chapter, root, checked)
            cuts.append((body[0].lineno, fn.end_lineno, f'{indent}raise NotImplementedError("{message}")\n'))
            stubs.append(Stub(region, qualname, fn.lineno, checked))
            covered_until = fn.end_lineno
            done.add(qualname)
    for first, last, replacement in sorted(cuts, reverse=True):
        lines[first - 1 : last] = [replacement]
    ast.parse("".join(lines))  # the stubbed file must still import
    # Line numbers after the cuts above each stub, for the listing.
    shifted = []
    for stub in stubs:
        removed = sum(last - first for first, last, _ in cuts if last < stub.line)
        shifted.append(Stub(stub.region, stub.function, stub.line - removed, stub.checked_by))
    return "".join(lines), shifted


def splice_originals(exercise: str, original: str, names: list[str]) -> str:
    """Put the original text of the snippet sections `names` back into the exercise file."""
    ex_lines, orig_lines = exercise.splitlines(keepends=True), original.splitlines(keepends=True)
    for name in names:
        start, end = region_lines(ex_lines, name)
        o_start, o_end = region_lines(orig_lines, name)
        ex_lines[start : end - 1] = orig_lines[o_start : o_end - 1]
    return "".join(ex_lines)
