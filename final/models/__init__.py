"""Models: resolving what --model names, the registry of architectures, and loading weights.

`load_model(folder, config, device, dtype, tp)` builds the model on the meta device (no memory, no
random init), allocates it once on the target device in the target dtype (this rank's shards only
under tensor parallelism), then copies the checkpoint in, merging q/k/v and gate/up as it goes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from ..core.errors import UserError
from ..core.model_config import ModelConfig
from ..distributed import TPInfo
from .llama import LlamaForCausalLM
from .rope import RotaryEmbedding
from .source import resolve_model
from .weights import load_weights

# Architecture in config.json -> implementation. All of them are Llama-shaped today; a new family
# (MoE, sliding window) gets its own file and a line here.
MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": LlamaForCausalLM,
    "Qwen3ForCausalLM": LlamaForCausalLM,
}


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def load_model(
    folder: Path, config: ModelConfig, device: torch.device, dtype: torch.dtype, tp: TPInfo | None = None
) -> LlamaForCausalLM:
    cls = MODEL_REGISTRY.get(config.architecture)
    if cls is None:
        raise UserError(
            f"no implementation for {config.architecture}; supported: {', '.join(MODEL_REGISTRY)}"
        )
    with torch.device("meta"), _default_dtype(dtype):
        model = cls(config, tp or TPInfo())
    model = model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    load_weights(model, folder, config.tie_word_embeddings)
    model.rope = RotaryEmbedding(config, device)
    return model.eval()


__all__ = ["MODEL_REGISTRY", "LlamaForCausalLM", "load_model", "resolve_model"]
