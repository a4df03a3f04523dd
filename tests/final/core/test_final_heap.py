"""core/heap.py: a process's start-up heap frozen out of full garbage collections (run in a child
process: freezing pytest's own heap would outlive the test)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref

from tests import ROOT

CHILD = """
import gc, json, logging
logging.basicConfig(level="INFO")
startup = [[i] for i in range(300_000)]  # a large long-lived heap, as torch and a model make
gc.collect()
tracked_before = len(gc.get_objects(generation=2))
from final.core.heap import freeze_startup_heap
heap = freeze_startup_heap("child")
print(json.dumps({"objects": heap.objects, "before": heap.collect_before_ms, "after": heap.collect_after_ms,
                  "tracked_before": tracked_before, "tracked_after": len(gc.get_objects(generation=2)),
                  "freeze_count": gc.get_freeze_count()}))
"""


def test_the_startup_heap_leaves_the_collectors_scans_and_a_full_collection_gets_cheap():
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["tracked_before"] > 300_000
    assert got["objects"] == got["freeze_count"] >= 300_000  # everything alive is frozen ...
    assert got["tracked_after"] < 1_000  # ... and the oldest generation is all but empty
    assert got["after"] < got["before"] / 10  # a full collection walks only what came since
    assert "child: " in done.stderr and "start-up objects frozen" in done.stderr  # the one log line


def test_the_offline_llm_freezes_the_heap_for_one_run_and_holds_nothing_after(tiny_qwen3_dir):
    """LLM.generate runs with the heap frozen (core/heap.py heap_frozen) and unfreezes it at the end:
    an LLM dropped afterwards, without close(), is collected (a freeze for the process's life kept a
    dropped engine, and its GPU memory, forever)."""
    from final import LLM, SamplingParams

    llm = LLM(str(tiny_qwen3_dir), device="cpu", dtype="float32")
    frozen_during: list[int] = []

    def counting_step(step=llm.step):
        frozen_during.append(gc.get_freeze_count())
        return step()

    llm.step = counting_step
    llm.generate(
        ["Hello", "Hi"], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True), use_tqdm=False
    )
    assert frozen_during and min(frozen_during) > 10_000  # torch, the model, the tokenizer
    assert gc.get_freeze_count() == 0
    engine = weakref.ref(llm.core)
    del llm, counting_step
    gc.collect()
    assert engine() is None
