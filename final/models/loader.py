"""Loading a checkpoint into its architecture's model, and whether a --tp degree can shard it.

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
from ..distributed.tp import TPInfo
from .registry import model_class
from .rope import RotaryEmbedding
from .weights import load_weights


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def check_tp_degree(config: ModelConfig, size: int) -> None:
    """A UserError unless `size` ranks can share the model: its query heads and MLP split evenly,
    its KV heads split evenly or (fewer KV heads than ranks) replicate evenly. The vocabulary
    needs nothing: it is padded to a multiple of the ranks."""
    problems = _tp_problems(config, size)
    if problems:
        works = [d for d in range(1, config.num_heads + 1) if not _tp_problems(config, d)]
        raise UserError(
            f"--tp {size} cannot shard {config.architecture}: {' and '.join(problems)} do not divide "
            f"over {size} ranks; the degrees that work for this model: {', '.join(map(str, works))}"
        )


def _tp_problems(config: ModelConfig, size: int) -> list[str]:
    """What keeps `size` ranks from sharing the model (nothing: an empty list)."""
    problems = []
    if config.num_heads % size:
        problems.append(f"its {config.num_heads} attention heads")
    if config.intermediate_size % size:
        problems.append(f"its MLP's {config.intermediate_size} features")
    kv = config.num_kv_heads
    if (kv >= size and kv % size) or (kv < size and size % kv):
        problems.append(
            f"its {kv} KV heads (they split evenly, or replicate when the degree is a multiple of them)"
        )
    return problems


def load_model(
    folder: Path, config: ModelConfig, device: torch.device, dtype: torch.dtype, tp: TPInfo | None = None
) -> nn.Module:
    cls = model_class(config)
    with torch.device("meta"), _default_dtype(dtype):
        model = cls(config, tp or TPInfo())
    model = model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    load_weights(model, folder, config.tie_word_embeddings)
    model.rope = RotaryEmbedding(config, device)
    return model.eval()
