"""final/ imports nothing from stages/, so some of its files are copies of stages/common's. Those
meant to stay identical are pinned here: a fix to one must reach the other."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# final's file -> the stages' file it must equal, byte for byte.
PINNED = {
    "final/core/model_config.py": "stages/common/model_config.py",
}


@pytest.mark.parametrize("ours, theirs", sorted(PINNED.items()))
def test_pinned_copies_are_identical(ours, theirs):
    assert (ROOT / ours).read_bytes() == (ROOT / theirs).read_bytes(), (
        f"{ours} and {theirs} must stay identical: apply the change to both"
    )
