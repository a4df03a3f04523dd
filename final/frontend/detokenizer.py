"""Turning a stream of token ids back into text, as the tokens arrive.

Two things make that harder than `decode(new_token)`: one character may span several tokens
(multi-byte UTF-8, emoji), and a stop string may span several tokens too. `TextStream` handles
both, so a streaming client never sees half a character nor part of a stop string.
"""

from __future__ import annotations

from collections.abc import Sequence

from .tokenizer import Tokenizer


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

    def push(self, token_ids: Sequence[int]) -> str:
        before, after = self.windows(token_ids)
        return self.settle(self.tokenizer.decode(before), self.tokenizer.decode(after))

    def windows(self, token_ids: Sequence[int]) -> tuple[list[int], list[int]]:
        """Take the new tokens; the two id windows whose texts `settle` needs (the text before
        them, and with them). Apart from `push` so that a batch of requests decodes together."""
        self.ids.extend(token_ids)
        return self.ids[self.prefix : self.read], self.ids[self.prefix :]

    def settle(self, before: str, after: str) -> str:
        """The new printable text, given the decoded windows of the last `windows` call."""
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""  # nothing printable yet: wait for the rest of the character
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]

    def flush(self) -> str:
        """At the end: whatever is still held back (bytes that never completed a character)."""
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""


class StopStringMatcher:
    """Cut generated text at the first stop string, even when it arrives split over tokens.

    Text that could still be the beginning of a stop string is held back until it is decided.
    """

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Return (text safe to emit, whether a stop string was hit)."""
        if not self.stops:
            return text, False
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

    def flush(self) -> str:
        text, self.pending = self.pending, ""
        return text


class TextStream:
    """Token ids in, (new text, stop string hit) out: what a streaming response sends."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), stop: Sequence[str] = ()):
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.matcher = StopStringMatcher(stop)
        # The pieces sent so far, joined only when `text` is read: `text += piece` would copy the
        # whole answer at every token.
        self.pieces: list[str] = []

    @property
    def text(self) -> str:
        """Everything sent so far."""
        return "".join(self.pieces)

    def push(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        return self.feed(self.detok.push(token_ids))

    def feed(self, piece: str) -> tuple[str, bool]:
        """Text the detokenizer released (push, or a batch's `settle`) through the stop strings."""
        new, hit = self.matcher.feed(piece)
        self.pieces.append(new)
        return new, hit

    def finish(self) -> str:
        """The generation ended without a stop string: release everything held back."""
        tail, hit = self.matcher.feed(self.detok.flush())
        new = tail if hit else tail + self.matcher.flush()
        self.pieces.append(new)
        return new
