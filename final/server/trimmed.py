"""Text streamed in pieces with its ends trimmed: what a whole text's `.strip()` would keep, sent
as it becomes sure. Leading whitespace is dropped; whitespace is held until text follows it (and
dropped if none does). Used where a streamed answer is split into parts (reasoning, content,
tool calls) and each part must add up to the unstreamed response's."""

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
