"""A serving process's start-up heap, taken out of the garbage collector's full scans.

CPython frees almost everything by reference counting; its cyclic collector is the backstop, and
a collection of its oldest generation stops the whole process while it walks every tracked
object alive. A serving process holds hundreds of thousands of them from start-up on (torch,
the model's modules, the tokenizer, FastAPI's routes), none of which is ever garbage, and while
a full collection walks them no frame is written and no step is scheduled
(scripts/bench_gc_freeze.py measures the pause per process). It comes whenever enough objects
have outlived the young collections, which requests in flight do. SGLang traced 100-300 ms
server stalls to it
(https://github.com/sgl-project/sglang/pull/9241) and vLLM freezes its engine's heap after
start-up (https://github.com/vllm-project/vllm/pull/24008).

`gc.freeze()` moves every object alive into a permanent generation that collections skip: the
objects stay, reference counting still frees them, and a later collection walks only what was
allocated since. Each process of the server calls `freeze_startup_heap` once, when it is ready
to serve: the API process, the detokenizer process, the engine process and each tensor-parallel
rank (runtime/worker.py). Cycles among the frozen objects are never collected; start-up makes few,
and a `gc.collect()` first frees those it has.

The offline `LLM` runs in its caller's process, which may drop an engine (a cycle of graphs and
backend holding GPU memory) and build another: a freeze for the process's life would keep the
dropped one's memory forever. `heap_frozen` freezes for one `generate` call instead and
unfreezes at its end: no collection walks the engine during the run, and nothing stays frozen.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FrozenHeap:
    objects: int  # frozen: no full collection walks them again
    collect_before_ms: float  # a full collection over the whole heap (the pause a freeze saves)
    collect_after_ms: float  # one right after the freeze: what the heap costs a collection now


def freeze_startup_heap(process: str) -> FrozenHeap:
    """Collect once (timed: the pause a full collection costs this process), freeze what is left,
    collect again (timed: what it costs now), and log both on one line."""
    start = time.perf_counter()
    gc.collect()
    collected = time.perf_counter()
    gc.freeze()
    frozen = time.perf_counter()
    gc.collect()
    done = time.perf_counter()
    heap = FrozenHeap(gc.get_freeze_count(), (collected - start) * 1e3, (done - frozen) * 1e3)
    log.info(
        "%s: %d start-up objects frozen out of garbage collection: a full collection took %.1f ms, now %.1f ms",
        process,
        heap.objects,
        heap.collect_before_ms,
        heap.collect_after_ms,
    )
    return heap


@contextmanager
def heap_frozen() -> Iterator[None]:
    """Everything alive now out of full collections until the block ends (gc.freeze and
    gc.unfreeze move lists, not objects: both take microseconds). In a process that froze its
    heap already (a server process) it does nothing: unfreezing would undo that freeze."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
