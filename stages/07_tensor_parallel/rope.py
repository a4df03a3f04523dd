"""Rotary position embeddings (RoPE), with the context-extension schemes Llama-family configs use.

RoPE rotates each pair of query/key features by an angle proportional to the token's position,
so that the dot product of a query and a key depends only on their distance. Each pair rotates
at its own frequency; the scaling schemes below only change those frequencies.
"""

from __future__ import annotations

import math

import torch

from stages.common.model_config import ModelConfig


# --8<-- [start:frequencies]
def rope_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """Return (inverse frequencies [head_dim/2], attention scaling) for the config's RoPE type."""
    dim, base, scaling = config.head_dim, config.rope_theta, config.rope_scaling
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = config.rope_type
    if kind == "default":
        return inv_freq.float(), 1.0
    if kind == "linear":  # position interpolation: slow every rotation down by `factor`
        return (inv_freq / scaling["factor"]).float(), 1.0
    if kind == "llama3":
        return _llama3(inv_freq, scaling).float(), 1.0
    if kind == "yarn":
        return _yarn(dim, base, scaling)
    raise ValueError(f"unknown RoPE type {kind}")  # load_model_config rejects these first


# --8<-- [end:frequencies]


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    # Long wavelengths are interpolated by `factor`, short ones kept, the band between blended.
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_context = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(medium, blended, scaled)


def _yarn(dim: int, base: float, s: dict) -> tuple[torch.Tensor, float]:
    # YaRN: interpolate low frequencies, extrapolate high ones, ramp in between, and scale the
    # attention logits up a little (the "mscale") to keep their entropy.
    factor = s["factor"]
    old_context = s.get("original_max_position_embeddings")

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        if s.get("mscale") and s.get("mscale_all_dim"):
            attention = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
        else:
            attention = mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_context / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1 where we keep the original (extrapolated) frequency
    return interpolation * (1 - keep) + extrapolation * keep, float(attention)


# --8<-- [start:apply]
class RotaryEmbedding:
    """A table of cos/sin for every position, built once on the model's device."""

    def __init__(self, config: ModelConfig, device: torch.device | str, dtype: torch.dtype):
        inv_freq, attention_scaling = rope_frequencies(config)
        positions = torch.arange(config.max_context, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)  # [positions, head_dim/2]
        angles = torch.cat([angles, angles], dim=-1)  # the two halves rotate together
        self.cos = (angles.cos() * attention_scaling).to(device=device, dtype=dtype)
        self.sin = (angles.sin() * attention_scaling).to(device=device, dtype=dtype)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotate x [tokens, heads, head_dim] by the angles of `positions` [tokens]."""
        cos = self.cos[positions].unsqueeze(1)
        sin = self.sin[positions].unsqueeze(1)
        first, second = x.chunk(2, dim=-1)
        rotated_half = torch.cat([-second, first], dim=-1)
        return x * cos + rotated_half * sin


# --8<-- [end:apply]
