"""The Makefile and the GPU host's scripts name only what exists.

- `.PHONY` lists exactly the Makefile's targets that are not files: a name with no rule (issue 25
  found `test-cpu`) or a rule left out of it fails;
- every test file they name (`make unit`'s UNIT_TESTS, the GPU steps of scripts/gpu_run.sh) and
  every `python -m scripts.NAME` they run exists, so a moved test or a renamed script cannot
  leave a step that selects nothing.
"""

from __future__ import annotations

import re

from tests import ROOT

MAKEFILE = ROOT / "Makefile"
SHELL_SCRIPTS = sorted((ROOT / "scripts").glob("*.sh"))
RULE = re.compile(r"^(?P<targets>[^\s:=#][^:=]*?)\s*::?(?!=)")


def phony_and_rules(text: str) -> tuple[set[str], set[str]]:
    """(the names .PHONY lists, the targets of rules that make no file)."""
    phony: set[str] = set()
    rules: set[str] = set()
    for line in text.replace("\\\n", " ").splitlines():
        m = RULE.match(line)
        if not m:
            continue
        names = m["targets"].split()
        if names == [".PHONY"]:
            phony.update(line.split(":", 1)[1].split())
        elif not names[0].startswith("."):
            # A file target: a variable ($(STAMP)), a pattern (build/%.ipynb) or a path.
            rules.update(n for n in names if not any(c in n for c in "$%/"))
    return phony, rules


def test_phony_lists_exactly_the_targets_that_make_no_file() -> None:
    phony, rules = phony_and_rules(MAKEFILE.read_text(encoding="utf-8"))
    assert phony - rules == set(), f".PHONY names targets with no rule: {sorted(phony - rules)}"
    assert rules - phony == set(), f"targets missing from .PHONY: {sorted(rules - phony)}"


def test_the_check_sees_a_phony_name_without_a_rule_and_a_rule_without_phony() -> None:
    text = ".PHONY: test test-cpu\ntest: model\n\tpytest\nlint:\n\truff\n$(STAMP): x\n\ttouch\nbuild/%.ipynb: a\n"
    phony, rules = phony_and_rules(text)
    assert phony - rules == {"test-cpu"} and rules - phony == {"lint"}


def named_paths(text: str) -> tuple[set[str], set[str]]:
    """(test files, `scripts.NAME` modules) that a Makefile or shell script names."""
    tests = set(re.findall(r"\btests/[\w/]+\.py\b", text))
    modules = set(re.findall(r"-m (scripts\.\w+)", text))
    return tests, modules


def test_every_test_file_and_script_module_named_exists() -> None:
    missing = []
    for path in [MAKEFILE, *SHELL_SCRIPTS]:
        tests, modules = named_paths(path.read_text(encoding="utf-8"))
        missing += [f"{path.name}: {t}" for t in sorted(tests) if not (ROOT / t).is_file()]
        missing += [
            f"{path.name}: python -m {m}"
            for m in sorted(modules)
            if not (ROOT / f"{m.replace('.', '/')}.py").is_file()
        ]
    assert not missing, "named but missing:\n" + "\n".join(missing)


def test_make_unit_runs_the_unit_files() -> None:
    unit = re.search(r"^UNIT_TESTS := (.*?)\n(?=\S)", MAKEFILE.read_text(encoding="utf-8"), re.M | re.S)
    assert unit, "no UNIT_TESTS in the Makefile"
    files = unit[1].replace("\\", " ").split()
    assert len(files) >= 10 and all(f.startswith("tests/") and f.endswith(".py") for f in files), files
