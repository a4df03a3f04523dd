"""Load the weights of a Hugging Face safetensors checkpoint into a model built on the meta device.

Building on the meta device costs no memory and no random initialisation; each tensor of the
checkpoint is then read once, converted to the wanted dtype and device, and put in place.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from .errors import UserError

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
                    clean = clean.replace(prefix, "", 1) if clean.startswith(prefix) else clean
                yield clean, reader.get_tensor(name)


def load_weights(
    model: nn.Module,
    folder: Path,
    device: torch.device | str,
    dtype: torch.dtype,
    tie_word_embeddings: bool = False,
    loader: Callable[[str, torch.Tensor], bool] | None = None,
) -> None:
    """Fill every parameter of `model` from the checkpoint in `folder`.

    `loader(name, tensor)` lets a model take a tensor itself (to fuse or shard it); it returns
    True when it did. Parameters are matched by name otherwise; a missing one is an error.
    """
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in iter_checkpoint(folder):
        if loader is not None and loader(name, tensor):
            loaded.add(name)
            continue
        if name not in params:
            continue  # e.g. rotary inv_freq buffers that old checkpoints carry
        if tuple(params[name].shape) != tuple(tensor.shape):
            raise UserError(
                f"weight {name} has shape {tuple(tensor.shape)} in the checkpoint, "
                f"the model expects {tuple(params[name].shape)}"
            )
        _set_parameter(model, name, tensor.to(device=device, dtype=dtype))
        loaded.add(name)
    if tie_word_embeddings and "lm_head.weight" in params and "lm_head.weight" not in loaded:
        model.get_submodule("lm_head").weight = model.get_submodule("model.embed_tokens").weight
        loaded.add("lm_head.weight")
    missing = [n for n, p in model.named_parameters() if p.is_meta]
    if missing:
        raise UserError(f"checkpoint {folder} lacks {len(missing)} weights, e.g. {missing[:3]}")


def _set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    setattr(module, attr, nn.Parameter(value, requires_grad=False))
