"""Stage 03 — a radix prefix cache: shared prompt prefixes are computed once.

Requests that share a prefix (a system prompt, the earlier turns of a chat, few-shot examples)
reuse its KV pages instead of recomputing them. A radix tree over token ids (radix_cache.py) maps
prefixes to the pages that hold their K and V; at admission the scheduler matches the longest
cached prefix, starts the request's page table with those pages and prefills only the rest (a
full hit still computes the last prompt token, for its logits). A request's whole pages go into
the tree once its prompt is prefilled and again when it finishes, so a chat's next turn finds
its history. Pages in use are locked; unlocked leaves are evicted, least recently used first,
when the pool runs dry. Each request reports its `cached_tokens`.

Changed from stage 02: scheduler.py (admission matches and locks the prefix, allocation evicts,
requests hand their pages to the cache), engine.py (the `cache` option, insertion after prefill),
request.py (which pages are shared), __main__.py (`--cache`). New: radix_cache.py. Turn the
feature off: `--cache naive` recomputes every prompt, as stage 02 does.
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


CHANGED_FILES: tuple[str, ...] = ("__main__.py", "engine.py", "radix_cache.py", "request.py", "scheduler.py")

__all__ = ["LLM", "CHANGED_FILES"]
