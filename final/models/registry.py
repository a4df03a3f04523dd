"""The model architectures final/ serves, in one registry: config.json's `architectures` name ->
how to read that config and which class implements it.

Every architecture served today is a Llama-family decoder, read by core/model_config.py (a copy
of the stages' reader, pinned to it by tests/final/test_final_copies.py) and built by
`LlamaForCausalLM`. A new family (MoE, sliding window, ...) is a new file with its class (and,
if its config.json says more than the Llama reader reads, its reader) plus one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from ..core.errors import UserError
from ..core.model_config import SUPPORTED_ARCHITECTURES, ModelConfig, load_model_config, read_config_json
from .llama import LlamaForCausalLM


@dataclass(frozen=True)
class Architecture:
    model: type[nn.Module]  # built as model(config, tp) on the meta device (models/loader.py)
    read_config: Callable[[Path, int | None], ModelConfig] = load_model_config  # (folder, max context)


LLAMA = Architecture(LlamaForCausalLM)

# --8<-- [start:architectures]
ARCHITECTURES: dict[str, Architecture] = {
    # The Llama reader's own list: Llama 2/3 and SmolLM2, Mistral, Qwen2 (qkv bias), Qwen3 (q/k norm).
    **dict.fromkeys(SUPPORTED_ARCHITECTURES, LLAMA),
    # A new family: "NameForCausalLM": Architecture(ItsClass, its_config_reader),
}
# --8<-- [end:architectures]


def architecture_of(folder: Path) -> Architecture:
    """The registry's entry for the checkpoint in `folder` (a UserError names the supported ones)."""
    path, raw = read_config_json(folder)
    names = raw.get("architectures") or []
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise UserError(
        f"unsupported architecture {names or raw.get('model_type')!r} in {path}; "
        f"supported: {', '.join(ARCHITECTURES)}"
    )


def read_model_config(folder: Path, max_context_override: int | None = None) -> ModelConfig:
    """The model's config, read by its architecture's reader."""
    return architecture_of(folder).read_config(Path(folder), max_context_override)


def model_class(config: ModelConfig) -> type[nn.Module]:
    entry = ARCHITECTURES.get(config.architecture)
    if entry is None:
        raise UserError(f"no implementation for {config.architecture}; supported: {', '.join(ARCHITECTURES)}")
    return entry.model
