"""Tokenizer and chat template."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from ..core.errors import UserError

# What apply_chat_template takes from us (and the variables it passes the template itself): a
# request's chat_template_kwargs may not set them.
RESERVED_TEMPLATE_NAMES = frozenset({
    "self", "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors",
    "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
})  # fmt: skip


def check_template_kwargs(kwargs: dict[str, Any] | None) -> None:
    """A UserError when chat_template_kwargs would set a name the caller sets."""
    taken = sorted(set(kwargs or {}) & RESERVED_TEMPLATE_NAMES)
    if taken:
        raise UserError(f"chat_template_kwargs may not set {', '.join(taken)}: the server sets them")


Message = dict[str, Any]  # role and content; an assistant's tool_calls, a tool's tool_call_id


class Tokenizer:
    skip_special_tokens = True  # what decode() does with special tokens (for_request)

    def __init__(self, folder: Path, chat_template: str | None = None):
        """`chat_template`: a Jinja chat template, or a file holding one, used instead of the
        model's (vLLM's --chat-template)."""
        from transformers import AutoTokenizer

        try:
            self.hf = AutoTokenizer.from_pretrained(str(folder))
        except Exception as err:
            raise UserError(f"cannot load the tokenizer of {folder}: {err}") from err
        if chat_template is not None:
            self.hf.chat_template = read_chat_template(chat_template)
        self._decode_ids = _direct_decode(self.hf)
        self._token_texts: dict[int, str] = {}  # see decode
        self._candidate_texts: dict[int, str] = {}  # see token_text (special tokens kept)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (the longest vocabulary entry), so a text of
        more than `context * max_token_chars` characters cannot fit the context, whatever its
        tokens: the server refuses such a text without tokenizing all of it."""
        return max(1, max((len(piece) for piece in self.hf.get_vocab()), default=1))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def encode_chat(
        self,
        messages: Sequence[Message],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> list[int]:
        # The template already wrote any BOS token; letting encode() add another would double it.
        text = self.render_chat(messages, tools=tools, template_kwargs=template_kwargs)
        return self.encode(text, add_special_tokens=False)

    def template_takes_tools(self, chat_template: str | None = None) -> bool:
        """Whether the chat template (the model's, or `chat_template`) reads `tools` at all: one
        that does not would drop them without a word, and the model would never hear of them."""
        template = chat_template or getattr(self.hf, "chat_template", None) or ""
        return "tools" in (template if isinstance(template, str) else json.dumps(template))

    def render_chat(
        self,
        messages: Sequence[Message],
        chat_template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The conversation in the chat template (the model's, or `chat_template`), up to the
        assistant's turn; `tools` (OpenAI's function definitions) shown to the model by it;
        `template_kwargs` more variables for the template (vLLM's chat_template_kwargs: Qwen3's
        `enable_thinking`), none of the names this call sets itself."""
        check_template_kwargs(template_kwargs)
        if chat_template is None and not self.has_chat_template:
            raise UserError("this model has no chat template; send a plain prompt (/v1/completions) instead")
        if tools and not self.template_takes_tools(chat_template):
            raise UserError(
                "this model's chat template takes no tools, so the model would never see them: "
                "serve it with a --chat-template that does, or leave tools out"
            )
        try:
            text = self.hf.apply_chat_template(
                list(messages),
                chat_template=chat_template,
                tools=tools or None,
                add_generation_prompt=True,
                tokenize=False,
                **(template_kwargs or {}),
            )
        except Exception as err:  # the template itself rejects the conversation (e.g. an unknown role)
            raise UserError(f"the chat template rejected the messages: {err}") from err
        return text

    def decode(self, ids: Sequence[int]) -> str:
        # The detokenizer calls this twice per generated token of every request (at batch 256,
        # the host's largest cost per step). One of the two is the text of the token before the
        # new one, alone: a token's text never changes, so that one is remembered.
        if len(ids) == 1:
            text = self._token_texts.get(ids[0])
            if text is None:
                text = self._token_texts[ids[0]] = self._decode(ids)
            return text
        return self._decode(ids)

    def for_request(self, skip_special_tokens: bool) -> Tokenizer:
        """The tokenizer whose `decode` a request's text takes: this one, or its twin that writes
        special tokens out (a request's skip_special_tokens=False)."""
        return self if skip_special_tokens else self._keeping_special_tokens

    @cached_property
    def _keeping_special_tokens(self) -> Tokenizer:
        twin = copy.copy(self)  # the same HF tokenizer; a cache of token texts of its own
        twin.skip_special_tokens, twin._token_texts = False, {}
        return twin

    def _decode(self, ids: Sequence[int]) -> str:
        # Straight to the Rust tokenizer where HF's wrapper adds nothing but its own cost.
        if self._decode_ids is not None:
            return self._decode_ids(list(ids), skip_special_tokens=self.skip_special_tokens)
        return self.hf.decode(list(ids), skip_special_tokens=self.skip_special_tokens)

    def decode_with_special_tokens(self, ids: Sequence[int]) -> str:
        """The text of `ids` with their special tokens written out (/detokenize: a templated
        prompt's ids give back the templated text)."""
        return self.hf.decode(list(ids), skip_special_tokens=False)

    def decode_batch(self, sequences: list[list[int]]) -> list[str]:
        """`decode` of each sequence, in one call to the Rust tokenizer where it can (one crossing
        into Rust for a whole step's requests instead of one each)."""
        if self._decode_ids is not None:
            return self.hf.backend_tokenizer.decode_batch(
                sequences, skip_special_tokens=self.skip_special_tokens
            )
        return [self._decode(ids) for ids in sequences]

    def token_text(self, token_id: int) -> str:
        """One token as text, for logprobs (a lone piece of a multi-byte character shows as U+FFFD;
        special tokens show). Remembered: a request with many top logprobs names the same tokens at
        every step, and decoding each afresh cost 10 us a candidate (a test asking for all 151,936
        of them spent minutes here on an H100 host, 2026-11-27)."""
        text = self._candidate_texts.get(token_id)
        if text is None:
            text = self._candidate_texts[token_id] = self.hf.decode([token_id])
        return text


def read_chat_template(value: str) -> str:
    """A chat template given as a file's path or as the template itself (vLLM takes both): a value
    that names a file is read; one with Jinja markup is the template; anything else is an error."""
    path = Path(value)
    if "{" not in value and len(value) < 4096:
        try:
            return path.read_text()
        except OSError as err:
            raise UserError(f"cannot read the chat template {value}: {err.strerror or err}") from None
    return value


# Where transformers' generic fast tokenizer defines `_decode` (5.x, 4.x): the Rust tokenizer's
# decode, then an optional clean-up of spaces.
_FAST_DECODE_MODULES = ("transformers.tokenization_utils_tokenizers", "transformers.tokenization_utils_fast")


def _direct_decode(hf: object) -> Callable[..., str] | None:
    """The Rust tokenizer's `decode`, when HF's `decode` does nothing more than call it: a fast
    tokenizer whose class keeps the generic `_decode` and whose clean-up of spaces is off. HF's
    wrapper (argument conversion, keyword handling) costs several times the decode itself on the
    few ids the detokenizer passes. None: go through HF's `decode`."""
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None or getattr(hf, "clean_up_tokenization_spaces", True):
        return None
    owners = {
        name: next((c for c in type(hf).__mro__ if name in vars(c)), None) for name in ("decode", "_decode")
    }
    if owners["_decode"] is None or owners["_decode"].__module__ not in _FAST_DECODE_MODULES:
        return None
    if owners["decode"] is None or owners["decode"].__module__ != "transformers.tokenization_utils_base":
        return None
    return backend.decode
