"""final/'s package layout: imports flow one way, server -> ... -> core, and there are no cycles."""

from __future__ import annotations

import ast
from pathlib import Path

from tests import ROOT

FINAL = ROOT / "final"


# ---------------------------------------------------------------------------------------------
# Layout: imports flow one way, server -> ... -> core, and there are no cycles.

# A package may import only from packages of a lower rank (or from itself).
RANKS = {
    "core": 0,
    "kernels": 1,  # GPU kernels with their torch references: kvcache, models, attention, engine use them
    "distributed": 2,
    "kvcache": 2,
    "models": 3,
    "attention": 3,
    "scheduler": 4,
    "engine": 5,
    "runtime": 6,  # build_engine and process management (the engine process, the ranks)
    "frontend": 7,
    "server": 8,
    "shell": 8,
    "": 9,  # top-level modules (llm.py, args.py, __main__.py)
}


def final_modules() -> dict[str, Path]:
    out = {}
    for path in FINAL.rglob("*.py"):
        if "__pycache__" in path.parts:
            continue
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Modules of final/ that `module` imports (relative imports resolved), at any depth of the file."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            names = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in RANKS) else ""


def test_every_final_package_has_a_rank():
    packages = {p.name for p in FINAL.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages <= set(RANKS), f"give these packages a rank in RANKS: {packages - set(RANKS)}"


def test_imports_flow_one_way():
    modules = final_modules()
    bad = []
    for module, path in modules.items():
        src = layer_of(module)
        for target in imports_of(module, path, set(modules)):
            dst = layer_of(target)
            if target == "final" or (dst != src and RANKS[dst] >= RANKS[src]):
                bad.append(f"{module} ({src or 'top'}) imports {target} ({dst or 'top'})")
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_import_cycles():
    modules = final_modules()
    graph = {m: imports_of(m, p, set(modules)) for m, p in modules.items()}
    # A package's __init__ importing its own modules is how packages work, not a cycle.
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(nxt) :] + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_layering_check_catches_a_violation(tmp_path):
    """The checker must be able to fail: a core module importing the server."""
    fake = tmp_path / "final" / "core"
    fake.mkdir(parents=True)
    (fake / "bad.py").write_text("from ..server import app\nfrom final.scheduler import x\n")
    known = {"final.server", "final.server.app", "final.scheduler", "final.core", "final.core.bad"}
    found = imports_of("final.core.bad", fake / "bad.py", known)
    assert found == {"final.server", "final.server.app", "final.scheduler"}
    assert all(RANKS[layer_of(t)] > RANKS["core"] for t in found)


MAX_LINES = 300  # issue 25: a file a reader takes in at one sitting


def too_long(root: Path) -> list[str]:
    return [
        f"{path.relative_to(root).as_posix()}: {n} lines"
        for path in sorted(root.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]


def test_no_file_of_final_is_over_300_lines():
    assert too_long(FINAL) == [], "split these files"


def test_the_length_check_sees_a_long_file(tmp_path):
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert too_long(tmp_path) == [f"long.py: {MAX_LINES + 1} lines"]
