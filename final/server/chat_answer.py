"""A chat answer's text into what the client gets: the message (content, reasoning_content,
tool_calls) and finish reason of a whole answer, or a streamed answer's chunks, per choice.

The text goes through two readers in turn: the reasoning parser, when the server has one
(`--reasoning-parser`, reasoning.py), takes the `<think>` block off the front; the tool-call reader
of the server's format (`--tool-call-parser`, tool_formats.py), when the request has tools, takes
the calls out of what is left. A streamed answer's
deltas add up to the whole answer's message.
"""

from __future__ import annotations

from typing import Any

from ..frontend.mailbox import TokenUpdate
from . import reasoning, tools
from .formatting import chat_logprobs
from .protocol import ChatCompletionRequest
from .tool_formats import FORMATS


def reasoning_style(req: ChatCompletionRequest, parser: str | None) -> str | None:
    """The server's reasoning parser, unless a grammar writes this answer (it leaves no room for
    a `<think>` block)."""
    constrained = req.forced_tool_choice() is not None or (
        req.response_format is not None and req.response_format.type != "text"
    )
    return None if constrained else parser


def answer(
    req: ChatCompletionRequest,
    text: str,
    finish_reason: str | None,
    parser: str | None = None,
    tool_format: str = "hermes",
) -> tuple[dict[str, Any], str | None]:
    """A whole answer as the chat message and finish reason the client gets."""
    message: dict[str, Any] = {"role": "assistant"}
    style = reasoning_style(req, parser)
    if style is not None:
        thought, text = reasoning.split(text, style)
        if thought is not None:
            message["reasoning_content"] = thought
    choice = req.effective_tool_choice()
    if choice == "none":
        return {**message, "content": text}, finish_reason
    if choice == "auto":
        content, calls = FORMATS[tool_format].parse(text, req.tool_names(), req.parallel_tool_calls)
    else:
        content, calls = None, tools.forced_calls(text, choice)
        if not calls:  # cut short before the JSON closed: what there is, as text
            content = text
    message["content"] = content
    if calls:
        message["tool_calls"] = [call.as_openai() for call in calls]
    return message, "tool_calls" if calls and finish_reason == "stop" else finish_reason


class ChatFrames:
    """A streamed chat answer's chunks when it is read for reasoning or tool calls: per choice,
    reasoning as it is sure to be reasoning (reasoning.ReasoningStream), text as it is sure to
    be text, each call in one delta when it is whole (the format's reader); under a forced
    tool_choice, the calls at the end (the answer is their JSON: nothing of it is content)."""

    def __init__(
        self, req: ChatCompletionRequest, frame: Any, parser: str | None = None, tool_format: str = "hermes"
    ):
        self.choice = req.effective_tool_choice()
        style = reasoning_style(req, parser)
        self.active = self.choice != "none" or style is not None
        self.frame = frame
        self.thoughts = [reasoning.ReasoningStream(style) if style else None for _ in range(req.n)]
        reader = FORMATS[tool_format].stream
        self.streams = [reader(req.tool_names(), req.parallel_tool_calls) for _ in range(req.n)]
        self.texts = [""] * req.n  # a forced answer's JSON so far
        self.sent = [0] * req.n  # calls sent per choice

    def chunk(self, index: int, out: TokenUpdate, tokenizer: Any) -> list[dict | str]:
        frames: list[dict | str] = []
        thought, text = "", out.text
        if (thinking := self.thoughts[index]) is not None:
            thought, text = thinking.feed(out.text)
            if out.finish_reason:
                more_thought, more_text = thinking.finish()
                thought, text = thought + more_thought, text + more_text
        content, calls = self._content(index, text, bool(out.finish_reason))
        if thought:
            frames.append(self.frame(index, {"reasoning_content": thought}))
        if content or (tokenizer is not None and out.token_ids):
            lp = (
                chat_logprobs(tokenizer, out.token_ids, out.logprobs or []) if tokenizer is not None else None
            )
            frames.append(self.frame(index, {"content": content}, lp))
        for call in calls:
            frames.append(self.frame(index, {"tool_calls": [call.as_openai(self.sent[index])]}))
            self.sent[index] += 1
        if out.finish_reason:
            called = self.sent[index] and out.finish_reason == "stop"
            frames.append(self.frame(index, {}, finish="tool_calls" if called else out.finish_reason))
        return frames

    def _content(self, index: int, text: str, last: bool) -> tuple[str, list[tools.ToolCall]]:
        if self.choice == "none":
            return text, []
        if self.choice == "auto":
            content, calls = self.streams[index].feed(text)
            if last:
                more, more_calls = self.streams[index].finish()
                content, calls = content + more, calls + more_calls
            return content, calls
        self.texts[index] += text
        if not last:
            return "", []
        calls = tools.forced_calls(self.texts[index], self.choice)
        return ("" if calls else self.texts[index]), calls
