"""Sampling defaults: what a request gets for the sampling parameters it leaves out.

The server, the shell and the offline LLM resolve them here, one way, the first that says wins:

1. the request itself (a JSON field, the shell's `/set`, the `params` given to LLM.chat);
2. the command line: --temperature, --top-p, --top-k, --min-p, --max-tokens;
3. the model's generation_config.json: its temperature, top_p, top_k, min_p, and max_new_tokens
   as max_tokens (what vLLM reads; `--generation-config none` skips the file, a folder reads
   another one). Qwen3 ships temperature 0.6, top_p 0.95, top_k 20 there, for example;
4. the built-in values: OpenAI's for the server and the offline API (temperature 1, top_p 1,
   no top-k, no min-p), greedy for the shell (a small model sampled at temperature 1 rambles),
   and DEFAULT_MAX_TOKENS new tokens for every face, so a request without max_tokens still ends.

A default max_tokens is a cap, not a demand: `fit_default_max_tokens` shrinks it to the room the
context and the KV pool leave, where an explicit max_tokens that cannot fit is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..core.errors import UserError
from ..core.limits import max_new_tokens
from ..core.sampling_params import DEFAULT_MAX_TOKENS, SamplingParams

# generation_config.json key -> SamplingParams field
GENERATION_CONFIG_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "max_new_tokens": "max_tokens",
}
FIELDS = ("temperature", "top_p", "top_k", "min_p", "max_tokens")
API_FALLBACK: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "max_tokens": DEFAULT_MAX_TOKENS,
}
SHELL_FALLBACK: dict[str, Any] = {**API_FALLBACK, "temperature": 0.0}
BUILT_IN = "built-in"


@dataclass(frozen=True)
class SamplingDefaults:
    """The resolved defaults, and where each came from (for the start-up log and the shell)."""

    values: Mapping[str, Any] = field(default_factory=lambda: dict(API_FALLBACK))
    sources: Mapping[str, str] = field(default_factory=lambda: dict.fromkeys(FIELDS, BUILT_IN))

    def params(self, **given: Any) -> SamplingParams:
        """SamplingParams from what the caller gives: a None among FIELDS means "left out" and
        takes the default; other SamplingParams fields (seed, stop, ...) pass through."""
        merged = {name: given.pop(name, None) for name in FIELDS}
        for name, value in merged.items():
            if value is None:
                merged[name] = self.values[name]
        return SamplingParams(**merged, **given)

    def describe(self) -> str:
        """'temperature 0.6 (generation_config.json), ..., max_tokens 256 (built-in)'."""
        parts = []
        for name in FIELDS:
            value = self.values[name]
            shown = "no cap" if value is None else f"{value:g}"
            parts.append(f"{name} {shown} ({self.sources[name]})")
        return ", ".join(parts)


def read_generation_config(folder: Path) -> dict[str, Any]:
    """The sampling fields of `folder`/generation_config.json, as SamplingParams names; {} when
    the file is absent. Keys we do not use (do_sample, repetition_penalty, ...) are ignored."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UserError(f"cannot read {path}: {err}; --generation-config none ignores it") from err
    if not isinstance(raw, dict):
        raise UserError(f"{path} is not a JSON object; --generation-config none ignores it")
    found: dict[str, Any] = {}
    for key, name in GENERATION_CONFIG_KEYS.items():
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[name] = int(value) if name in ("top_k", "max_tokens") else float(value)
    return found


def generation_config_folder(model_dir: Path, generation_config: str) -> Path | None:
    """Which folder's generation_config.json to read: auto (the model's), none, or a folder."""
    if generation_config == "auto":
        return Path(model_dir)
    if generation_config == "none":
        return None
    folder = Path(generation_config).expanduser()
    if not folder.is_dir():
        raise UserError(f"--generation-config {generation_config}: no such folder (or say auto or none)")
    return folder


def sampling_flags(args: Any) -> dict[str, Any]:
    """The command line's sampling flags (final/args.py) as SamplingParams fields; None: not given."""
    return {name: getattr(args, name, None) for name in FIELDS}


def resolve_sampling_defaults(
    model_dir: Path,
    generation_config: str = "auto",
    flags: Mapping[str, Any] | None = None,
    fallback: Mapping[str, Any] = API_FALLBACK,
) -> SamplingDefaults:
    """The defaults in the order of the module docstring. `flags`: field -> value or None (not
    given); a max_tokens of 0 means no cap."""
    values, sources = dict(fallback), dict.fromkeys(FIELDS, BUILT_IN)
    folder = generation_config_folder(model_dir, generation_config)
    if folder is not None:
        for name, value in read_generation_config(folder).items():
            values[name], sources[name] = value, "generation_config.json"
    for name, value in (flags or {}).items():
        if value is not None:
            values[name], sources[name] = value, "--" + name.replace("_", "-")
    if values["max_tokens"] == 0:
        values["max_tokens"] = None
    for name in FIELDS:  # a bad value names where it came from
        try:
            SamplingParams(**{name: values[name]})
        except UserError as err:
            raise UserError(f"{err} (from {sources[name]})") from None
    return SamplingDefaults(values, sources)


def fit_default_max_tokens(
    params: SamplingParams, prompt_ids: Sequence[int], max_context: int, vocab_size: int, kv_capacity: int
) -> SamplingParams:
    """A max_tokens that came from the defaults shrinks to the room the context and the KV pool
    leave (core/limits decides the room). A prompt that leaves none is left for the engine's
    own check to refuse, with its message."""
    try:
        room = max_new_tokens(prompt_ids, None, max_context, vocab_size, kv_capacity)
    except UserError:
        return params
    cap = room if params.max_tokens is None else min(params.max_tokens, room)
    return replace(params, max_tokens=cap)
