"""The engines under test: every stage folder, and final/ once it exists."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
STAGES: list[str] = sorted(p.name for p in (ROOT / "stages").iterdir() if p.is_dir() and p.name[:2].isdigit())
ENGINES: list[str] = [f"stages.{s}" for s in STAGES] + (["final"] if (ROOT / "final").is_dir() else [])


def load(module: str) -> ModuleType:
    return importlib.import_module(module)
