"""The engine process's step trace: `FINAL_STEP_TRACE=<file>` writes one JSON line per launch and
per collect, on the monotonic clock the streams' timing uses (CLOCK_MONOTONIC, one clock for every
process of a machine), so a stream's gaps can be laid beside the steps that made them.

    {"ev": "launch", "t0": ..., "t1": ..., "prompt": 812, "decodes": 40, "early": true}
    {"ev": "collect", "t0": ..., "t1": ..., "ready": true, "sampled": 41, "decode_only": false}

`launch`: the host's time in `EngineCore.launch` (t0 to t1), the prompt tokens and decoding requests
it carried, and whether the step in flight could be delivered during it (engine/delivery.py).
`collect`: the host's time in `EngineCore.collect`; `ready` says the step's tokens were already on
the host when the collect began (a collect that came late: the step waited for the host), and
`t1` is the time its tokens were stamped with. `scripts/step_trace_report.py` reads it.

A benchmark switch, not a user feature: it costs a write per event, nothing when unset.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import IO, Any

from ..engine.core import EngineCore
from ..engine.handle import StepHandle

ENV = "FINAL_STEP_TRACE"


class StepTrace:
    """Wraps one engine core's `launch` and `collect` (instance attributes shadow the methods, so
    the loop and early delivery call the wrappers)."""

    def __init__(self, core: EngineCore, out: IO[str]):
        self.out = out
        launch, collect = core.launch, core.collect

        def traced_launch(batch: Any, between_layers: Callable[[], None] | None = None) -> StepHandle:
            prompt, decodes = batch.load()
            t0 = time.monotonic()
            handle = launch(batch, between_layers)
            self.write(ev="launch", t0=t0, t1=time.monotonic(), prompt=prompt, decodes=decodes,
                       early=between_layers is not None)  # fmt: skip
            return handle

        def traced_collect(handle: StepHandle) -> list[Any]:
            t0, ready = time.monotonic(), handle.ready()
            deltas = collect(handle)
            self.write(ev="collect", t0=t0, t1=core.tokens_ready_at, ready=ready, sampled=len(handle.sampled),
                       decode_only=handle.decode_only)  # fmt: skip
            return deltas

        core.launch, core.collect = traced_launch, traced_collect  # type: ignore[method-assign]

    def write(self, **event: Any) -> None:
        self.out.write(json.dumps(event, separators=(",", ":")) + "\n")


def install_from_env(core: EngineCore) -> IO[str] | None:
    """Trace `core` into the file $FINAL_STEP_TRACE names (appended); the open file, or None."""
    path = os.environ.get(ENV)
    if not path:
        return None
    # Line-buffered: a server stopped by a signal keeps every line it wrote.
    out = open(path, "a", buffering=1)  # noqa: SIM115 (open for the process's life)
    StepTrace(core, out)
    return out
