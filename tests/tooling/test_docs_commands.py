"""Every shell command the docs tell a reader to type must work as written.

We read the ```bash blocks of README.md and docs/**/*.md and check each simple command:

- `make TARGET ...`: every target exists in the Makefile;
- `python -m stages.XX ...`, `python -m stages.common.* ...`, `python -m final ...`: the module
  exists and its argument parser accepts the arguments (its `parse_args(argv)` when it has one,
  else `--help` in a subprocess, whose text must name every option the command uses); commands
  of `final` are skipped, with a reason, until `final/` is a package;
- `python -m scripts.X ...`: the module exists (scripts/ is a package run from the root: a
  `python scripts/X.py ...` is refused and told its module form); `python -m pytest PATH ...`: the
  test path exists.

Nothing is executed beyond argument parsing, so the check is fast and needs no model.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import ROOT

SHELL_LANGUAGES = {"bash", "sh", "shell"}
CHECKED_MODULE = re.compile(r"^(stages\.\d\d_\w+|stages\.common\.\w+|final)(\.\w+)*$")
PYTHON = re.compile(r"^(.*/)?python(3(\.\d+)?)?$")
ENV_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
SEPARATORS = {"&&", "||", ";", "|", "&", "(", ")"}
REDIRECTIONS = {">", ">>", "<", ">&", "<&", "&>"}
GENERATED_PATH_PREFIXES = ("build/",)  # made by a make target (e.g. `make notebooks`), not committed


@dataclass(frozen=True)
class Command:
    where: str  # file:line, for messages and test ids
    argv: tuple[str, ...]

    @property
    def text(self) -> str:
        return shlex.join(self.argv)


# ---------------------------------------------------------------------------------------------
# Reading the commands out of markdown


def shell_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of every fenced bash/sh/shell block.

    A fence closes only with a fence of the same character that is at least as long, so a bash
    block shown inside a longer ````markdown fence (as the generated diffs do) is content, not a
    block of its own. Fences may be indented (inside admonitions and list items).
    """
    blocks: list[tuple[int, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        language = m["info"].strip().split(" ")[0].lstrip(".").lower() if m["info"].strip() else ""
        start = i + 1
        i += 1
        body: list[str] = []
        while i < len(lines):
            close = FENCE.match(lines[i])
            if (
                close
                and close["fence"][0] == fence[0]
                and len(close["fence"]) >= len(fence)
                and not close["info"].strip()
            ):
                break
            body.append(lines[i][indent:] if lines[i][:indent].isspace() else lines[i].lstrip())
            i += 1
        i += 1
        if language in SHELL_LANGUAGES:
            blocks.append((start + 1, body))
    return blocks


def logical_lines(body: list[str], first_line: int) -> list[tuple[int, str]]:
    """Join backslash continuations and multi-line quotes; drop `$ ` prompts and blank lines."""
    out: list[tuple[int, str]] = []
    pending, pending_line = "", 0
    for offset, raw in enumerate(body):
        line = raw.rstrip()
        if not pending:
            pending_line = first_line + offset
            line = line.removeprefix("$ ")
        pending = f"{pending}\n{line}" if pending else line
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the command goes on on the next line
            continue
        if pending.strip():
            out.append((pending_line, pending))
        pending = ""
    if pending.strip():
        out.append((pending_line, pending))
    return out


def simple_commands(line: str) -> list[list[str]]:
    """Split one shell line at `&&`, `;`, `|` into argv lists, without env assignments and redirections."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    skip_next = False
    for token in lexer:
        if skip_next:
            skip_next = False
            continue
        if token in SEPARATORS:
            commands.append([])
        elif token in REDIRECTIONS:
            skip_next = True  # the redirection's target
            if commands[-1] and commands[-1][-1].isdigit():
                commands[-1].pop()  # the file descriptor of `2>/dev/null`
        elif not commands[-1] and ENV_ASSIGNMENT.match(token):
            continue  # FOO=bar python ...
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def commands_in(path: Path) -> list[Command]:
    rel = path.relative_to(ROOT).as_posix()
    found: list[Command] = []
    for first_line, body in shell_blocks(path.read_text(encoding="utf-8")):
        for lineno, line in logical_lines(body, first_line):
            for argv in simple_commands(line):
                found.append(Command(f"{rel}:{lineno}", tuple(argv)))
    return found


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


# ---------------------------------------------------------------------------------------------
# Checking one command


def makefile_targets(makefile: Path = ROOT / "Makefile") -> set[str]:
    targets: set[str] = set()
    for line in makefile.read_text(encoding="utf-8").splitlines():
        if line.startswith(("\t", "#", " ")) or "$" in line.split(":")[0]:
            continue
        m = re.match(r"^([^:=#]+?)\s*::?(?!=)", line)
        if m:
            names = m[1].split()
            if names and names[0] != ".PHONY":
                targets.update(n for n in names if not n.startswith("."))
            elif names:  # .PHONY: a b c
                targets.update(line.split(":", 1)[1].split())
    return targets


def check_make(argv: list[str], targets: set[str]) -> str | None:
    wanted = [a for a in argv[1:] if not a.startswith("-") and "=" not in a]
    missing = [t for t in wanted if t not in targets]
    if missing:
        return f"make target(s) {missing} not in the Makefile (targets: {', '.join(sorted(targets))})"
    return None


def _parse_with(module_name: str, args: list[str]) -> str | None:
    """Call the module's `parse_args(args)`; return argparse's complaint, or None when it accepts."""
    module = importlib.import_module(module_name)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            module.parse_args(args)
    except SystemExit as exit_:
        if exit_.code not in (0, None):
            return f"its argument parser rejects the arguments: {err.getvalue().strip().splitlines()[-1:]}"
    except Exception as error:
        # Parsed, then refused by the settings' own checks (final's parse_args builds a validated
        # EngineConfig): the docs show such refusals on purpose, and the parser accepted the words.
        if type(error).__name__ != "UserError":
            raise
    return None


def _parse_with_help(module: str, args: list[str]) -> str | None:
    """No parse_args to import: run `--help`, and require every option used to be in its text."""
    if not args:
        return None  # nothing to check beyond the module existing (and `--help` may do real work)
    proc = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    if proc.returncode != 0:
        return f"`python -m {module} --help` failed: {proc.stderr.strip()[-500:]}"
    unknown = [a.split("=")[0] for a in args if a.startswith("--") and a.split("=")[0] not in proc.stdout]
    if unknown:
        return f"options {unknown} are not in `python -m {module} --help`"
    return None


def check_python_module(module: str, args: list[str]) -> str | None:
    if module.split(".")[0] == "scripts":
        try:
            found = module != "scripts" and importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        return None if found else f"no module {module} (scripts/{module.partition('.')[2]}.py)"
    if not CHECKED_MODULE.match(module):
        if module == "pytest":
            return check_pytest_paths(args)
        return None  # pip, venv, mkdocs...: not ours to check
    if module.split(".")[0] == "final" and not (ROOT / "final" / "__init__.py").is_file():
        pytest.skip(f"final/ is not a package yet, so `python -m {module}` cannot be checked")
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        return f"no module {module}"
    entry = f"{module}.__main__" if spec.submodule_search_locations else module
    if spec.submodule_search_locations and importlib.util.find_spec(entry) is None:
        return f"{module} is a package without __main__.py: `python -m {module}` cannot run"
    if hasattr(importlib.import_module(entry), "parse_args"):
        return _parse_with(entry, args)
    return _parse_with_help(module, args)


def check_pytest_paths(args: list[str]) -> str | None:
    takes_value = {"-k", "-m", "-p", "-c", "-o", "--rootdir", "--deselect", "--ignore", "-W", "--maxfail"}
    missing = []
    previous = ""
    for arg in args:
        if not arg.startswith("-") and previous not in takes_value:
            path = arg.split("::")[0]
            if not path.startswith(GENERATED_PATH_PREFIXES) and not (ROOT / path).exists():
                missing.append(path)
        previous = arg
    return f"pytest paths {missing} do not exist" if missing else None


def check_command(argv: list[str] | tuple[str, ...], targets: set[str] | None = None) -> str | None:
    """What is wrong with one simple command, or None. Commands we do not own pass."""
    argv = list(argv)
    if argv[0] == "make":
        return check_make(argv, makefile_targets() if targets is None else targets)
    if not PYTHON.match(argv[0]):
        return None
    rest = argv[1:]
    while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
        rest = rest[1:]  # interpreter options such as -u or -X dev
    if not rest or rest[0] == "-c":
        return None
    if rest[0] == "-m":
        if len(rest) < 2:
            return "`python -m` without a module"
        return check_python_module(rest[1], rest[2:])
    script = rest[0]
    if script.endswith(".py") and not (ROOT / script).is_file():
        return f"script {script} does not exist"
    if script.startswith("scripts/") and script.endswith(".py"):
        module = script.removesuffix(".py").replace("/", ".")
        return f"scripts/ is a package: run `python -m {module}` from the repository root"
    return None


# ---------------------------------------------------------------------------------------------
# The tests

ALL_COMMANDS = [c for path in doc_files() for c in commands_in(path)]
CHECKED = [c for c in ALL_COMMANDS if c.argv[0] == "make" or (PYTHON.match(c.argv[0]) and len(c.argv) > 1)]


def test_the_docs_have_commands_to_check() -> None:
    makes = [c for c in CHECKED if c.argv[0] == "make"]
    stages_cmds = [c for c in CHECKED if "-m" in c.argv and "stages." in " ".join(c.argv)]
    assert makes and stages_cmds, "found no make or `python -m stages...` commands: is the extractor broken?"


@pytest.mark.parametrize("command", CHECKED, ids=[f"{c.where} {c.text[:60]}" for c in CHECKED])
def test_doc_command_is_accepted(command: Command) -> None:
    problem = check_command(command.argv)
    assert problem is None, f"{command.where}: `{command.text}`: {problem}"


# Self-tests: the checker must be able to fail.

BOGUS_DOC = """
Some prose with `python -m stages.01_naive_generate --inline` (inline code is not checked).

```bash
make ask PROMPT="Why is the sky blue?"   # a make variable is not a target
make no-such-target
python -m stages.01_naive_generate --chat --prompt hi \\
    --no-such-flag "x"
SERVING_CACHE_DIR=/tmp/x python -m stages.02_paged_kv --num-pages lots --prompt "a"
. .venv/bin/activate && python -m stages.99_not_a_stage --prompt hi
python scripts/no_such_script.py --check
python -m scripts.no_such_script --check
python scripts/propagate.py --check
python -m scripts.propagate --check
python -m pytest tests/stages/test_no_such_file.py -k 02
python -m stages.02_paged_kv --prompt "a b" 2>/dev/null | tee answers.txt
```

```python
python -m stages.01_naive_generate --ignored-in-a-python-block
```

!!! tip
    ```bash
    python -m stages.01_naive_generate --prompt "an indented block" --max-tokens many
    ```

````markdown
```bash
make also-ignored-inside-a-longer-fence
```
````
"""


def test_extraction_handles_continuations_env_chains_and_fences(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(BOGUS_DOC)
    blocks = shell_blocks(BOGUS_DOC)
    assert len(blocks) == 2  # the python block and the nested bash block are not shell blocks
    argvs = [
        argv for _, body in blocks for _, line in logical_lines(body, 1) for argv in simple_commands(line)
    ]
    assert argvs == [
        ["make", "ask", "PROMPT=Why is the sky blue?"],
        ["make", "no-such-target"],
        ["python", "-m", "stages.01_naive_generate", "--chat", "--prompt", "hi", "--no-such-flag", "x"],
        ["python", "-m", "stages.02_paged_kv", "--num-pages", "lots", "--prompt", "a"],
        [".", ".venv/bin/activate"],
        ["python", "-m", "stages.99_not_a_stage", "--prompt", "hi"],
        ["python", "scripts/no_such_script.py", "--check"],
        ["python", "-m", "scripts.no_such_script", "--check"],
        ["python", "scripts/propagate.py", "--check"],
        ["python", "-m", "scripts.propagate", "--check"],
        ["python", "-m", "pytest", "tests/stages/test_no_such_file.py", "-k", "02"],
        ["python", "-m", "stages.02_paged_kv", "--prompt", "a b"],
        ["tee", "answers.txt"],
        ["python", "-m", "stages.01_naive_generate", "--prompt", "an indented block", "--max-tokens", "many"],
    ]


def test_bogus_commands_are_caught() -> None:
    argvs = [argv for _, body in shell_blocks(BOGUS_DOC) for _, line in logical_lines(body, 1)
             for argv in simple_commands(line)]  # fmt: skip
    problems = {shlex.join(a): check_command(a) for a in argvs}
    expected = {  # command -> a piece of the complaint (None: the command is fine)
        "make ask 'PROMPT=Why is the sky blue?'": None,
        ". .venv/bin/activate": None,
        "make no-such-target": "no-such-target",
        # argparse's own complaints come through: an unknown flag, a value of the wrong type
        "python -m stages.01_naive_generate --chat --prompt hi --no-such-flag x": "--no-such-flag",
        "python -m stages.02_paged_kv --num-pages lots --prompt a": "lots",
        "python -m stages.01_naive_generate --prompt 'an indented block' --max-tokens many": "many",
        "python -m stages.99_not_a_stage --prompt hi": "no module stages.99_not_a_stage",
        "python scripts/no_such_script.py --check": "scripts/no_such_script.py does not exist",
        "python -m scripts.no_such_script --check": "no module scripts.no_such_script",
        "python scripts/propagate.py --check": "python -m scripts.propagate",
        "python -m scripts.propagate --check": None,
        "python -m pytest tests/stages/test_no_such_file.py -k 02": "tests/stages/test_no_such_file.py",
        "python -m stages.02_paged_kv --prompt 'a b'": None,
        "tee answers.txt": None,
    }
    assert set(problems) == set(expected)
    for command, needle in expected.items():
        if needle is None:
            assert problems[command] is None, (command, problems[command])
        else:
            assert problems[command] is not None and needle in problems[command], (command, problems[command])


def test_good_commands_pass_and_help_is_accepted() -> None:
    for argv in (
        ["python", "-m", "stages.01_naive_generate", "--help"],
        ["python", "-m", "stages.01_naive_generate", "--chat", "--prompt", "What is the capital of France?"],
        ["python", "-m", "stages.02_paged_kv", "--prompt", "a", "--prompt", "b", "--num-pages", "8"],
        ["make", "test"],
    ):
        assert check_command(argv) is None, argv
    assert check_command(["python", "-m", "stages.01_naive_generate"]) is not None  # --prompt is required


def test_makefile_targets_are_read_exactly() -> None:
    targets = makefile_targets()
    assert {"run", "test", "notebooks", "docs", "docs-gen"} <= targets
    assert not any(t.startswith(("$", ".")) or "=" in t for t in targets)


def test_missing_final_is_a_visible_skip() -> None:
    if (ROOT / "final" / "__init__.py").is_file():
        pytest.skip("final/ is a package: `python -m final` commands are checked for real")
    with pytest.raises(pytest.skip.Exception, match="final/ is not a package yet"):
        check_command(["python", "-m", "final", "--help"])
