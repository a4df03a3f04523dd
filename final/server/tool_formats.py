"""How a model writes its tool calls: one reader per format, chosen by `--tool-call-parser`.

    hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks anywhere in the
                 answer, text around them (Qwen2.5 and Qwen3, Hermes; tools.py)
    llama3_json  the whole answer is the calls: {"name": ..., "parameters": {...}}, after an
                 optional <|python_tag|>, several separated by ";" (Llama 3.1 to 3.3's JSON
                 tool format); an answer that is not wholly calls to declared tools is text
    pythonic     the whole answer is a Python list of calls with keyword arguments:
                 [get_weather(city="Paris"), add(a=1)] (Llama 3.2 and Llama 4; vLLM's and
                 SGLang's `pythonic`); read by Python's own parser, the values literals only

Each format reads a whole answer (`parse`: content and calls) and a streamed one (`stream`: an
object whose `feed` and `finish` give the same content and calls piece by piece). A new format is
a class here and a line in FORMATS (and its names in frontend/options.py's TOOL_CALL_PARSERS).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable
from typing import Protocol

from . import tools
from .tools import ToolCall
from .trimmed import Trimmed

PYTHON_TAG = "<|python_tag|>"  # what Llama 3.1 writes before a call
PYTHON_START, PYTHON_END = "<|python_start|>", "<|python_end|>"  # Llama 4's, around a pythonic list


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
        return WholeAnswerStream(names, parallel, Llama3Json.parse, ("{", PYTHON_TAG))


class Pythonic:
    @staticmethod
    def parse(text: str, names: set[str], parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
        """(content, calls): every call of the list, or all of it as text (stripped) when any part
        is not a call to a declared tool with literal keyword arguments. `ast.literal_eval` reads
        the values: strings, numbers, booleans, None, lists and dicts, and nothing it would run."""
        body = text.strip().removeprefix(PYTHON_START).removesuffix(PYTHON_END).strip()
        calls = []
        try:
            tree = ast.parse(body, mode="eval").body if body.startswith("[") else None
            for node in tree.elts if isinstance(tree, ast.List) else ():
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args):
                    return text.strip(), []
                if any(k.arg is None for k in node.keywords):  # **kwargs
                    return text.strip(), []
                arguments = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                call = tools.call_from({"name": node.func.id, "arguments": arguments}, names)
                if call is None:
                    return text.strip(), []
                calls.append(call)
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            return text.strip(), []  # TypeError: a value JSON cannot hold (a set), from call_from
        if not calls:
            return text.strip(), []
        return None, calls if parallel else calls[:1]

    @staticmethod
    def stream(names: set[str], parallel: bool = True) -> CallReader:
        return WholeAnswerStream(names, parallel, Pythonic.parse, ("[", PYTHON_START))


Parse = Callable[[str, set[str], bool], tuple[str | None, list[ToolCall]]]


class WholeAnswerStream:
    """A whole-answer format's `parse` for a streamed answer. An answer that begins like a call (one
    of `openers`, after white space) is held whole and read at its end; any other goes out as
    text as it comes."""

    def __init__(self, names: set[str], parallel: bool, parse: Parse, openers: tuple[str, ...]):
        self.names, self.parallel, self.parse, self.openers = names, parallel, parse, openers
        self.pending = ""
        self.mode: str | None = None  # None: undecided; "text"; "held"
        self.content = Trimmed()

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        if self.mode == "text":
            return self.content.add(text), []
        self.pending += text
        head = self.pending.lstrip()
        if self.mode == "held" or not head or any(o.startswith(head) for o in self.openers):
            return "", []  # a call's text, or not yet known
        if head.startswith(self.openers):
            self.mode = "held"
            return "", []
        self.mode, text, self.pending = "text", self.pending, ""
        return self.content.add(text), []

    def finish(self) -> tuple[str, list[ToolCall]]:
        text, self.pending = self.pending, ""
        if self.mode == "text":
            return self.content.add(text), []
        content, calls = self.parse(text, self.names, self.parallel)
        return ("" if calls else self.content.add(content or "")), calls


FORMATS: dict[str, ToolFormat] = {"hermes": Hermes(), "llama3_json": Llama3Json(), "pythonic": Pythonic()}
