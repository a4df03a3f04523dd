"""Structured outputs: a grammar decides which tokens may come next (any JSON object, JSON that
follows a schema, a regular expression, one of some strings, an EBNF grammar), and the sampler
masks out the rest before it draws.

The seam is small. `StructuredOutputs` (one per engine) compiles a request's grammar and hands out
a `Matcher` that follows the request's answer: before a step samples, every constrained request's
matcher writes its allowed tokens into a bitmask (one bit per vocabulary token, 32 to an int32),
which goes to the device with the logits' other filters; after the step, the engine feeds each
sampled token back (`accept`). A matcher needs a request's every token before it can say what may
follow, so a step with a constrained request is collected before the next is scheduled (overlap
pauses while one runs: engine/core.py). Nothing of this runs for an engine that never sees one.

The grammar engine is xgrammar (https://github.com/mlc-ai/xgrammar, what vLLM and SGLang use by
default), imported when the first constrained request arrives; without the package such a
request is refused with what to install. Another backend is one class with `matcher`.
"""

from __future__ import annotations

import importlib.util
import json
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from ..core.errors import UserError
from ..core.sampling_params import StructuredOutputsParams

CACHED = 64  # compiled grammars kept
MISSING = (
    "structured outputs (response_format json_object or json_schema) need the xgrammar package, "
    "which is not installed: pip install xgrammar"
)


def available() -> bool:
    return importlib.util.find_spec("xgrammar") is not None


class Matcher(Protocol):
    """One constrained request's place in its grammar."""

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into row `row` of an int32 [batch, words] bitmask."""

    def accept(self, token: int) -> bool:
        """Advance past `token`; False when the grammar does not allow it."""

    @property
    def terminated(self) -> bool:
        """The grammar is complete (its stop token accepted): nothing may follow."""


class _XGrammarMatcher:
    def __init__(self, matcher: Any):
        self.matcher = matcher

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(bitmask, row)

    def accept(self, token: int) -> bool:
        return bool(self.matcher.accept_token(token))

    @property
    def terminated(self) -> bool:
        return bool(self.matcher.is_terminated())


class StructuredOutputs:
    """Compiles grammars (each once) against the model's tokenizer, made on first use."""

    def __init__(self, model_dir: Path, vocab_size: int, stop_token_ids: Sequence[int]):
        self.model_dir, self.vocab_size, self.stop_token_ids = model_dir, vocab_size, list(stop_token_ids)
        self.compiler: Any = None
        self.compiled: OrderedDict[str, Any] = OrderedDict()  # the latest CACHED grammars, by spec

    def matcher(self, spec: StructuredOutputsParams) -> Matcher:
        """A fresh matcher for one request; a UserError for a grammar that cannot be compiled."""
        import xgrammar

        key = json.dumps(spec.as_dict(), sort_keys=True)
        if key in self.compiled:
            self.compiled.move_to_end(key)
        else:
            self.compiled[key] = self._compile(spec)
            if len(self.compiled) > CACHED:  # a server sees many schemas: keep the recent ones
                self.compiled.popitem(last=False)
        return _XGrammarMatcher(xgrammar.GrammarMatcher(self.compiled[key]))

    def _compile(self, spec: StructuredOutputsParams) -> Any:
        compiler = self.compiler or self._start()
        try:
            blanks = not spec.disable_any_whitespace
            if spec.json_object:  # a JSON object, as OpenAI's json_object means (not any JSON value)
                return compiler.compile_json_schema(json.dumps({"type": "object"}), any_whitespace=blanks)
            if spec.json is not None:
                schema = spec.json if isinstance(spec.json, str) else json.dumps(spec.json)
                return compiler.compile_json_schema(schema, any_whitespace=blanks)
            if spec.regex is not None:
                return compiler.compile_regex(spec.regex)
            if spec.choice is not None:
                return compiler.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in spec.choice))
            return compiler.compile_grammar(spec.grammar)
        except (RuntimeError, ValueError, TypeError) as err:
            raise UserError(f"the structured output's {spec.kind} cannot be compiled: {err}") from None

    def _start(self) -> Any:
        if not available():
            raise UserError(MISSING)
        import xgrammar
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
        )
        self.compiler = xgrammar.GrammarCompiler(info)
        return self.compiler


def grammar_bitmask(matchers: Sequence[Matcher | None], vocab_size: int) -> torch.Tensor:
    """The host bitmask of a batch: every token allowed (all bits set) in rows without a matcher."""
    words = -(-vocab_size // 32)
    bitmask = torch.full((len(matchers), words), -1, dtype=torch.int32)
    for row, matcher in enumerate(matchers):
        if matcher is not None:
            matcher.fill(bitmask, row)
    return bitmask


def apply_bitmask(scores: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """`scores` with -inf for every token the bitmask leaves out (bit j of word i: token 32 i + j)."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # an arithmetic shift: the sign bit is bit 31
    allowed = bits.view(bitmask.shape[0], -1)[:, : scores.shape[-1]].bool()
    return scores.masked_fill(~allowed, float("-inf"))
