"""Text streamed in pieces, for the readers that split a streamed answer into parts (reasoning,
content, tool calls; each part must add up to the unstreamed response's): `Trimmed` sends what a
whole text's `.strip()` would keep as it becomes sure (leading whitespace dropped, whitespace held
until text follows it); `held_back` says how much of a piece's end may still become a tag."""

from __future__ import annotations


class Trimmed:
    def __init__(self) -> None:
        self.started = False  # text has been sent: leading whitespace is behind us
        self.held = ""  # whitespace after the last text sent

    def add(self, text: str) -> str:
        """The part of `text` (with what was held) that is now sure to be kept."""
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        text = self.held + text
        body = text.rstrip()
        self.held = text[len(body) :]
        return body


def held_back(text: str, tag: str) -> int:
    """The length of the longest end of `text` that could begin `tag` (undecided: held back)."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-length:]):
            return length
    return 0
