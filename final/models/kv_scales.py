"""The FP8 KV-cache scales a checkpoint may carry: one for K and one for V per layer.

An FP8 pool stores x / scale (kvcache/pool.py). Checkpoints quantized for vLLM or SGLang (e.g. by
llm-compressor, or AutoFP8) carry those scales as scalar tensors beside the weights, measured on
calibration data; the names vary, and we take the ones vLLM remaps
(`maybe_remap_kv_scale_name` in vllm/model_executor/model_loader/weight_utils.py):

    model.layers.N.self_attn.k_scale            model.layers.N.self_attn.v_scale
    model.layers.N.self_attn.attn.k_scale       model.layers.N.self_attn.attn.v_scale
    model.layers.N.self_attn.k_proj.output_scale  model.layers.N.self_attn.v_proj.output_scale

A scale is per tensor, so every tensor-parallel rank reads the same numbers. Without them the
scales are 1.0, vLLM's and SGLang's default too.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from ..core.errors import UserError
from .weights import iter_checkpoint

SCALE_NAME = re.compile(
    r"(?:^|\.)layers\.(\d+)\.self_attn\.(?:(?:attn\.)?([kv])_scale|([kv])_proj\.output_scale)$"
)


def read_kv_scales(folder: Path, num_layers: int) -> tuple[list[float], list[float]] | None:
    """(K scales, V scales), one per layer, from the checkpoint in `folder`; None if it has none.
    A checkpoint with some but not all of them, or a scale that is not a positive finite number,
    is a UserError (a wrong scale would silently corrupt every token's attention)."""
    found: dict[tuple[str, int], float] = {}
    for name, tensor in iter_checkpoint(folder):
        match = SCALE_NAME.search(name)
        if match is None:
            continue
        layer, which = int(match.group(1)), match.group(2) or match.group(3)
        values = tensor.read().float().flatten()
        if values.numel() != 1:
            raise UserError(f"KV-cache scale {name} has {values.numel()} values; one per tensor is supported")
        value = float(values[0])
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"KV-cache scale {name} is {value}; a scale must be a positive finite number")
        found[(which, layer)] = value
    if not found:
        return None
    missing = [
        f"{which}_scale of layer {n}" for which in "kv" for n in range(num_layers) if (which, n) not in found
    ]
    if missing:
        raise UserError(
            f"checkpoint {folder} has KV-cache scales for some layers but lacks {len(missing)}, e.g. "
            f"{', '.join(missing[:3])}"
        )
    return [found[("k", n)] for n in range(num_layers)], [found[("v", n)] for n in range(num_layers)]
