"""Stage 01 — the naive generate loop.

One request at a time: the prompt goes through the model once (prefill), filling a contiguous
KV cache; then each new token goes through alone (decode), reading everything cached. This is
the baseline every later stage is measured against.

Files: model.py (the decoder), rope.py (rotary embeddings), kv_cache.py (contiguous cache),
engine.py (the generate loop and the offline `LLM` API), __main__.py (the command line).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import LLM


def __getattr__(name: str):
    # The engine (and torch) load on first use, so `python -m <stage> --help` answers at once.
    if name == "LLM":
        from .engine import LLM

        return LLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


CHANGED_FILES: tuple[str, ...] = ("__main__.py", "engine.py", "kv_cache.py", "model.py", "rope.py")

__all__ = ["LLM", "CHANGED_FILES"]
