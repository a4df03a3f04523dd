"""core/heap.py: a process's start-up heap frozen out of full garbage collections (run in a child
process: freezing pytest's own heap would outlive the test)."""

from __future__ import annotations

import json
import subprocess
import sys

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


LLM_CHILD = """
import gc, json, sys
from final import LLM
llm = LLM(sys.argv[1], device="cpu", dtype="float32")
frozen = gc.get_freeze_count()
llm.close()
print(json.dumps({"frozen": frozen, "after_close": gc.get_freeze_count()}))
"""


def test_the_offline_llm_freezes_its_startup_heap_until_it_closes(tiny_qwen3_dir):
    """LLM() freezes what start-up made, as each server process does; close() unfreezes it."""
    done = subprocess.run(
        [sys.executable, "-c", LLM_CHILD, str(tiny_qwen3_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["frozen"] > 10_000  # torch, the model, the tokenizer
    assert got["after_close"] == 0
