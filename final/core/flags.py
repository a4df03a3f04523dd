"""Command-line flags declared on the dataclass fields they set, so each is written once.

    attn: str = option("auto", "attention backend: ...", group="engine", aliases=("--attention",))

A field made with `option` carries its flag's help, group, aliases (shown in --help beside the
flag: other engines' names for the same knob), choices and parser; `add_flags` turns every such
field of a dataclass into an argparse argument, and `from_namespace` reads the parsed values back
into the dataclass. Choices that live in a registry above core/ (the attention backends, the
scheduling policies, the prefix caches) are handed to `add_flags` by the caller, which knows them.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

FLAG = "flag"  # the metadata key of a field's Flag


@dataclass(frozen=True)
class Preset:
    """A flag of its own that sets the field to a fixed value (`--disable-overlap` for `--overlap
    off`); it and the field's flag exclude each other."""

    flag: str
    value: Any
    help: str


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
    for f, flag in flag_fields(cls):
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


def from_namespace(cls: type, namespace: argparse.Namespace, **extra: Any) -> Any:
    """An instance of `cls` from the parsed flags (its fields without a flag from `extra`)."""
    values = {f.name: getattr(namespace, f.name) for f, _ in flag_fields(cls)}
    return cls(**values, **extra)
