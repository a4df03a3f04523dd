"""What `--attn auto` may pick, by GPU: the table attention/choose.py resolves against what the
machine has, kept here, free of torch, so that `python -m final --help` can say it at once.

`AUTO` is the one table to change when the attention benchmarks (`bash scripts/gpu_run.sh
bench-attn`, rendered on the "Attention backends" page of the docs) show a faster choice.
"""

from __future__ import annotations

NAMES = ("torch", "fi", "fa", "trtllm")

# --8<-- [start:auto]
# Compute capability major -> (prefill candidates, decode candidates), best first. `auto` takes, per
# phase, the first candidate that is installed and has kernels for the model's head size and the
# --page-size set (if any); torch is the last resort, and the only choice on the CPU or in float32.
# Chosen by number from the attention benchmarks (`bash scripts/gpu_run.sh bench-attn`, every pair
# at page size 16; `python scripts/results_attention.py benchmarks/results/<gpu>` prints each
# phase's winner and the entry they give):
#   9: benchmarks/results/h200/attn_{offline,latency,prefill}_<pair>_h200.json and
#      benchmarks/results/h100/attn_{offline,latency,prefill}_<pair>_h100.json. Until they are
#      measured with fa's prefill fixed (issue 26: it compiled a second kernel in the measured
#      window), FlashInfer, the backend verified first (H200, 2026-11-22), stays first.
#  10: not measured (no Blackwell GPU lent): the design's intent, TRT-LLM for both phases, as
#      Mini-SGLang picks there; FlashInfer first until measured.
AUTO: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {
    9: (("fi", "fa"), ("fi", "trtllm")),  # H100, H200
    10: (("fi", "trtllm", "fa"), ("fi", "trtllm")),  # B200, GB200
}
AUTO_OTHER_GPUS = (("fi",), ("fi",))  # Ampere, Ada, consumer Blackwell (12.x), ...
# --8<-- [end:auto]


def describe_auto() -> str:
    """What `auto` picks, in words (for --help)."""
    gpus = {9: "Hopper", 10: "Blackwell 10.x"}
    parts = [f"{gpus.get(major, f'{major}.x')}: {_pair(p[0], d[0])}" for major, (p, d) in AUTO.items()]
    parts.append(f"other GPUs: {_pair(AUTO_OTHER_GPUS[0][0], AUTO_OTHER_GPUS[1][0])}")
    return (
        "; ".join(parts)
        + "; the CPU or float32: torch. A backend not installed, or without kernels for the model's "
        "head size or the --page-size set, is skipped for the next (fi, then torch)"
    )


def _pair(prefill: str, decode: str) -> str:
    return prefill if prefill == decode else f"{prefill},{decode}"


__all__ = ["AUTO", "AUTO_OTHER_GPUS", "NAMES", "describe_auto"]
