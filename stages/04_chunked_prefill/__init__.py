"""Stage 04 — chunked prefill: prompts split under a per-step token budget.

A long prompt prefilled in one step needs activation memory proportional to its length and stalls
every running decode for the whole step. Here a step computes at most `--max-prefill-length`
prompt tokens: a longer prompt is cut into chunks over several steps, its KV appended chunk by
chunk, and several short prompts share one step's budget. By default (`--chunk-policy mixed`) each
step also carries one token for every decoding request, so decodes never wait behind a prompt
(Sarathi-Serve's idea); `--chunk-policy prefill-first` keeps stage 03's order for comparison. A
request enters the prefix cache only once its whole prompt is in, so no other request can match
pages a chunk has not filled yet.

Changed from stage 03: scheduler.py (budget, chunks, the two policies), engine.py (a cut prompt
samples nothing; the new options), request.py (`Batch.sampled`), runner.py (logits only for
sampled requests), __main__.py (`--max-prefill-length`, `--chunk-policy`). Turn the feature off:
`--max-prefill-length` larger than any prompt with `--chunk-policy prefill-first`.
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


CHANGED_FILES: tuple[str, ...] = ("__main__.py", "engine.py", "request.py", "runner.py", "scheduler.py")

__all__ = ["LLM", "CHANGED_FILES"]
