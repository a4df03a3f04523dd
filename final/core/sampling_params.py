"""Sampling parameters: how one request picks its next token, and when it stops.

The fields and their meaning are those of stages/common/sampling.py, so a script written against
a stage runs against final/ unchanged; `SamplingParams.coerce` accepts any object with these
attribute names (a stage's SamplingParams, a namespace) and returns final's own type.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import UserError

INT32_MAX = 2**31 - 1  # top_k lives in an int32 device tensor
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
# New tokens of a request that sets no max_tokens: the offline API's default, and the server's and
# the shell's cap (--max-tokens; frontend/sampling_defaults.py), so every answer ends.
DEFAULT_MAX_TOKENS = 256


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 is greedy
    top_k: int = -1  # -1 or 0: no top-k
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None  # a private random stream: same seed, same output
    max_tokens: int | None = DEFAULT_MAX_TOKENS  # None: as many as the context and the KV pool leave room for
    stop: list[str] = field(default_factory=list)  # stop strings, cut from the text
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: no logprobs; n >= 0: the sampled token's and the top n

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name in ("stop", "stop_token_ids"):
            if not isinstance(getattr(self, name), (list, tuple)):
                raise UserError(f"{name} must be a list, got {getattr(self, name)!r}")
            setattr(self, name, list(getattr(self, name)))
        self.validate()

    def validate(self) -> None:
        self._check_types()  # first: the range checks below compare, and "0.5" >= 0 is a TypeError
        checks: list[tuple[bool, str]] = [
            (
                self.temperature >= 0 and math.isfinite(self.temperature),
                f"temperature must be a finite number >= 0, got {self.temperature}",
            ),
            (
                -1 <= self.top_k <= INT32_MAX,
                f"top_k must be in [1, {INT32_MAX}], or -1 or 0 for no limit, got {self.top_k}",
            ),
            (
                self.seed is None or SEED_RANGE[0] <= self.seed <= SEED_RANGE[1],
                f"seed must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {self.seed}",
            ),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (
                self.max_tokens is None or self.max_tokens >= 1,
                f"max_tokens must be >= 1, got {self.max_tokens}",
            ),
            (self.logprobs is None or self.logprobs >= 0, f"logprobs must be >= 0, got {self.logprobs}"),
            (all(isinstance(s, str) for s in self.stop), "stop must be a string or a list of strings"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    def _check_types(self) -> None:
        """A UserError for a value of the wrong type: a bool is not a number here (True would be a
        max_tokens of 1), nor a float an integer (a seed of 1.5 would fail later, in the engine)."""
        integers = {
            "top_k": self.top_k,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "logprobs": self.logprobs,
        }
        for name, value in integers.items():
            optional = name != "top_k"
            if not (_is_integer(value) or (optional and value is None)):
                raise UserError(f"{name} must be an integer{' or None' if optional else ''}, got {value!r}")
        for name in ("temperature", "top_p", "min_p"):
            if not _is_real(getattr(self, name)):
                raise UserError(f"{name} must be a number, got {getattr(self, name)!r}")
        if not all(_is_integer(t) for t in self.stop_token_ids):
            raise UserError(f"stop_token_ids must be a list of integers, got {self.stop_token_ids!r}")
        if not isinstance(self.ignore_eos, bool):
            raise UserError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @classmethod
    def coerce(cls, params: Any) -> SamplingParams:
        """final's SamplingParams from any object carrying the same attribute names."""
        if params is None:
            return cls()
        if isinstance(params, cls):
            params.validate()
            return params
        values = {f.name: getattr(params, f.name) for f in fields(cls) if hasattr(params, f.name)}
        return cls(**values)


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)
