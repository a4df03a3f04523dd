"""Load a Hugging Face safetensors checkpoint into a model whose memory is already allocated.

Each tensor is read lazily: a layer asks for the slice its rank holds (`CheckpointTensor.read`),
so under tensor parallelism no rank ever reads the whole checkpoint, and peak host memory is one
slice. Checkpoint modules that the model merges (q/k/v, gate/up) go into their part of the merged
weight (`MergedColumnLinear.load_weight`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

from ..core.errors import UserError
from .layers import MergedColumnLinear

# Prefixes that wrapped checkpoints put in front of the decoder's own names.
STRIP_PREFIXES = ("language_model.",)


class SafetensorsTensor:
    """One tensor of a safetensors file, read only when (and as much as) asked for."""

    def __init__(self, reader: Any, name: str):
        self._slice = reader.get_slice(name)
        self.shape = tuple(self._slice.get_shape())

    def read(self, dim: int | None = None, start: int = 0, length: int | None = None) -> torch.Tensor:
        if dim is None:
            return self._slice[:] if self.shape else self._slice[()]  # () for a scalar (a KV scale)
        index = [slice(None)] * len(self.shape)
        index[dim] = slice(start, start + (length if length is not None else self.shape[dim] - start))
        return self._slice[tuple(index)]


def checkpoint_files(folder: Path) -> list[Path]:
    files = sorted(Path(folder).glob("*.safetensors"))
    # Mistral ships both sharded files and a consolidated copy of the same weights.
    if len(files) > 1:
        files = [f for f in files if f.name != "consolidated.safetensors"]
    if not files:
        raise UserError(f"no .safetensors weights in {folder} (only safetensors checkpoints are supported)")
    return files


def iter_checkpoint(folder: Path) -> Iterator[tuple[str, SafetensorsTensor]]:
    """Yield (name, lazily read tensor) for every tensor of the checkpoint."""
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():
                clean = name
                for prefix in STRIP_PREFIXES:
                    clean = clean.removeprefix(prefix)
                yield clean, SafetensorsTensor(reader, name)


def _packed_target(name: str, packed: dict[str, tuple[str, int]]) -> tuple[str, int] | None:
    """'model.layers.0.self_attn.k_proj.weight' -> ('model.layers.0.self_attn.qkv_proj.weight', 1)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in packed:
            merged, shard = packed[part]
            return ".".join([*parts[:i], merged, *parts[i + 1 :]]), shard
    return None


@torch.no_grad()
def load_weights(model: nn.Module, folder: Path, tie_word_embeddings: bool) -> None:
    """Fill every parameter of `model` (already allocated on its device) from the checkpoint."""
    params = dict(model.named_parameters(remove_duplicate=False))
    packed: dict[str, tuple[str, int]] = getattr(model, "packed_modules", {})
    loaded: set[tuple[str, int]] = set()
    for name, tensor in iter_checkpoint(folder):
        if tie_word_embeddings and name == "lm_head.weight":
            continue  # tied: the head is the embedding, whatever copy the checkpoint carries
        target, part = _packed_target(name, packed) or (name, 0)
        if target not in params:
            continue  # e.g. rotary inv_freq buffers that old checkpoints carry
        module_name, _, param_name = target.rpartition(".")
        module = model.get_submodule(module_name)
        try:
            loader = getattr(module, "load_weight", None)
            if loader is not None:
                loader(param_name, part, tensor)
            else:  # a replicated parameter (a norm's weight): all of it, as it is
                _copy_whole(params[target], tensor)
        except ValueError as err:
            raise UserError(f"weight {name}: {err}") from err
        loaded.add((target, part))
    missing = _missing(model, loaded, tie_word_embeddings)
    if missing:
        raise UserError(f"checkpoint {folder} lacks {len(missing)} weights, e.g. {missing[:3]}")


def _copy_whole(param: torch.Tensor, tensor: SafetensorsTensor) -> None:
    if tuple(param.shape) != tensor.shape:
        raise ValueError(
            f"has shape {tensor.shape} in the checkpoint, the model expects {tuple(param.shape)}"
        )
    param.copy_(tensor.read())


def _missing(model: nn.Module, loaded: set[tuple[str, int]], tied: bool) -> list[str]:
    missing = []
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if tied and full == "lm_head.weight":
                continue
            parts = len(module.output_sizes) if isinstance(module, MergedColumnLinear) else 1
            missing += [
                f"{full}[{p}]" if parts > 1 else full for p in range(parts) if (full, p) not in loaded
            ]
    return missing
