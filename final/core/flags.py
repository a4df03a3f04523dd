"""Command-line flags declared on the dataclass fields they set, so each is written once.

    attn: str = option("auto", "attention backend: ...", group="engine", aliases=("--attention",))

A field made with `option` carries its flag's help, group, aliases (shown in --help beside the
flag: other engines' names for the same knob), choices and parser; `add_flags` turns every such
field of a dataclass into an argparse argument, and `from_namespace` reads the parsed values back
into the dataclass. `from_keywords` does the same for keyword arguments (the offline
`LLM(max_model_len=...)`), where the aliases and presets are keywords too: a vLLM or SGLang user's
spelling works in both places, and is declared once. `FlagParser` is the parser itself: flags
spelled out, a near miss answered with "did you mean" (the stages' parser is the same class). Choices that live in a registry above core/ (the attention backends, the
scheduling policies, the prefix caches) are handed to `add_flags` by the caller, which knows them.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import UserError

FLAG = "flag"  # the metadata key of a field's Flag
UNSET: Any = object()  # a Preset without a negated form


@dataclass(frozen=True)
class Preset:
    """A flag of its own that sets the field to a fixed value (`--disable-overlap` for `--overlap
    off`); it and the field's flag exclude each other. With `negated`, a `--no-...` flag sets that
    value (vLLM's `--no-enable-prefix-caching`). As a keyword (`enforce_eager=True`), True sets
    `value` and False sets `negated`, or leaves the field's default when there is none."""

    flag: str
    value: Any
    help: str
    negated: Any = UNSET

    @property
    def negated_flag(self) -> str:
        return "--no-" + self.flag.removeprefix("--")


@dataclass(frozen=True)
class Flag:
    help: str
    group: str
    aliases: tuple[str, ...] = ()
    choices: tuple[Any, ...] | None = None
    parse: Callable[[str], Any] | None = None  # text -> value; default: the field's type
    metavar: str | None = None
    presets: tuple[Preset, ...] = ()
    name: str | None = None  # the flag; default: --field-name


class FlagParser(argparse.ArgumentParser):
    """argparse with one rule for flags, the same in every stage and in final/: a flag is spelled
    out (no abbreviations, which a new flag could silently change the meaning of), and a flag it
    does not know gets the nearest it does: `--max-token 8` -> "did you mean --max-tokens?"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:  # type: ignore[override]
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            known = list(self._option_string_actions)
            hints = {}
            for item in extras:
                flag = item.split("=", 1)[0]
                near = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag.startswith("-") else []
                if near:
                    hints[flag] = near[0]
            if len(hints) == 1:
                hint = f"; did you mean {next(iter(hints.values()))}?"
            else:
                hint = "".join(f"; {flag}: did you mean {near}?" for flag, near in hints.items())
            self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return namespace


def option(
    default: Any,
    help: str,
    *,
    group: str,
    aliases: Iterable[str] = (),
    choices: Iterable[Any] | None = None,
    parse: Callable[[str], Any] | None = None,
    metavar: str | None = None,
    presets: Iterable[Preset] = (),
    name: str | None = None,
) -> Any:
    """A dataclass field with its flag (typed Any so that `x: int = option(1, ...)` type-checks)."""
    flag = Flag(
        help,
        group,
        tuple(aliases),
        None if choices is None else tuple(choices),
        parse,
        metavar,
        tuple(presets),
        name,
    )
    return field(default=default, metadata={FLAG: flag})


def flag_fields(cls: type) -> list[tuple[dataclasses.Field, Flag]]:
    return [(f, f.metadata[FLAG]) for f in dataclasses.fields(cls) if FLAG in f.metadata]


def flag_name(f: dataclasses.Field, flag: Flag) -> str:
    return flag.name or "--" + f.name.replace("_", "-")


def _value_type(annotation: Any) -> Any:
    """int for `int | None`, and so on; the type argparse parses the text into."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return args[0] if len(args) == 1 else str
    return annotation


def add_flags(
    groups: Mapping[str, argparse._ArgumentGroup],
    cls: type,
    choices: Mapping[str, Iterable[Any]] | None = None,
    more_help: Mapping[str, str] | None = None,
) -> None:
    """An argparse argument for every flagged field of `cls`, in the group each names; `choices`:
    field name -> the values a registry knows (for fields whose flag declares none); `more_help`:
    field name -> what a registry says about them, after the field's own help."""
    hints = typing.get_type_hints(cls)
    # In the groups' order (a class built from option classes lists its bases' fields first):
    # usage and --help read model, engine, parallel, ... whatever the class hierarchy.
    order = list(groups)
    for f, flag in sorted(flag_fields(cls), key=lambda field_flag: order.index(field_flag[1].group)):
        group = groups[flag.group]
        kind = _value_type(hints[f.name])
        known = flag.choices if flag.choices is not None else (choices or {}).get(f.name)
        text = " ".join(t for t in (flag.help, (more_help or {}).get(f.name)) if t)
        options: dict[str, Any] = {"dest": f.name, "help": text, "default": f.default}
        if kind is bool:
            options["action"] = "store_true"
        else:
            options["type"] = flag.parse or kind
            if known is not None:
                options["choices"] = list(known)
            if flag.metavar:
                options["metavar"] = flag.metavar
            if isinstance(f.default, tuple):  # shown as typed, and parsed like typed text
                options["default"] = ",".join(map(str, f.default))
        target = group.add_mutually_exclusive_group() if flag.presets else group
        target.add_argument(flag_name(f, flag), *flag.aliases, **options)
        for preset in flag.presets:
            target.add_argument(
                preset.flag, dest=f.name, action="store_const", const=preset.value, help=preset.help
            )
            if preset.negated is not UNSET:
                target.add_argument(
                    preset.negated_flag,
                    dest=f.name,
                    action="store_const",
                    const=preset.negated,
                    help=f"the same as {flag_name(f, flag)} {preset.negated}",
                )


def from_namespace(cls: type, namespace: argparse.Namespace, **extra: Any) -> Any:
    """An instance of `cls` from the parsed flags (its fields without a flag from `extra`)."""
    values = {f.name: getattr(namespace, f.name) for f, _ in flag_fields(cls)}
    return cls(**values, **extra)


def keyword(flag: str) -> str:
    """The keyword of a flag: `--max-model-len` -> `max_model_len`."""
    return flag.lstrip("-").replace("-", "_")


def from_keywords(cls: type, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The field values that keyword arguments name, each under its field's name, its flag's
    aliases (`max_model_len` for `max_seq_len_override`) or a preset (`enforce_eager=True`); a
    UserError for a keyword none of them knows, or for one field given twice."""
    fields = {f.name for f in dataclasses.fields(cls)}
    aliases: dict[str, tuple[str, Preset | None]] = {}
    for f, flag in flag_fields(cls):
        for alias in flag.aliases:
            aliases[keyword(alias)] = (f.name, None)
        for preset in flag.presets:
            aliases[keyword(preset.flag)] = (f.name, preset)
    unknown = sorted(k for k in kwargs if k not in fields and k not in aliases)
    if unknown:
        known = sorted(fields | set(aliases))
        raise UserError(f"unknown engine option(s) {', '.join(unknown)}; known: {', '.join(known)}")
    values: dict[str, Any] = {}
    given_as: dict[str, str] = {}
    for name, value in kwargs.items():
        target, preset = aliases.get(name, (name, None))
        if preset is not None:
            if not isinstance(value, bool):
                raise UserError(f"{name} must be True or False, got {value!r}")
            value = preset.value if value else preset.negated
            if value is UNSET:
                continue  # `enforce_eager=False`: nothing asked for
        if target in given_as:
            raise UserError(f"{given_as[target]} and {name} set the same option: give one of them")
        values[target], given_as[target] = value, name
    return values


def env_count(name: str, expected: str) -> int | None:
    """A count from environment variable `name`, an A/B switch that overrides a flag or default
    (FINAL_PREFILL_GRAPHS, FINAL_TC_MIN_BATCH): None where unset or empty; anything but digits is
    the user's error, saying what was `expected`."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise UserError(f"{name}={value!r}: expected {expected}")
    return int(value)
