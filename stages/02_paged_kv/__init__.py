"""Stage 02 — paged KV cache and continuous batching.

Many requests at once. Their K and V live in one pool of fixed-size pages (kv_cache.py); a page
table (page_table.py) maps each request's positions to slots; a scheduler (scheduler.py) admits
new requests into the running batch every step and retires finished ones at once, preempting the
newest request when the pool runs dry; attention backends (attention/) read the pages directly:
`torch` (reference, any device) and `fi` (FlashInfer, CUDA).

Changed from stage 01: kv_cache.py (the page pool replaces the contiguous buffer), model.py
(attention goes through a backend, one forward computes a whole batch), engine.py (add_request /
step / generate), __main__.py (a batch of prompts). New: page_table.py, request.py, scheduler.py,
runner.py, attention/. Turn the feature off: `--max-running-requests 1` serves one at a time.
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


CHANGED_FILES: tuple[str, ...] = (
    "__main__.py", "engine.py", "kv_cache.py", "model.py", "page_table.py", "request.py", "runner.py",
    "scheduler.py", "attention/__init__.py", "attention/base.py", "attention/torch_backend.py",
    "attention/flashinfer_backend.py",
)  # fmt: skip

__all__ = ["LLM", "CHANGED_FILES"]
