"""Load a Hugging Face safetensors checkpoint into a model whose memory is already allocated.

Each tensor is read once (peak host memory: one tensor), cast and copied into its place on the
device. Checkpoint modules that the model merges (q/k/v, gate/up) go into their slice of the
merged weight through `MergedLinear.load_shard`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from ..core.errors import UserError
from .layers import MergedLinear

# Prefixes that wrapped checkpoints put in front of the decoder's own names.
STRIP_PREFIXES = ("language_model.",)


def checkpoint_files(folder: Path) -> list[Path]:
    files = sorted(Path(folder).glob("*.safetensors"))
    # Mistral ships both sharded files and a consolidated copy of the same weights.
    if len(files) > 1:
        files = [f for f in files if f.name != "consolidated.safetensors"]
    if not files:
        raise UserError(f"no .safetensors weights in {folder} (only safetensors checkpoints are supported)")
    return files


def iter_checkpoint(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of the checkpoint, one at a time (on the CPU)."""
    for file in checkpoint_files(folder):
        with safe_open(str(file), framework="pt") as reader:
            for name in reader.keys():
                clean = name
                for prefix in STRIP_PREFIXES:
                    clean = clean.removeprefix(prefix)
                yield clean, reader.get_tensor(name)


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
        target = _packed_target(name, packed)
        if target is not None and target[0] in params:
            merged_name, shard = target
            module_name, _, param_name = merged_name.rpartition(".")
            module = model.get_submodule(module_name)
            assert isinstance(module, MergedLinear)
            try:
                module.load_shard(param_name, shard, tensor)
            except ValueError as err:
                raise UserError(f"weight {name}: {err}") from err
            loaded.add((merged_name, shard))
            continue
        if name not in params:
            continue  # e.g. rotary inv_freq buffers that old checkpoints carry
        param = params[name]
        if tuple(param.shape) != tuple(tensor.shape):
            raise UserError(
                f"weight {name} has shape {tuple(tensor.shape)} in the checkpoint, the model expects {tuple(param.shape)}"
            )
        param.copy_(tensor)
        loaded.add((name, 0))
    missing = _missing(model, loaded, tie_word_embeddings)
    if missing:
        raise UserError(f"checkpoint {folder} lacks {len(missing)} weights, e.g. {missing[:3]}")


def _missing(model: nn.Module, loaded: set[tuple[str, int]], tied: bool) -> list[str]:
    missing = []
    for module_name, module in model.named_modules():
        for param_name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{param_name}" if module_name else param_name
            if tied and full == "lm_head.weight":
                continue
            shards = len(module.output_sizes) if isinstance(module, MergedLinear) else 1
            missing += [
                f"{full}[{s}]" if shards > 1 else full for s in range(shards) if (full, s) not in loaded
            ]
    return missing
