"""The few numbers of a Hugging Face config.json that a Llama-family decoder needs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import UserError

# Architectures whose math our decoder reproduces, and the quirks each one brings.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": {},  # Llama 2/3, SmolLM2
    "MistralForCausalLM": {},
    "Qwen2ForCausalLM": {"qkv_bias": True},
    "Qwen3ForCausalLM": {"qk_norm": True},
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_context: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    rope_theta: float
    rope_scaling: dict[str, Any] = field(default_factory=dict)  # {"rope_type": ..., factors}
    dtype: torch.dtype = torch.float32
    eos_token_ids: tuple[int, ...] = ()

    @property
    def rope_type(self) -> str:
        return self.rope_scaling.get("rope_type", "default")


def read_config_json(folder: Path) -> tuple[Path, dict]:
    """config.json's path and the decoder's part of it (a UserError if it cannot be read)."""
    path = Path(folder) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise UserError(f"cannot read {path}: {err}") from err
    return path, raw.get("text_config", raw)  # multimodal wrappers keep the decoder's config inside


def load_model_config(folder: Path, max_context_override: int | None = None) -> ModelConfig:
    path, raw = read_config_json(folder)
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise UserError(
            f"unsupported architecture {archs or raw.get('model_type')!r} in {path}; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    quirks = SUPPORTED_ARCHITECTURES[arch]
    if raw.get("hidden_act", "silu") != "silu":
        raise UserError(f"unsupported activation {raw['hidden_act']!r} (only silu)")
    theta, scaling = _rope_parameters(raw)
    num_heads = raw["num_attention_heads"]
    max_context = raw.get("max_position_embeddings", 4096)
    # Sliding-window attention equals full attention as long as no sequence is longer than the
    # window, so we serve such models exactly by capping the context at the window.
    if raw.get("sliding_window") and raw.get("use_sliding_window", True):
        max_context = min(max_context, raw["sliding_window"])
    if max_context_override:
        max_context = max_context_override
    attention_bias = bool(raw.get("attention_bias", False))
    return ModelConfig(
        architecture=arch,
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        intermediate_size=raw["intermediate_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=raw.get("num_key_value_heads") or num_heads,
        head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
        rms_norm_eps=raw.get("rms_norm_eps", 1e-6),
        max_context=max_context,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=quirks.get("qkv_bias", attention_bias),
        o_bias=attention_bias and arch == "LlamaForCausalLM",
        mlp_bias=bool(raw.get("mlp_bias", False)),
        qk_norm=quirks.get("qk_norm", False),
        rope_theta=theta,
        rope_scaling=scaling,
        dtype=_dtype(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        eos_token_ids=_eos_ids(Path(folder), raw),
    )


def _rope_parameters(raw: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """transformers 5 keeps RoPE settings in `rope_parameters`; older configs use `rope_theta` and
    `rope_scaling` (whose type key was once called `type`). Return (theta, scaling)."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = dict(raw.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = merged.pop("rope_theta", raw.get("rope_theta", 10000.0))
    rope_type = merged.pop("rope_type", None) or merged.pop("type", None) or "default"
    merged.pop("type", None)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UserError(
            f"unsupported RoPE scaling {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type != "default":
        merged.setdefault("original_max_position_embeddings", raw.get("max_position_embeddings"))
    return float(theta), ({"rope_type": rope_type, **merged} if rope_type != "default" else {})


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name).replace("torch.", ""), None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _eos_ids(folder: Path, raw: dict[str, Any]) -> tuple[int, ...]:
    """EOS ids from config.json and generation_config.json (which may list several, as Llama 3 does)."""
    ids: list[int] = []
    sources = [raw]
    gen = folder / "generation_config.json"
    if gen.exists():
        sources.append(json.loads(gen.read_text()))
    for source in sources:
        value = source.get("eos_token_id")
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, int) and token not in ids:
                ids.append(token)
    return tuple(ids)
