"""Tokenizer and chat template."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path

from ..core.errors import UserError

Message = dict[str, str]


class Tokenizer:
    def __init__(self, folder: Path):
        from transformers import AutoTokenizer

        try:
            self.hf = AutoTokenizer.from_pretrained(str(folder))
        except Exception as err:
            raise UserError(f"cannot load the tokenizer of {folder}: {err}") from err

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for (the longest vocabulary entry), so a text of
        more than `context * max_token_chars` characters cannot fit the context, whatever its
        tokens: the server refuses such a text without tokenizing all of it."""
        return max(1, max((len(piece) for piece in self.hf.get_vocab()), default=1))

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        if not self.has_chat_template:
            raise UserError("this model has no chat template; send a plain prompt (/v1/completions) instead")
        try:
            text = self.hf.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        except Exception as err:  # the template itself rejects the conversation (e.g. an unknown role)
            raise UserError(f"the chat template rejected the messages: {err}") from err
        # The template already wrote any BOS token; letting encode() add another would double it.
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """One token as text, for logprobs (a lone piece of a multi-byte character shows as U+FFFD)."""
        return self.hf.decode([token_id])
