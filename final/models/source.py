"""Turn what the user typed after --model into a local Hugging Face folder, or a clear error."""

from __future__ import annotations

import os
from pathlib import Path

from ..core.errors import UserError
from .default_model import ensure_default_model

DEFAULT_MODEL_ALIASES = {None, "", "default", "smollm2", "SmolLM2-135M-Instruct"}
HUB_FILES = ["*.json", "*.safetensors", "tokenizer*", "*.jinja", "*.model", "*.txt"]


def resolve_model(name: str | os.PathLike | None) -> Path:
    """A local folder, the default model, or a hub id (downloaded when the hub is reachable)."""
    if name is None or str(name) in DEFAULT_MODEL_ALIASES:
        return ensure_default_model()
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise UserError(f"{path} is a folder but has no config.json: not a Hugging Face model folder")
        return path
    if path.exists():
        raise UserError(f"{path} is a file; --model wants a Hugging Face model folder or a hub id")
    if _looks_like_hub_id(str(name)):
        return _download(str(name))
    raise UserError(f"model not found: {name} (no such folder, and not a hub id like Qwen/Qwen3-0.6B)")


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _download(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:  # pragma: no cover - huggingface_hub is a dependency
        raise UserError(f"{repo_id} looks like a hub id but huggingface_hub is not installed") from err
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as err:  # offline, unknown repo, gated repo: all end the same way for the user
        raise UserError(
            f"could not get {repo_id} from the Hugging Face hub ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else 'no detail'}). Without network access, "
            f"download it elsewhere and pass --model /path/to/folder"
        ) from err
