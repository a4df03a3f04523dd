"""final/ imports nothing from stages/, so some of its code is a copy of the stages'. Copies meant
to stay identical are pinned here: a fix to one must reach the other.

- whole files, byte for byte (PINNED);
- definitions (PINNED_DEFINITIONS): the named functions and classes, compared as code (their AST:
  comments aside, and an import inside them compared by the names it imports, since final/'s
  packages are laid out differently), where the files around them differ (imports, docstrings,
  final/'s additions);
- final/'s RequestOutput, which has vLLM's shape besides, holds every field of the stages' one
  (a script written against a stage runs against final/).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import ROOT

LAST_STAGE = "stages/07_tensor_parallel"

# final's file -> the stages' file it must equal, byte for byte.
PINNED = {
    "final/core/model_config.py": "stages/common/model_config.py",
}

# (final's file, the stages' file, the definitions both must hold alike)
PINNED_DEFINITIONS = [
    ("final/models/source.py", "stages/common/model_source.py", ("resolve_model", "_looks_like_hub_id", "_download")),
    ("final/models/default_model.py", "stages/common/default_model.py",
     ("cache_dir", "default_model_dir", "find_gguf", "ensure_default_model", "_convert")),
    ("final/core/errors.py", "stages/common/errors.py", ("UserError", "run_cli")),
    ("final/core/devices.py", "stages/common/devices.py",
     ("pick_device", "pick_dtype", "usable_cpus", "cpu_threads", "set_cpu_threads")),
    ("final/core/flags.py", "stages/common/cli.py", ("FlagParser",)),
    ("final/models/rope.py", f"{LAST_STAGE}/rope.py", ("rope_frequencies", "_llama3", "_yarn")),
    ("final/models/weights.py", "stages/common/weights.py", ("checkpoint_files",)),
    ("final/engine/graph.py", f"{LAST_STAGE}/graph.py", ("capture_sizes", "padded_size")),
    ("final/kvcache/radix_cache.py", f"{LAST_STAGE}/radix_cache.py", ("TreeNode", "_common_length")),
    ("final/distributed/group.py", f"{LAST_STAGE}/ranks.py", ("parse_address",)),
    ("final/scheduler/request.py", f"{LAST_STAGE}/request.py", ("Status",)),
    # The stages' top-p mask once lacked the fix for a top_p that float32 rounds to 0 (final/ had it).
    ("final/engine/sampling_reference.py", "stages/common/sampling.py", ("top_p_mask", "min_p_mask")),
]  # fmt: skip


def definitions(path: Path) -> dict[str, str]:
    """Top-level functions and classes of a file, as comparable text."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom):  # where from depends on the package layout
                    inner.module, inner.level = None, 0
            out[node.name] = ast.dump(node)
    return out


@pytest.mark.parametrize("ours, theirs", sorted(PINNED.items()))
def test_pinned_copies_are_identical(ours, theirs):
    assert (ROOT / ours).read_bytes() == (ROOT / theirs).read_bytes(), (
        f"{ours} and {theirs} must stay identical: apply the change to both"
    )


@pytest.mark.parametrize(
    ("ours", "theirs", "names"), PINNED_DEFINITIONS, ids=[p[0] for p in PINNED_DEFINITIONS]
)
def test_pinned_definitions_are_identical(ours, theirs, names):
    mine, stages = definitions(ROOT / ours), definitions(ROOT / theirs)
    for name in names:
        assert name in mine and name in stages, f"{name} is gone from {ours} or {theirs}: update the pin"
        assert mine[name] == stages[name], (
            f"{name} differs between {ours} and {theirs}: apply the change to both"
        )


def test_a_changed_definition_is_caught(tmp_path):
    """The checker must be able to fail: the same function, one constant apart."""
    (tmp_path / "a.py").write_text(
        "from ..core.errors import E\n\ndef f():\n    from .x import y\n    return 1\n"
    )
    (tmp_path / "b.py").write_text(
        "from .errors import E\n\ndef f():\n    from ..z.x import y\n    return 1\n"
    )
    (tmp_path / "c.py").write_text("def f():\n    from .x import y\n    return 2\n")
    assert definitions(tmp_path / "a.py") == definitions(tmp_path / "b.py")  # imports aside
    assert definitions(tmp_path / "a.py") != definitions(tmp_path / "c.py")


def test_final_request_output_holds_every_field_of_the_stages_one():
    import dataclasses

    from final.core.outputs import RequestOutput as FinalOutput
    from stages.common.outputs import RequestOutput as StageOutput

    theirs = [(f.name, f.type) for f in dataclasses.fields(StageOutput)]
    mine = [(f.name, f.type) for f in dataclasses.fields(FinalOutput)]
    assert mine[: len(theirs)] == theirs, "the stages' fields, in their order (positional callers)"
