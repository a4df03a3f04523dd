"""Where a server's bursts come from, from the engine's step trace (final/runtime/step_trace.py).

    FINAL_STEP_TRACE=/tmp/steps.jsonl python -m final --model ...    # then load it, then:
    python -m scripts.step_trace_report /tmp/steps.jsonl [--labels 8,32,64,inf] [--json out.json]

A stream's tokens carry the time their step was collected (the engine's clock of the online
benchmark); while requests keep decoding, consecutive collects are consecutive tokens of every
running stream. A gap between two collects under half the median decode step (issue 27's line) is a
burst at the engine. Each is put down to what came before its first collect:

    late after an eager launch    the first step was done before its collect began, and the host
                                  had just launched a step with prompt tokens (kernel by kernel)
    late after a graph launch     the same after a decode-only launch (a graph replay)
    late, early-delivery launch   the same, the launch could deliver during it and did not (its
                                  step finished only after the last layer was queued)
    delivered during a launch     the first step was collected between the layers of the next
                                  launch (engine/delivery.py), and the second came soon after
    on time                       the first step's tokens were not ready when its collect began:
                                  the second step was short (a small step after a long one)

and the launches' host time is summed up by kind, so a fix can be aimed. `stream_burst_share_local`
is the engine's side of issue 27's measure: the share of the streams' gaps (each step's gap counted
once per stream that got a token across it) under half the decode step of the moment, the median
of the decode-only steps either side (scripts/stream_metrics.py's `local_medians`), since a load's
batch, and its step, ramp up and down.
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

from scripts.stream_metrics import local_medians

CAUSES = (
    "late after an eager launch",
    "late after a graph launch",
    "late, early-delivery launch",
    "delivered during a launch",
    "on time",
)


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report(events: list[dict[str, Any]]) -> dict[str, Any]:
    collects = sorted((e for e in events if e["ev"] == "collect" and e["sampled"]), key=lambda e: e["t1"])
    launches = sorted((e for e in events if e["ev"] == "launch"), key=lambda e: e["t1"])
    gaps = [(a, b, 1e3 * (b["t1"] - a["t1"])) for a, b in zip(collects, collects[1:], strict=False)]
    decode_gaps = [g for _, b, g in gaps if b["decode_only"]]
    if not decode_gaps:
        return {"collects": len(collects), "bursts": 0}
    decode_step = statistics.median(decode_gaps)
    starts, ends = [launch["t0"] for launch in launches], [launch["t1"] for launch in launches]

    def during(collect: dict[str, Any]) -> dict[str, Any] | None:
        """The launch under way when `collect` began (an early delivery), if any."""
        i = bisect.bisect_left(starts, collect["t0"]) - 1  # the host launches one step at a time
        return launches[i] if i >= 0 and collect["t0"] < ends[i] else None

    causes: Counter[str] = Counter()
    for a, _, gap in gaps:
        if gap >= decode_step / 2:
            continue
        i = bisect.bisect_right(ends, a["t0"])  # the launches over before this collect began
        last = launches[i - 1] if i else None
        if during(a) is not None:
            causes["delivered during a launch"] += 1
        elif not a["ready"] or last is None:
            causes["on time"] += 1
        elif last["early"]:
            causes["late, early-delivery launch"] += 1
        else:
            causes["late after an eager launch" if last["prompt"] else "late after a graph launch"] += 1
    bursts = sum(causes.values())
    # Per stream, and against the decode step of the moment: each gap weighed by the streams that
    # got a token across it, its line half the median decode-only gap of the LOCAL_STEPS steps around it
    # (the batch ramps up and down within a load, and the step with it).
    weighed = under = 0
    local = local_medians([(g, b["decode_only"]) for _, b, g in gaps])
    for (_, b, gap), median in zip(gaps, local, strict=True):
        weighed += b["sampled"]
        under += b["sampled"] * (gap < median / 2)
    eager = [1e3 * (e["t1"] - e["t0"]) for e in launches if e["prompt"]]
    graph = [1e3 * (e["t1"] - e["t0"]) for e in launches if not e["prompt"]]
    inside = sum(during(c) is not None for c in collects)  # early deliveries
    return {
        "collects": len(collects),
        "decode_step_ms_p50": decode_step,
        "bursts": bursts,
        "burst_share": bursts / len(gaps),
        "stream_burst_share_local": under / weighed,
        "causes": {cause: causes[cause] for cause in CAUSES},
        "late_collect_share": sum(c["ready"] for c in collects) / len(collects),
        "delivered_during_a_launch": inside,
        "eager_launches": len(eager),
        "eager_launch_ms_p50": statistics.median(eager) if eager else 0.0,
        "eager_launch_ms_p90": statistics.quantiles(eager, n=10)[-1] if len(eager) > 1 else 0.0,
        "graph_launch_ms_p50": statistics.median(graph) if graph else 0.0,
    }


def segments(events: list[dict[str, Any]], idle_s: float = 1.0) -> list[list[dict[str, Any]]]:
    """The trace cut where the engine idled for `idle_s` or more: one piece per load the
    benchmark ran (the online benchmark runs its rates one after another on one server)."""
    pieces: list[list[dict[str, Any]]] = []
    last = None
    for event in sorted(events, key=lambda e: e["t0"]):
        if last is None or event["t0"] - last >= idle_s:
            pieces.append([])
        pieces[-1].append(event)
        last = event["t1"] if last is None else max(event["t1"], last)
    return pieces


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace", type=Path)
    parser.add_argument("--labels", default="", help="a name per load, in order (the rates: 8,32,64,inf)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    pieces = [piece for piece in segments(load(args.trace)) if len(piece) > 20]  # not the warm-up's
    labels = args.labels.split(",") if args.labels else []
    out = {}
    for i, piece in enumerate(pieces):
        label = labels[i] if len(labels) == len(pieces) else f"load {i + 1}"
        out[label] = report(piece)
        print(f"--- {label}")
        for key, value in out[label].items():
            print(f"{key:28s} {value:.3f}" if isinstance(value, float) else f"{key:28s} {value}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
