"""Prometheus text-format metrics, without a client library: counters and histograms kept by the
API process, gauges read from the engine on each scrape.

    final_requests_total{finish_reason}     final_prompt_tokens_total   final_generation_tokens_total
    final_requests_rejected_total{reason}   final_requests_running      final_requests_waiting
    final_requests_in_flight                final_kv_pages_total / _free / final_kv_usage_ratio
    final_prefix_cache_hit_ratio            final_preemptions_total     final_engine_steps_total
    final_time_to_first_token_seconds, final_inter_token_latency_seconds,
    final_e2e_request_latency_seconds, final_frontend_latency_seconds (histograms)
"""

from __future__ import annotations

import bisect
from collections import Counter

from ..engine.messages import EngineStats

PREFIX = "final_"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
FRONTEND_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...]):
        self.name, self.help, self.buckets = PREFIX + name, help, buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.sum += value
        self.count += 1

    def observe_many(self, value: float, times: int) -> None:
        if times > 0:
            self.counts[bisect.bisect_left(self.buckets, value)] += times
            self.sum += value * times
            self.count += times

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        cumulative = 0
        for bound, count in zip([*map(str, self.buckets), "+Inf"], self.counts, strict=True):
            cumulative += count
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {cumulative}')
        lines += [f"{self.name}_sum {self.sum}", f"{self.name}_count {self.count}"]
        return lines


class Metrics:
    def __init__(self) -> None:
        self.finished: Counter[str] = Counter()  # by finish reason
        self.rejected: Counter[str] = Counter()  # by reason: bad_request, overloaded, ...
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(
            "time_to_first_token_seconds", "Time from request to first token.", TTFT_BUCKETS
        )
        self.itl = Histogram("inter_token_latency_seconds", "Time between consecutive tokens.", ITL_BUCKETS)
        self.e2e = Histogram("e2e_request_latency_seconds", "Time from request to last token.", E2E_BUCKETS)
        self.frontend = Histogram(
            "frontend_latency_seconds",
            "Time from a step's tokens reaching the engine's host to their frame leaving the API process.",
            FRONTEND_BUCKETS,
        )

    def render(self, stats: EngineStats, in_flight: int) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
            lines.extend([f"# HELP {PREFIX}{name} {help}", f"# TYPE {PREFIX}{name} {kind}"])
            lines.extend(f"{PREFIX}{name}{labels} {value}" for labels, value in samples)

        metric(
            "requests_total",
            "counter",
            "Finished requests by finish reason.",
            [(f'{{finish_reason="{r}"}}', n) for r, n in sorted(self.finished.items())] or [("", 0)],
        )
        metric(
            "requests_rejected_total",
            "counter",
            "Requests refused before reaching the engine.",
            [(f'{{reason="{r}"}}', n) for r, n in sorted(self.rejected.items())] or [("", 0)],
        )
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests.",
            [("", self.prompt_tokens)],
        )
        metric("generation_tokens_total", "counter", "Generated tokens.", [("", self.generation_tokens)])
        metric("requests_running", "gauge", "Requests decoding in the engine.", [("", stats.num_running)])
        metric("requests_waiting", "gauge", "Requests queued in the engine.", [("", stats.num_waiting)])
        metric(
            "requests_in_flight",
            "gauge",
            "Sequences (prompts x n) admitted and not yet answered: what the admission limit counts.",
            [("", in_flight)],
        )
        metric("kv_pages_total", "gauge", "Pages in the KV-cache pool.", [("", stats.num_pages)])
        metric("kv_pages_free", "gauge", "KV-cache pages on the free list.", [("", stats.free_pages)])
        metric(
            "kv_pages_cached", "gauge", "KV-cache pages held by the prefix cache.", [("", stats.cached_pages)]
        )
        metric(
            "kv_integrity_ok",
            "gauge",
            "1 when free + cached + live requests' own pages == all pages.",
            [("", 0 if "integrity_error" in stats.extra else 1)],
        )
        usage = 1 - stats.free_pages / stats.num_pages if stats.num_pages else 0.0
        metric("kv_usage_ratio", "gauge", "Share of KV-cache pages not on the free list.", [("", usage)])
        hit = stats.cached_prompt_tokens / stats.prompt_tokens if stats.prompt_tokens else 0.0
        metric(
            "prefix_cache_hit_ratio",
            "gauge",
            "Prompt tokens reused from the prefix cache / prompt tokens.",
            [("", hit)],
        )
        metric(
            "preemptions_total",
            "counter",
            "Requests preempted when the KV cache ran out.",
            [("", stats.num_preemptions)],
        )
        metric("engine_steps_total", "counter", "Forward passes the engine ran.", [("", stats.num_steps)])
        for histogram in (self.ttft, self.itl, self.e2e, self.frontend):
            lines.extend(histogram.render())
        return "\n".join(lines) + "\n"
