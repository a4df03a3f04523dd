"""Stage 05 — CUDA graphs: decode steps recorded once per batch size and replayed.

A decode step of a small model is about a thousand short kernels, and on a GPU the host takes
longer to launch them than the GPU takes to run them. Here the runner records one decode step
per batch size (1, 2, 4, 8, then every 8 up to `--cuda-graph-max-bs`) as a CUDA graph, all in one
shared memory pool, and replays it with a single launch. A step's inputs go into static buffers
first (token ids, positions, page-table rows; FlashInfer's page lists, planned on the host before
each replay); a batch is padded to the next captured size with rows that write into a padding
page no request owns, and only the real rows' logits come back. Prefill and mixed steps run
eagerly. The graphs' memory is measured before the KV cache is sized, so it stays inside
`--memory-ratio`. On a CPU there are no graphs: decode runs eagerly, with one log line.

Changed from stage 04: graph.py (new: capture sizes, padding, the static buffers, capture and
replay, and a CPU stand-in for a graph), runner.py (the padding page and row, the graphs' memory
counted before sizing the KV cache, decode steps replayed), attention/base.py (the capture and
replay hooks), attention/torch_backend.py (a fixed-shape decode for graphs),
attention/flashinfer_backend.py (graph-mode decode wrappers over static buffers), engine.py and
__main__.py (`--cuda-graph-max-bs`). Turn the feature off: `--cuda-graph-max-bs 0`.
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
    "attention/base.py",
    "attention/flashinfer_backend.py",
    "attention/torch_backend.py",
    "engine.py",
    "graph.py",
    "runner.py",
)

__all__ = ["LLM", "CHANGED_FILES"]
