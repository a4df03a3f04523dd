"""Reasoning apart from the answer (`--reasoning-parser`, vLLM's and SGLang's flag): a thinking
model writes its reasoning between `<think>` and `</think>`, then the answer. The chat response
then carries the reasoning in `reasoning_content` (the field vLLM and SGLang use) and the answer
alone in `content`, streamed as `delta.reasoning_content` then `delta.content`.

Two styles, as the model families write them:

- `qwen3`: the model opens the block itself (`<think>...</think>answer`). An answer that does not
  start with `<think>` has no reasoning (Qwen3 with `enable_thinking: false`, whose template
  writes an empty block into the prompt); one cut before `</think>` is reasoning only.
- `deepseek_r1`: the chat template opens the block in the prompt, so the answer starts inside it
  (`...</think>answer`; a leading `<think>` is dropped if the model writes one anyway); an answer
  with no `</think>` is reasoning only.

Both parts are trimmed of blank ends (`<think>\\n...\\n</think>\\n\\n` is how they are written).
A grammar-constrained answer (response_format, a forced tool call) is not split: the grammar
leaves no room for a block. `ReasoningStream` splits a streamed answer, and its pieces add up to
`split`'s parts at every split of the text (a test checks it).
"""

from __future__ import annotations

from .trimmed import Trimmed, held_back

OPEN, CLOSE = "<think>", "</think>"


def split(text: str, style: str) -> tuple[str | None, str]:
    """(reasoning, content) of a whole answer; reasoning None when the answer has none."""
    head = text.lstrip()
    opened = head.startswith(OPEN)
    if style == "qwen3" and not opened:
        return None, text
    if opened:
        head = head[len(OPEN) :]
    reasoning, closed, content = head.partition(CLOSE)
    return reasoning.strip(), content.strip() if closed else ""


class ReasoningStream:
    """`split` for a streamed answer: feed each new piece, get (reasoning, content) now sure."""

    def __init__(self, style: str):
        self.style = style
        self.pending = ""
        self.phase = "start"  # start (may open a block), reasoning, content
        self.plain = False  # qwen3 with no block: content untouched, as split returns it
        self.reasoning, self.content = Trimmed(), Trimmed()

    def feed(self, text: str) -> tuple[str, str]:
        self.pending += text
        if self.phase == "start":
            head = self.pending.lstrip()
            if len(head) < len(OPEN) and OPEN.startswith(head):
                return "", ""  # too little to know whether the answer opens a block
            opened = head.startswith(OPEN)
            if opened:
                self.pending, self.phase = head[len(OPEN) :], "reasoning"
            elif self.style == "qwen3":
                self.phase, self.plain = "content", True
            else:
                self.phase = "reasoning"  # deepseek_r1: the prompt opened it
        if self.phase == "reasoning":
            before, closed, after = self.pending.partition(CLOSE)
            if not closed:
                keep = held_back(self.pending, CLOSE)
                sure, self.pending = (
                    self.pending[: len(self.pending) - keep],
                    self.pending[len(self.pending) - keep :],
                )
                return self.reasoning.add(sure), ""
            self.pending, self.phase = after, "content"
            return self.reasoning.add(before), self._content()
        return "", self._content()

    def finish(self) -> tuple[str, str]:
        """What is left at the answer's end."""
        if self.phase == "start":  # all of it fit in the undecided start: decide on what there is
            reasoning, content = split(self.pending, self.style)
            self.pending = ""
            if reasoning is None:
                return "", content
            return self.reasoning.add(reasoning), self.content.add(content)
        rest, self.pending = self.pending, ""
        if self.phase == "reasoning":
            return self.reasoning.add(rest), ""
        return "", rest if self.plain else self.content.add(rest)

    def _content(self) -> str:
        text, self.pending = self.pending, ""
        return text if self.plain else self.content.add(text)
