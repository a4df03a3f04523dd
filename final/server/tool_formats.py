"""How a model writes its tool calls: one reader per format, chosen by `--tool-call-parser`.

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks anywhere in the
                 answer, text around them (Qwen2.5 and Qwen3, Hermes; tools.py)
    llama3_json  the whole answer is the calls: {"name": ..., "parameters": {...}}, after an
                 optional <|python_tag|>, several separated by ";" (Llama 3.1 to 3.3's JSON
                 tool format); an answer that is not wholly calls to declared tools is text

Each format reads a whole answer (`parse`: content and calls) and a streamed one (`stream`: an
object whose `feed` and `finish` give the same content and calls piece by piece). A new format is
a class here and a line in FORMATS (and its names in frontend/options.py's TOOL_CALL_PARSERS).
"""

from __future__ import annotations

import json
from typing import Protocol

from . import tools
from .tools import ToolCall
from .trimmed import Trimmed

PYTHON_TAG = "<|python_tag|>"  # what Llama 3.1 writes before a call


class CallReader(Protocol):
    def feed(self, text: str) -> tuple[str, list[ToolCall]]: ...
    def finish(self) -> tuple[str, list[ToolCall]]: ...


class ToolFormat(Protocol):
    def parse(
        self, text: str, names: set[str], parallel: bool = True
    ) -> tuple[str | None, list[ToolCall]]: ...
    def stream(self, names: set[str], parallel: bool = True) -> CallReader: ...


class Hermes:
    parse = staticmethod(tools.parse)
    stream = staticmethod(tools.CallStream)


class Llama3Json:
    @staticmethod
    def parse(text: str, names: set[str], parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
        """(content, calls): every call, or all of it as text (stripped) when any part is not one."""
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG) :].lstrip()
        decoder, calls, at = json.JSONDecoder(strict=False), [], 0
        while body.startswith("{", at):
            try:
                data, at = decoder.raw_decode(body, at)
            except ValueError:
                return text.strip(), []
            call = tools.call_from(data, names)
            if call is None:
                return text.strip(), []
            calls.append(call)
            at = len(body) - len(body[at:].lstrip().removeprefix(";").lstrip())
        if not calls or at != len(body):
            return text.strip(), []
        return None, calls if parallel else calls[:1]

    @staticmethod
    def stream(names: set[str], parallel: bool = True) -> CallReader:
        return Llama3Stream(names, parallel)


class Llama3Stream:
    """Llama3Json.parse for a streamed answer. An answer that begins like a call (a `{` or the
    python tag) is held whole and read at its end; any other goes out as text as it comes."""

    def __init__(self, names: set[str], parallel: bool = True):
        self.names, self.parallel = names, parallel
        self.pending = ""
        self.mode: str | None = None  # None: undecided; "text"; "held"
        self.content = Trimmed()

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.mode == "text":
            return self.content.add(text), []
        self.pending += text
        head = self.pending.lstrip()
        if self.mode == "held" or not head or PYTHON_TAG.startswith(head):
            return "", []  # a call's text, or not yet known
        if head.startswith(("{", PYTHON_TAG)):
            self.mode = "held"
            return "", []
        self.mode, text, self.pending = "text", self.pending, ""
        return self.content.add(text), []

    def finish(self) -> tuple[str, list[ToolCall]]:
        text, self.pending = self.pending, ""
        if self.mode == "text":
            return self.content.add(text), []
        content, calls = Llama3Json.parse(text, self.names, self.parallel)
        return ("" if calls else self.content.add(content or "")), calls


FORMATS: dict[str, ToolFormat] = {"hermes": Hermes(), "llama3_json": Llama3Json()}
