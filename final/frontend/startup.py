"""The one start-up path of the server and the shell: logging, the checks that need no model, the
model folder (the default model is converted once, here), its tokenizer and sampling defaults,
then the engine process.

Cheap checks run first, so a bad flag or a busy port fails in a second, not after minutes of
model loading.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.config import EngineConfig
from ..core.errors import UserError
from ..core.logs import setup_logging
from ..engine.resolve import validate_early
from ..models.source import resolve_model
from ..runtime.build import build_engine
from ..runtime.process import EngineBuilder, EngineProcess, launch_engine
from .detokenizer_process import DetokenizerProcess, start_detokenizer
from .sampling_defaults import API_FALLBACK, SamplingDefaults, resolve_sampling_defaults
from .tokenizer import Tokenizer


@dataclass
class Frontend:
    model_dir: Path
    tokenizer: Tokenizer
    engine: EngineProcess
    sampling_defaults: SamplingDefaults
    detokenizer: DetokenizerProcess | None = None  # the server's; the shell detokenizes itself

    def close(self) -> None:
        self.engine.shutdown()
        if self.detokenizer is not None:
            self.detokenizer.shutdown()


def start_frontend(
    config: EngineConfig,
    log_level: str,
    checks: Sequence[Callable[[], None]] = (),
    require_chat_template: bool = False,
    on_loading: Callable[[Path], None] | None = None,
    generation_config: str = "auto",
    sampling_flags: Mapping[str, Any] | None = None,
    sampling_fallback: Mapping[str, Any] = API_FALLBACK,
    chat_template: str | None = None,
    build: EngineBuilder = build_engine,
    detokenizer: bool = False,
) -> Frontend:
    """Start everything a face of the engine needs; a UserError says what is wrong. The sampling
    arguments are those of resolve_sampling_defaults (frontend/sampling_defaults.py); `build`, what
    the engine process builds its engine with (runtime/process.py: tests pass a stand-in);
    `detokenizer`, whether to start the server's detokenizer process (detokenizer_process.py)
    between the engine and this process: it starts first, so its imports overlap the model's load."""
    setup_logging(log_level)
    validate_early(config)  # a bad flag fails here, before any process or model is touched
    for check in checks:
        check()
    model_dir = resolve_model(config.model)  # converts the default model once, in this process
    tokenizer = Tokenizer(model_dir, chat_template)
    if require_chat_template and not tokenizer.has_chat_template:
        raise UserError(
            f"{model_dir.name} has no chat template, so it cannot chat; serve it and use /v1/completions"
        )
    defaults = resolve_sampling_defaults(model_dir, generation_config, sampling_flags, sampling_fallback)
    if on_loading is not None:
        on_loading(model_dir)
    detok = start_detokenizer(model_dir, log_level) if detokenizer else None
    try:
        engine = launch_engine(config, model_dir, log_level, build=build)
    except BaseException:
        if detok is not None:
            detok.shutdown()
        raise
    try:
        if detok is not None:
            detok.connect(engine)
    except BaseException:
        engine.shutdown()
        detok.shutdown()
        raise
    return Frontend(model_dir, tokenizer, engine, defaults, detok)
