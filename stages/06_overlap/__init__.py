"""Stage 06 — overlap scheduling: the host schedules step N+1 while the GPU runs step N.

After stage 05 a step's GPU work is short, and the host's work around it (processing the tokens,
stop checks, detokenizing, scheduling and preparing the next step) leaves the GPU idle. Here a step
is schedule -> launch -> process, processed one step late: the tokens sampled in step N stay on
the GPU, in a token table indexed by page-table row, and step N+1 reads its inputs from there, so
the host launches it without waiting for step N; then it processes step N's tokens (copied back
through pinned memory) while step N+1 runs. A request that finishes at step N may already sit in
step N+1: that token is dropped, and the request's pages go back only once step N+1 is complete.
The invariants are in engine.py's docstring. The launch path has no host synchronisation left:
copies go through pinned memory, FlashInfer's page lists are built without asking the device, and
sampling keeps its tensors on the GPU. Servers get `LLM.abort(rid)`.

Changed from stage 05: engine.py (launch and process, the overlapped loop, abort, the switch),
scheduler.py (pending tokens, NeedsDrain, deferred release, abort), request.py (pending tokens),
runner.py (the token table, pinned copies), graph.py (input tokens read from the token table),
page_table.py (pinned writes, page lists without a sync), attention/flashinfer_backend.py (the
plan waits for its previous copy, no sync), __main__.py (`--overlap`, `--disable-overlap`). Turn
the feature off: `--disable-overlap`, `LLM(disable_overlap=True)` or STAGE06_DISABLE_OVERLAP=1 (it
is off on the CPU unless asked for: `--overlap on`).
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
    "__main__.py",
    "attention/flashinfer_backend.py",
    "engine.py",
    "graph.py",
    "page_table.py",
    "request.py",
    "runner.py",
    "scheduler.py",
)

__all__ = ["LLM", "CHANGED_FILES"]
