"""The FP8 KV cache's tables for docs/serving/kv_fp8.md (issue 32), from the `kv` results:

    kv_fp8_accuracy_*         scripts/kv_fp8_accuracy.py: FP8 against the model's dtype, per model
    kv_fp8_capacity_*         scripts/kv_fp8_capacity.py: the pool at a fixed --memory-ratio
    kv_fp8_decode_kernel_*    scripts/bench_kv_fp8_decode.py, and issue 32's own table beside it
    kv_<workload>_<bf16|fp8>  the bench harness (gpu_run.sh kv-fp8-speed): final/ served both ways

Rendered by scripts/render_results.py into docs/generated/kv_fp8.md; every number comes from a
result file, and every table says where its rows were measured (the issue's row says it is the
issue's). No clock, no files written here.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from scripts.results_model import (
    HEADER,
    Result,
    cell,
    code,
    device_of,
    device_order,
    environment,
    format_metric,
)

GROUP = "kv"
PEER = "mini-sglang"  # scripts/bench_peer.py's results (gpu_run.sh peers, in the same call)
KERNELS = (
    ("bf16", "bf16"),
    ("bf16_tc", "bf16, tensor cores"),
    ("fp8", "FP8"),
    ("fp8_tc", "FP8, tensor cores"),
)
# The served workloads of kv-fp8-speed: (name part, what the table calls it, metric, higher is better).
SPEED = (
    ("offline", "offline (Nano-vLLM's 256 requests), output tok/s", "output_tok_per_s", True),
    ("latency", "batch-1 decode step (512-token prompt), ms", "decode_step_ms", False),
    ("long_context", "long-context (64 prompts of 4k-16k), output tok/s", "output_tok_per_s", True),
    ("long_context_small", "long-context at a small --memory-ratio, output tok/s", "output_tok_per_s", True),
    (
        "capacity_bound",
        "capacity-bound (256 prompts of 2k-4k, 512 tokens each, small --memory-ratio), output tok/s",
        "output_tok_per_s",
        True,
    ),
)
GPU_STEP = code("bash scripts/gpu_run.sh ckpt kv-fp8")
KV_NAMES = {"fp8_e4m3": "FP8", "bf16": "bf16 (yardstick)"}


def table(header: list[str], rows: list[list[str]], text_columns: int = 1) -> list[str]:
    """A markdown table: the first `text_columns` columns (names) to the left, numbers to the right."""
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    out = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    return out + ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]


def provenance(rows: list[Result]) -> list[str]:
    """A collapsed block: where and how each row was measured."""
    out = ['??? note "Where and how these rows were measured"', ""]
    for r in rows:
        source = getattr(r, "source", None) or r.command
        out.append(f"    - `{r.name}` ({r.timestamp}): {environment(r)}; {code(source)}")
    return [*out, ""]


def by_workload(results: list[Result], workload: str) -> list[Result]:
    rows = [r for r in results if r.group == GROUP and r.workload == workload]
    return sorted(rows, key=lambda r: (device_order(device_of(r)), r.name))


def percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def accuracy(results: list[Result]) -> list[str]:
    rows = by_workload(results, "kv-fp8-accuracy")
    if not rows:
        return [f"No accuracy results yet: `python -m scripts.kv_fp8_accuracy` (CPU) or {GPU_STEP}.", ""]
    body = []
    for r in rows:
        c, m = r.config, r.metrics
        body.append([
            device_of(r), str(c.get("model")), str(c.get("dtype")), KV_NAMES.get(c.get("kv_cache_dtype"), "?"),
            str(c.get("scales")), str(c.get("attn")),
            f"{format_metric(m['prompts'])} x {c.get('tokens')}", percent(m["greedy_agreement"]),
            percent(m["agreed_token_share"]), format_metric(m["abs_dlogprob_mean"]),
            format_metric(m["abs_dlogprob_p99"]), format_metric(m["abs_dlogprob_max"]),
        ])  # fmt: skip
    header = ["Device", "Model", "Model dtype", "KV cache", "Scales", "Attention", "Prompts x tokens",
              "All tokens agree", "Tokens before the first difference", "Mean abs Δ logprob",
              "p99 abs Δ logprob", "Max abs Δ logprob"]  # fmt: skip
    return [*table(header, body, text_columns=7), "", *provenance(rows)]


def capacity(results: list[Result]) -> list[str]:
    rows = by_workload(results, "kv-capacity")
    if not rows:
        return [f"No capacity results yet: {GPU_STEP}.", ""]
    body = [
        [device_of(r), str(r.config.get("kv_cache_dtype")), format_metric(r.config.get("memory_ratio", 0)),
         format_metric(r.metrics["kv_tokens"]), format_metric(r.metrics["kv_gib"]),
         format_metric(r.metrics["bytes_per_token"]),
         f"{format_metric(r.metrics['batch_at_ctx'])} ({format_metric(r.metrics['requests_at_ctx'])})"]
        for r in rows
    ]  # fmt: skip
    context = format_metric(rows[0].config.get("context", 8192))
    header = ["Device", "KV cache", "--memory-ratio", "Tokens in the pool", "Pool (GiB)", "Bytes per token",
              f"Largest batch at {context} tokens (requests that fit)"]  # fmt: skip
    return [*table(header, body, text_columns=2), "", *provenance(rows)]


def shapes_of(result: Result) -> list[tuple[int, int]]:
    """The (batch, context) pairs a kernel result timed, from its metric names (`us_b256_c1024_bf16`),
    in the order it timed them."""
    found = (re.fullmatch(r"us_b(\d+)_c(\d+)_bf16", key) for key in result.metrics)
    return list(dict.fromkeys((int(m[1]), int(m[2])) for m in found if m))


def kernel(results: list[Result]) -> list[str]:
    rows = by_workload(results, "kv-decode-kernel")
    if not rows:
        return [f"No kernel timings yet: {GPU_STEP} (its kv-fp8-kernel part).", ""]
    body = []
    for r in rows:
        for batch, context in shapes_of(r):
            keys = [f"us_b{batch}_c{context}_{k}" for k, _ in KERNELS]
            if all(k in r.metrics for k in keys):
                label = r.label or r.name
                times = [f"{r.metrics[k]:,.0f} µs" for k in keys]
                body.append([f"{label}, {device_of(r)}", f"{batch}, {context:,}", *times])
    header = ["Measured by", "Batch, context", *(title for _, title in KERNELS)]
    return [*table(header, body, text_columns=2), "", *provenance(rows)]


def speed_pairs(results: list[Result]) -> dict[tuple[str, str], dict[str, Result]]:
    """(device, workload part) -> {"bf16": result, "fp8": result}, newest call first."""
    pairs: dict[tuple[str, str], dict[str, Result]] = {}
    for r in sorted(results, key=lambda r: r.timestamp):
        parts = r.name.split("_")
        if (
            r.group != GROUP
            or r.workload.startswith("kv-")
            or len(parts) < 4
            or parts[-2] not in ("bf16", "fp8")
        ):
            continue
        key = (device_of(r), "_".join(parts[1:-2]))
        pairs.setdefault(key, {})[parts[-2]] = r
    return pairs


def kv_note(name: str, metrics: dict[str, float]) -> str:
    """`bf16: 1,234,560 tokens, 3 preemptions`, from what the run recorded (bench.kv_cache_facts)."""
    parts = [f"{format_metric(metrics[k])} {word}" for k, word in (("kv_capacity_tokens", "tokens"),
             ("preemptions", "preemptions")) if k in metrics]  # fmt: skip
    return f"{name}: {', '.join(parts)}" if parts else ""


def peer_value(results: list[Result], bf16: Result, part: str, metric: str) -> str:
    """Mini-SGLang's figure for the same workload measured in the same device call (it serves a
    bf16 cache: another precision than FP8's, and the header says so), or '-'."""
    peers = [
        r for r in results
        if r.stage == PEER and r.workload == part and device_of(r) == device_of(bf16)
        and r.run_id is not None and r.run_id == bf16.run_id and metric in r.metrics
    ]  # fmt: skip
    return format_metric(max(peers, key=lambda r: r.timestamp).metrics[metric]) if peers else "-"


def speed(results: list[Result]) -> list[str]:
    pairs = speed_pairs(results)
    body, used = [], []
    for device in sorted({d for d, _ in pairs}, key=device_order):
        for part, title, metric, higher in SPEED:
            both = pairs.get((device, part), {})
            if set(both) != {"bf16", "fp8"} or any(metric not in r.metrics for r in both.values()):
                continue
            bf16, fp8 = both["bf16"].metrics, both["fp8"].metrics
            ratio = fp8[metric] / bf16[metric] if higher else bf16[metric] / fp8[metric]
            same_call = both["bf16"].run_id is not None and both["bf16"].run_id == both["fp8"].run_id
            kv = "; ".join(filter(None, (kv_note("bf16", bf16), kv_note("FP8", fp8)))) or "-"
            body.append([device, title, format_metric(bf16[metric]), format_metric(fp8[metric]),
                         f"{ratio:.2f}x" + ("" if same_call else " (not one call)"),
                         peer_value(results, both["bf16"], part, metric), kv])  # fmt: skip
            used += [both["bf16"], both["fp8"]]
    if not body:
        return [f"No serving results yet: {GPU_STEP} (its kv-fp8-speed part).", ""]
    header = ["Device", "Workload", "bf16 cache", "FP8 cache", "FP8's gain", "Mini-SGLang, bf16, same call",
              "KV cache and preemptions"]  # fmt: skip
    return [*table(header, body, text_columns=2), "", *provenance(used)]


SECTIONS: dict[str, Callable[[list[Result]], list[str]]] = {
    "accuracy": accuracy,
    "capacity": capacity,
    "kernel": kernel,
    "speed": speed,
}


def render(results: list[Result]) -> str:
    """The page's generated part: one `<!-- section -->`-named block per table, for snippets."""
    out = [HEADER, ""]
    for name, build in SECTIONS.items():
        out += [f"<!-- --8<-- [start:{name}] -->", *build(results), f"<!-- --8<-- [end:{name}] -->", ""]
    return "\n".join(out).rstrip("\n") + "\n"
