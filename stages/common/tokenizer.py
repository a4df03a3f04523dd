"""Tokenizer, chat template, and turning a stream of token ids back into text.

Text is produced incrementally, so a caller can print or send it as tokens arrive. Two things make
that harder than `decode(new_token)`: one character may span several tokens (multi-byte UTF-8,
emoji), and a stop string may span several tokens too. `TextStream` handles both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .errors import UserError

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

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text))

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        if not self.has_chat_template:
            raise UserError("this model has no chat template; send the prompt as plain text (--raw)")
        text = self.hf.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
        # The template already wrote any BOS token; letting encode() add another would double it.
        return list(self.hf.encode(text, add_special_tokens=False))

    def encode_prompt(self, prompt: str, chat: bool | None = None, system: str | None = None) -> list[int]:
        """The prompt's token ids. chat=None: in the chat template when the model has one (an
        instruct model given bare text often answers nothing); True: in it, or an error; False:
        the text as it is."""
        if not prompt:
            raise UserError("the prompt is empty")
        wanted = chat
        if chat is None:
            chat = self.has_chat_template
        if not chat:
            if system:
                why = "drop --raw" if wanted is False else "this model has none"
                raise UserError(f"a system message needs the chat template ({why})")
            return self.encode(prompt)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": prompt}
        ]
        return self.encode_chat(messages)

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)


class IncrementalDetokenizer:
    """Decode a growing list of token ids into text, emitting only complete characters.

    We decode a short window (`prefix`..end) rather than one token, because tokenizers such as
    SentencePiece decide leading spaces from the neighbouring tokens; and we hold back text that
    ends in U+FFFD, the replacement character a partial UTF-8 sequence decodes to.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = ()):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(prompt_ids[-4:])  # a little context for the first token
        self.prefix = 0
        self.read = len(self.ids)

    # --8<-- [start:detokenize]
    def push(self, token_ids: Sequence[int]) -> str:
        self.ids.extend(token_ids)
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing printable yet: wait for the rest of the character
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    # --8<-- [end:detokenize]


class StopStringMatcher:
    """Cut generated text at the first stop string, even when it arrives split over tokens.

    Text that could still be the beginning of a stop string is held back until it is decided,
    so a streaming client never sees part of a stop string that is later removed.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    # --8<-- [start:stop]
    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was hit)."""
        buf = self.pending + text
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.pending = ""
            return buf[: min(hits)], True
        hold = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(buf)), hold, -1):
                if buf.endswith(stop[:k]):
                    hold = k
                    break
        self.pending = buf[len(buf) - hold :]
        return buf[: len(buf) - hold], False

    # --8<-- [end:stop]

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text


class TextStream:
    """Token ids in, (new text, stop string hit) out: what a streaming response sends."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), stop: Sequence[str] = ()):
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.matcher = StopStringMatcher(stop)
        self.text = ""

    def push(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        new, hit = self.matcher.feed(self.detok.push(token_ids))
        self.text += new
        return new, hit

    def finish(self) -> str:
        new = self.matcher.flush()
        self.text += new
        return new
