"""Measured numbers in the book's prose, read from the result files when the site is built.

A page quotes a measurement with a macro instead of typing it:

    Replayed, the step takes {{ result("stage05_decode_b1_graphs_h200", "decode_step_ms") }} ms,
    {{ ratio(value("stage05_decode_b1_eager_h200", "decode_step_ms"),
             value("stage05_decode_b1_graphs_h200", "decode_step_ms")) }} shorter than eager
    ({{ measured_on("stage05_decode_b1_graphs_h200") }}).

scripts/mkdocs_hooks.py expands every macro of a page before Markdown sees it (so a number in a
table cell or a plot's caption works the same), and a macro naming a result, a metric or a profile
that does not exist stops the build with the page, the macro and what does exist. What a macro
may say is a small expression language, parsed with `ast` and evaluated here (never `eval`):
string and number constants, `+ - * /`, and the functions of `Numbers.functions()`:

- `value(name, key)`: a result's number: a metric (`decode_step_ms`), `config.X`, or `repeats`;
- `profile(name, key)` / `profile(name, mode, key)`: a decode-step profile's number (its `steps`,
  `batch`; per mode `step_ms`, `gpu_busy_ms`, ..., and the idle breakdown of
  scripts/render_profile.py: `idle_before_first_ms`, `idle_between_ms`, `first_to_last_ms`,
  `long_gaps`, `max_gap_us`, `done_ms`);
- `result(name, key, digits=None)`: `value` formatted as the tables format it (or to `digits`);
- `fmt(x, digits=None)`, `ratio(x, y, digits=None)` (`1.28×`), `pct(part, whole, digits=0)`
  (`9%`), `least(x, ...)`, `most(x, ...)`;
- `date(name)`, `measured_on(name, ...)` ("one H200, 2026-11-23, torch 2.11.0, FlashInfer
  0.7.2.post1, one run each"), `version(name, package)`;
- `rows(prefix, suffix="")`: the results a prefix (and suffix) name, with their runs ("`mixed 2048` (one run) and
  `unchunked` (one run)"), and `when(name, key, yes, no)`: text that depends on whether a result
  has a metric, so a page reads right before and after the run that adds it.

Text inside a macro is scanned for typed numbers like the rest of the page (tests/tooling/test_docs_numbers.py).

A name is a result's `name` (benchmarks/results/**) or a profile's path under benchmarks/profiles
without `.json` (`h200/stage06_decode_step_b64_cuda`).

Files that mkdocs does not build (README.md) cannot run a macro when they are read, so their
figures live in a *numbers block*: a template in an HTML comment, and after it the text that
`make docs-gen` writes from the template (`python -m scripts.docs_numbers README.md`):

    <!-- numbers: template (...)
    final/ serves {{ fmt(value("versus_minisgl_h200", "offline_final") / 1000, 1) }}k tok/s ...
    -->

    final/ serves 21.2k tok/s ...

    <!-- /numbers -->

`--check` exits 1 when a file's text differs from its template's expansion (the results changed
or someone edited the text), and tests/tooling/test_docs_numbers.py fails the same way.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts import render_profile
from scripts.results_model import (
    Result,
    ResultError,
    device_of,
    format_metric,
    format_ratio,
    load_results,
    short_label,
)

RESULTS_DIR = Path("benchmarks/results")
PROFILES_DIR = Path("benchmarks/profiles")
FUNCTIONS = ("value", "profile", "result", "fmt", "ratio", "pct", "least", "most", "date", "measured_on",
             "version", "rows", "when")  # fmt: skip
# `{{ name(...) }}` with one of our functions: anything else in double braces is left alone.
MACRO = re.compile(r"\{\{\s*((?:" + "|".join(FUNCTIONS) + r")\b.*?)\s*\}\}", re.S)
PACKAGES = {
    "torch": "torch",
    "flashinfer": "FlashInfer",
    "flash_attn": "flash-attn",
    "transformers": "transformers",
}
COUNT_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


class NumbersError(ValueError):
    """A macro that cannot be evaluated: unknown name or key, or an expression we do not allow."""


class Numbers:
    """The results and profiles of one checkout, and the functions a macro may call."""

    def __init__(self, results: list[Result], profiles: dict[str, dict[str, Any]]):
        self.results: dict[str, Result] = {}
        for r in results:
            if r.name in self.results:
                raise NumbersError(
                    f"two result files are named {r.name!r}: {self.results[r.name].path}, {r.path}"
                )
            self.results[r.name] = r
        self.profiles = profiles

    @classmethod
    def load(cls, root: Path) -> Numbers:
        return _load(Path(root).resolve(), _stamp(Path(root).resolve()))

    # -- lookup --------------------------------------------------------------------------------

    def _result(self, name: str) -> Result:
        if name not in self.results:
            close = sorted(n for n in self.results if n.split("_")[0] == name.split("_")[0])
            hint = f" (results of that group: {', '.join(close)})" if close else ""
            raise NumbersError(f"no result named {name!r} under {RESULTS_DIR}{hint}")
        return self.results[name]

    def _profile(self, name: str) -> dict[str, Any]:
        if name not in self.profiles:
            raise NumbersError(
                f"no profile named {name!r} under {PROFILES_DIR} (there are: {', '.join(sorted(self.profiles))})"
            )
        return self.profiles[name]

    def _source(self, name: str) -> tuple[dict[str, Any], dict[str, Any], str, int]:
        """(hardware, versions, timestamp, repeats) of a result or a profile."""
        if name in self.results:
            r = self.results[name]
            return r.hardware, r.versions, r.timestamp, self.value(name, "repeats")
        if name in self.profiles:
            p = self.profiles[name]
            return p["hardware"], p["versions"], p["timestamp"], 1
        raise NumbersError(f"no result or profile named {name!r} under {RESULTS_DIR} or {PROFILES_DIR}")

    # -- the functions of a macro ---------------------------------------------------------------

    def value(self, name: str, key: str) -> float:
        r = self._result(name)
        if key == "repeats":
            return len(r.runs) if r.runs else int(r.config.get("repeats", 1))
        if key.startswith("config."):
            setting = key.removeprefix("config.")
            if not isinstance(r.config.get(setting), (int, float)) or isinstance(r.config.get(setting), bool):
                raise NumbersError(f"result {name!r} has no numeric setting {setting!r} (config: {r.config})")
            return float(r.config[setting])
        if key not in r.metrics:
            raise NumbersError(f"result {name!r} has no metric {key!r} (it has: {', '.join(r.metrics)})")
        return r.metrics[key]

    def profile(self, name: str, first: str, second: str | None = None) -> float:
        p = self._profile(name)
        if second is None:
            if not isinstance(p.get(first), (int, float)):
                raise NumbersError(f"profile {name!r} has no number {first!r}")
            return float(p[first])
        if first not in p["modes"]:
            raise NumbersError(f"profile {name!r} has no mode {first!r} (it has: {', '.join(p['modes'])})")
        mode = p["modes"][first]
        numbers = {k: v for k, v in mode.items() if isinstance(v, (int, float))}
        numbers.update(render_profile.idle_breakdown(mode))
        if second not in numbers:
            raise NumbersError(
                f"profile {name!r}, mode {first!r}, has no {second!r} (it has: {', '.join(numbers)})"
            )
        return float(numbers[second])

    def result(self, name: str, key: str, digits: int | None = None) -> str:
        return self.fmt(self.value(name, key), digits)

    @staticmethod
    def fmt(x: float, digits: int | None = None) -> str:
        """As the tables write it (`format_metric`), or with `digits` decimals; thousands separated."""
        return format_metric(float(x)) if digits is None else f"{float(x):,.{int(digits)}f}"

    @staticmethod
    def ratio(x: float, y: float, digits: int | None = None) -> str:
        """`x / y` as `1.28×`: as the tables write ratios, or with `digits` decimals."""
        if y == 0:
            raise NumbersError("ratio(): division by zero")
        return format_ratio(x / y) if digits is None else f"{x / y:.{int(digits)}f}×"

    @staticmethod
    def least(*xs: float) -> float:
        return min(xs)

    @staticmethod
    def most(*xs: float) -> float:
        return max(xs)

    @staticmethod
    def pct(part: float, whole: float, digits: int = 0) -> str:
        if whole == 0:
            raise NumbersError("pct(): division by zero")
        return f"{100 * part / whole:.{int(digits)}f}%"

    def date(self, name: str) -> str:
        return self._source(name)[2][:10]

    def version(self, name: str, package: str) -> str:
        versions = self._source(name)[1]
        if package not in versions:
            raise NumbersError(f"{name!r} records no version of {package!r} (it has: {', '.join(versions)})")
        return str(versions[package]).split("+")[0]

    def measured_on(self, *names: str) -> str:
        """Where and when: "one H200, 2026-11-23, torch 2.11.0, FlashInfer 0.7.2.post1, one run
        each" (dates joined when they differ, the repeats counted: "the median of three runs")."""
        if not names:
            raise NumbersError("measured_on() needs at least one name")
        sources = [self._source(n) for n in names]
        places = []
        for hardware, _, _, _ in sources:
            device = device_of(_as_result(hardware))
            gpus = int(hardware.get("gpu_count") or 1)
            if device != "CPU" and gpus > 1:  # a run on one GPU of them, or tensor-parallel over several
                place = f"a host of {COUNT_WORDS.get(gpus, gpus)} {device}s"
            elif device != "CPU":
                place = f"one {device}"
            elif hardware.get("cpu_cores"):
                place = f"a {hardware['cpu_cores']}-core {hardware['cpu']}"
            else:
                place = f"a {hardware['cpu']}"
            places.append(place)
        where = " and ".join(dict.fromkeys(places))
        dates = sorted({ts[:10] for _, _, ts, _ in sources})
        when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
        packages = []
        for key, title in PACKAGES.items():
            found = sorted({str(v[key]).split("+")[0] for _, v, _, _ in sources if key in v})
            if found and key != "transformers":
                packages.append(f"{title} {' and '.join(found)}")
        repeats = sorted({n for _, _, _, n in sources})
        each = " each" if len(names) > 1 else ""
        if repeats == [1]:
            runs = f"one run{each}"
        elif len(repeats) == 1:
            runs = f"the median of {COUNT_WORDS.get(repeats[0], repeats[0])} runs{each}"
        else:
            runs = f"the median of {repeats[0]} to {repeats[-1]} runs{each}"
        return ", ".join([where, when, *packages, runs])

    def rows(self, prefix: str, suffix: str = "") -> str:
        """The results whose name starts with `prefix` (and ends with `suffix`), as their tables label them, with their
        runs: "`mixed 2048` (one run) and `unchunked` (one run)". For a sentence that must say
        which configurations have results whatever files exist."""
        found = [r for name, r in self.results.items() if name.startswith(prefix) and name.endswith(suffix)]
        if not found:
            raise NumbersError(f"no result's name starts with {prefix!r} and ends with {suffix!r}")
        parts = []
        for r in found:
            n = int(self.value(r.name, "repeats"))
            runs = "one run" if n == 1 else f"the median of {COUNT_WORDS.get(n, n)} runs"
            parts.append(f"`{short_label(r)}` ({runs})")
        return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]

    def when(self, name: str, key: str, yes: str, no: str) -> str:
        """`yes` if result `name` exists and has the metric `key`, else `no`: prose that reads the
        results as they are, before and after a run that adds a metric or a configuration."""
        found = self.results.get(name)
        return yes if found is not None and key in found.metrics else no

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {name: getattr(self, name) for name in FUNCTIONS}


def _as_result(hardware: dict[str, Any]) -> Result:
    """A stand-in Result for device_of, which reads only the hardware."""
    return Result("", "", "", "", {}, {}, hardware, {}, "", "")


# ---------------------------------------------------------------------------------------------
# Evaluating a macro


_OPERATORS: dict[type, Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


def evaluate(expression: str, numbers: Numbers) -> Any:
    """The value of one macro's expression, allowing only constants, arithmetic and our functions."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise NumbersError(f"not an expression: {exc.msg}") from None
    functions = numbers.functions()

    def walk(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if not all(isinstance(x, (int, float)) for x in (left, right)):
                raise NumbersError("arithmetic needs numbers: use value() or profile(), not result()")
            if isinstance(node.op, ast.Div) and right == 0:
                raise NumbersError("division by zero")
            return _OPERATORS[type(node.op)](left, right)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
            args = [walk(a) for a in node.args]
            kwargs = {k.arg: walk(k.value) for k in node.keywords if k.arg}
            try:
                return functions[node.func.id](*args, **kwargs)
            except TypeError as exc:
                raise NumbersError(f"{node.func.id}(): {exc}") from None
        raise NumbersError(
            f"not allowed in a macro: {ast.unparse(node)!r} (functions: {', '.join(FUNCTIONS)})"
        )

    return walk(tree.body)


# Code shows a macro as written (an example of the syntax), so macros in code are left alone.
CODE = re.compile(r"^([ \t]*)(```|~~~)[^\n]*\n.*?^\1\2[ \t]*$|`[^`\n]+`", re.S | re.M)


def expand(markdown: str, numbers: Numbers, where: str) -> str:
    """Every macro of a page (outside code) replaced by its text; a macro that fails names the
    page, its line and itself."""
    code = [m.span() for m in CODE.finditer(markdown)]

    def replace(match: re.Match[str]) -> str:
        if any(start <= match.start() < end for start, end in code):
            return match.group(0)
        try:
            out = evaluate(match.group(1), numbers)
        except NumbersError as exc:
            line = markdown.count("\n", 0, match.start()) + 1
            raise NumbersError(f"{where}:{line}: {{{{ {match.group(1)} }}}}: {exc}") from None
        return out if isinstance(out, str) else Numbers.fmt(out)

    return MACRO.sub(replace, markdown)


def macros(markdown: str) -> list[re.Match[str]]:
    """The macros of a page that `expand` evaluates (not those shown in code)."""
    code = [m.span() for m in CODE.finditer(markdown)]
    return [m for m in MACRO.finditer(markdown) if not any(s <= m.start() < e for s, e in code)]


# ---------------------------------------------------------------------------------------------
# Loading, once per state of the result files (mkdocs serve rebuilds often)


def _stamp(root: Path) -> tuple[tuple[str, float], ...]:
    files = sorted((root / RESULTS_DIR).glob("**/*.json")) + sorted((root / PROFILES_DIR).glob("**/*.json"))
    return tuple((str(p), p.stat().st_mtime) for p in files)


@functools.lru_cache(maxsize=2)
def _load(root: Path, stamp: tuple[tuple[str, float], ...]) -> Numbers:
    try:
        results = load_results(root / RESULTS_DIR)
    except ResultError as exc:
        raise NumbersError(str(exc)) from None
    profiles = render_profile.load_profiles(root) if (root / PROFILES_DIR).is_dir() else {}
    return Numbers(results, profiles)


# ---------------------------------------------------------------------------------------------
# Numbers blocks: figures in files that mkdocs does not build (README.md)


BLOCK = re.compile(
    r"(?P<head><!-- numbers: template[^\n]*\n(?P<template>.*?)\n-->\n)\n(?P<text>.*?)\n\n(?P<end><!-- /numbers -->)",
    re.S,
)


def render_blocks(text: str, numbers: Numbers, where: str) -> str:
    """`text` with the text of every numbers block written from its template."""

    def render(match: re.Match[str]) -> str:
        line = text.count("\n", 0, match.start("template"))
        # Errors name the file's line: pad the template to where it starts.
        expanded = expand("\n" * line + match.group("template"), numbers, where)[line:]
        return f"{match.group('head')}\n{_reflow(expanded)}\n\n{match.group('end')}"

    return BLOCK.sub(render, text)


def block_templates(text: str) -> str:
    """`text` with each numbers block's written text blanked and its template left as plain text
    (lines kept): what a scan for numbers typed by hand should read."""

    def blank(match: re.Match[str]) -> str:
        block, start = match.group(0), match.start()
        opening = block[: block.index("\n")]
        after = block[match.end("template") - start :]
        return _spaces(opening) + "\n" + match.group("template") + _spaces(after)

    return BLOCK.sub(blank, text)


def _reflow(text: str, width: int = 100) -> str:
    """Each plain paragraph filled to `width` columns (a macro's number is shorter than the macro,
    so the template's line breaks leave ragged lines); lists, tables, headings and code as written."""
    paragraphs = []
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        if re.match(r"\s*([-*+]\s|\d+\.\s|[|#>]|```|~~~)", paragraph):
            paragraphs.append(paragraph)
        else:
            paragraphs.append(textwrap.fill(" ".join(paragraph.split()), width, break_long_words=False,
                                            break_on_hyphens=False))  # fmt: skip
    return "\n\n".join(paragraphs)


def _spaces(text: str) -> str:
    return re.sub(r"[^\n]", " ", text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the numbers blocks of files mkdocs does not build.")
    parser.add_argument("files", nargs="*", default=["README.md"], help="default: README.md")
    parser.add_argument("--check", action="store_true", help="exit 1 if a block's text is out of date")
    parser.add_argument(
        "--root", type=Path, default=Path(__file__).resolve().parents[1], help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    root = args.root.resolve()
    try:
        numbers = Numbers.load(root)
        stale = []
        for name in args.files:
            path = root / name
            text = path.read_text(encoding="utf-8")
            if not BLOCK.search(text):
                print(f"error: {name} has no numbers block", file=sys.stderr)
                return 2
            fresh = render_blocks(text, numbers, name)
            if fresh == text:
                print(f"same     {name}")
            elif args.check:
                stale.append(name)
                print(f"out of date: {name}")
            else:
                path.write_text(fresh, encoding="utf-8", newline="\n")
                print(f"wrote    {name}")
    except NumbersError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if stale:
        print("run make docs-gen", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
