"""Early delivery: step N's tokens go out while the host is still launching step N+1.

Under overlap scheduling the host collects step N after it has launched step N+1 (core.py). A
decode step launches in a fraction of a millisecond (one graph replay), but a step that runs
eagerly (a prompt's prefill, alone or with decodes beside it) queues some 600 kernels one by one:
10 to 30 ms of host time on an H100 for a 16k-token step, while step N is done on the GPU after a
few. Collected only then, step N's tokens reach the clients late, and close behind them come step
N+1's: a stream that stutters. The online benchmark saw it at the engine itself (issue 27, an H100
at 64 requests/s: 7.6% of a stream's gaps under half a decode step, from the engine's own stamps,
against 0.5% added by the frontend).

So while an eager step is launched, the model calls back after each layer
(`ForwardBatch.between_layers`); once step N's tokens are on the host (its event has fired: a query,
never a wait), they are collected and published right there, and the rest of step N+1 is queued
after. Collecting mid-launch is the ordinary overlap case (a step in flight while the one before
it is collected) with one difference, handled here: step N+1 is not yet in `in_flight`, so step N
stays there until its collect is over, and a request that finishes at step N defers its pages to
the next collect as usual (core.py's invariant 3), since step N+1 may hold it.

Only the engine process publishes (`EngineCore.publish`, runtime/process.py): the offline `LLM`
hands tokens out when `step` returns, so early would buy it nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .handle import StepHandle
from .messages import RequestDelta


class EarlyDelivery:
    """The `between_layers` callback of one eager launch: collects and publishes the step in flight
    (the oldest) the first time it is found done; after that, and if it never is, does nothing (the
    loop collects it after the launch, as without early delivery)."""

    def __init__(
        self,
        in_flight: deque[StepHandle],
        collect: Callable[[StepHandle], list[RequestDelta]],
        publish: Callable[[list[RequestDelta]], None],
    ):
        self.in_flight, self.collect, self.publish = in_flight, collect, publish
        self.handle: StepHandle | None = in_flight[0]

    def __call__(self) -> None:
        handle = self.handle
        if handle is None or not handle.ready():
            return
        self.handle = None
        deltas = self.collect(handle)  # still in flight meanwhile: finishing requests defer their pages
        self.in_flight.remove(handle)
        self.publish(deltas)


def early_delivery(
    in_flight: deque[StepHandle],
    collect: Callable[[StepHandle], list[RequestDelta]],
    publish: Callable[[list[RequestDelta]], None] | None,
) -> EarlyDelivery | None:
    """The callback for the next launch: None without a publisher or a step in flight."""
    return EarlyDelivery(in_flight, collect, publish) if publish is not None and in_flight else None
