"""Sampling parameters: how one request picks its next token, and when it stops.

The fields and their meaning are those of stages/common/sampling.py, so a script written against
a stage runs against final/ unchanged; `SamplingParams.coerce` accepts any object with these
attribute names (a stage's SamplingParams, a namespace) and returns final's own type. The fields
final/ adds (`n` and the penalties) have vLLM's names, ranges and meaning
(https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html):

    presence_penalty    in [-2, 2]: subtracted from the logit of every token the answer already has
    frequency_penalty   in [-2, 2]: subtracted once per time the answer already has the token
    repetition_penalty  > 0: a token of the prompt or of the answer has its logit divided by it
                        when positive, multiplied when negative (1: off; > 1 discourages repeats)

Presence and frequency count the answer's tokens only, as OpenAI and vLLM define them; repetition
counts the prompt's too, as vLLM and Hugging Face do. They apply to the logits before the
temperature and the filters; logprobs stay those of the model's own distribution.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import UserError

INT32_MAX = 2**31 - 1  # top_k lives in an int32 device tensor
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
MAX_N = 128  # answers per prompt (the server caps a request at fewer: server/protocol.py)
# New tokens of a request that sets no max_tokens: the offline API's default, and the server's and
# the shell's cap (--max-tokens; frontend/sampling_defaults.py), so every answer ends.
DEFAULT_MAX_TOKENS = 256


@dataclass
class StructuredOutputsParams:
    """What the answer must follow (vLLM's class of the same name; exactly one field set): any JSON
    object, JSON that follows a schema (a dict or its text), a regular expression, one of some
    strings, or an EBNF grammar (xgrammar's dialect). The server's response_format json_object and
    json_schema become the first two. engine/structured.py compiles and enforces it."""

    json: dict[str, Any] | str | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    # JSON without whitespace between its tokens (vLLM's option of the same name): a model that
    # is not trained for the format cannot wander in blanks (the server's forced tool calls).
    disable_any_whitespace: bool = False

    KINDS = ("json", "json_object", "regex", "choice", "grammar")

    def __post_init__(self) -> None:
        given = [name for name in self.KINDS if getattr(self, name) is not None]
        if len(given) != 1:
            raise UserError(
                "structured outputs take exactly one of json, json_object, regex, choice, grammar; "
                f"got {', '.join(given) or 'none'}"
            )
        if self.json_object is False:
            raise UserError("json_object=False asks for nothing: leave structured_outputs out")

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def kind(self) -> str:
        return next(name for name in self.KINDS if getattr(self, name) is not None)


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
    # vLLM's name and default: the text leaves out the special tokens the model writes (<|im_end|>,
    # <think> where it is one); False writes them out, for a client that parses them itself.
    skip_special_tokens: bool = True
    logprobs: int | None = None  # None: no logprobs; n >= 0: the sampled token's and the top n
    n: int = 1  # answers per prompt, each its own request (answer i seeded with seed + i)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    structured_outputs: StructuredOutputsParams | None = None  # a grammar the answer follows

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
            (1 <= self.n <= MAX_N, f"n must be in [1, {MAX_N}], got {self.n}"),
            (
                -2 <= self.presence_penalty <= 2,
                f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
            ),
            (
                -2 <= self.frequency_penalty <= 2,
                f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
            ),
            (
                0 < self.repetition_penalty < math.inf,
                f"repetition_penalty must be a finite number > 0, got {self.repetition_penalty}",
            ),
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
        for name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                raise UserError(f"{name} must be True or False, got {getattr(self, name)!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits (the sampler skips them all otherwise)."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1)

    def for_choice(self, index: int) -> SamplingParams:
        """The parameters of answer `index` of n: its own random stream (seed + index), so the n
        answers differ yet a seeded request is still reproducible (vLLM's rule too)."""
        if self.seed is None or index == 0:
            return self
        return dataclasses.replace(self, seed=self.seed + index)

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
