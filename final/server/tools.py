"""Tool calling: the request's tools into the chat template, the model's calls out of its answer.

A model trained for tools (Qwen2.5 and Qwen3, Hermes, and others whose templates follow them) is
shown the tools by its chat template and answers a call as a JSON object between tags:

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

`tool_choice` says what the server does with that:

- `auto` (the default with tools): the answer is read for such blocks; each one whose JSON names a
  tool of the request becomes a `tool_calls` entry, and the text around them is the `content`
  (stripped; null when nothing is left). A block that does not parse stays text: the client sees
  what the model wrote rather than losing it.
- `none`: the tools are left out of the prompt and nothing is read for calls.
- `required`, or one named function: the answer is constrained by a grammar (engine/structured.py)
  to JSON that is a call: for a named function, its arguments (the function's `parameters`
  schema); for `required`, a list of one or more `{"name", "arguments"}` objects, each naming a
  tool and following its schema (one at most with `parallel_tool_calls: false`), written without
  blanks between its tokens (a model not trained for the format could otherwise wander in
  whitespace until max_tokens). The model need not be trained for tools then, and even random
  weights answer with a well-formed call; its arguments go out re-serialized.

The finish reason is `tool_calls` when the answer carried calls and ended on its own (a cut at
max_tokens stays `length`). Streamed, the text goes out as it comes except what might be the
start of a tag, and each call goes out whole, in one delta, when its closing tag arrives
(`CallStream`): the concatenated deltas equal the unstreamed response (a test checks it at every
split). This module knows nothing of HTTP or pydantic: openai_api.py and protocol.py use it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from .trimmed import Trimmed, held_back

START, END = "<tool_call>", "</tool_call>"
BLOCK = re.compile(re.escape(START) + r"(.*?)" + re.escape(END), re.DOTALL)
ANY_OBJECT: dict[str, Any] = {"type": "object"}  # a function declared without parameters


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = ""

    def as_openai(self, index: int | None = None) -> dict[str, Any]:
        call = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }
        return call if index is None else {"index": index, **call}


def new_call(name: str, arguments: Any) -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return ToolCall(name, text, f"call_{uuid.uuid4().hex[:24]}")


def read_block(body: str, names: set[str]) -> ToolCall | None:
    """The call a block's body holds, or None when it is not one (see call_from)."""
    try:
        data = json.loads(body, strict=False)  # control characters in strings: the model's text
    except ValueError:
        return None
    return call_from(data, names)


def call_from(data: Any, names: set[str]) -> ToolCall | None:
    """The call a decoded JSON value is, or None: an object naming a tool of `names`, with
    `arguments` (or `parameters`, as some templates write it) an object or JSON text."""
    if not isinstance(data, dict) or data.get("name") not in names:
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if not isinstance(arguments, dict | str):
        return None
    return new_call(data["name"], arguments)


def parse(text: str, names: set[str], parallel: bool = True) -> tuple[str | None, list[ToolCall]]:
    """(content, calls) of a whole answer under `tool_choice: auto`."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    at = 0
    for match in BLOCK.finditer(text):
        call = read_block(match.group(1), names)
        if call is None:
            continue  # not a call: its text stays where it is
        kept.append(text[at : match.start()])
        at = match.end()
        if parallel or not calls:
            calls.append(call)
    kept.append(text[at:])
    content = "".join(kept).strip()
    return (content or None) if calls else content, calls


class CallStream:
    """`parse` for a streamed answer: feed each new piece of text, get the content that is now
    sure to be content and the calls completed. The content deltas add up to `parse`'s content
    (leading and trailing whitespace dropped, and whitespace held until text follows it) and the
    calls are `parse`'s calls."""

    def __init__(self, names: set[str], parallel: bool = True):
        self.names, self.parallel = names, parallel
        self.pending = ""  # text not yet decided
        self.inside = False  # after a START whose END has not come
        self.content = Trimmed()  # the content's ends trimmed, as parse's strip() does
        self.calls = 0

    def feed(self, text: str) -> tuple[str, list[ToolCall]]:
        self.pending += text
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self.inside:
                end = self.pending.find(END)
                if end < 0:
                    break
                body, self.pending = self.pending[:end], self.pending[end + len(END) :]
                self.inside = False
                call = read_block(body, self.names)
                if call is None:
                    content.append(self._content(START + body + END))
                elif self.parallel or not self.calls:
                    calls.append(call)
                    self.calls += 1
                continue
            start = self.pending.find(START)
            if start < 0:
                keep = held_back(self.pending, START)
                sure, self.pending = (
                    self.pending[: len(self.pending) - keep],
                    self.pending[len(self.pending) - keep :],
                )
                content.append(self._content(sure))
                break
            content.append(self._content(self.pending[:start]))
            self.pending, self.inside = self.pending[start + len(START) :], True
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        """What is left at the answer's end: content (an unclosed block is text after all), and no
        call (each went out when its block closed)."""
        rest = (START if self.inside else "") + self.pending
        self.pending, self.inside = "", False
        return self._content(rest), []

    def _content(self, text: str) -> str:
        return self.content.add(text)


def forced_schema(
    tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool
) -> dict[str, Any]:
    """The JSON Schema an answer must follow when `choice` forces a call: `required`, or a named
    function ({"type": "function", "function": {"name": ...}})."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") or ANY_OBJECT for t in tools}
    if isinstance(choice, dict):
        return schemas[choice["function"]["name"]]
    one_of_each = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": schema},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, schema in schemas.items()
    ]
    return {
        "type": "array",
        "minItems": 1,
        **({} if parallel else {"maxItems": 1}),
        "items": {"anyOf": one_of_each},
    }


def forced_calls(text: str, choice: str | dict[str, Any]) -> list[ToolCall]:
    """The calls of an answer written under `forced_schema` (empty when it was cut short and is
    not whole JSON)."""
    try:
        # strict=False: a string may hold control characters as the model wrote them (JSON wants
        # them escaped); the arguments go out re-serialized, escaped, so a client's parser takes them.
        data = json.loads(text, strict=False)
    except ValueError:
        return []
    if isinstance(choice, dict):
        return [new_call(choice["function"]["name"], data)]
    return [new_call(item["name"], item["arguments"]) for item in data]


def template_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An assistant message's earlier calls as chat templates take them: `arguments` as a mapping
    where its JSON text is an object (Qwen's and Hermes' templates print it as JSON either way)."""
    out = []
    for call in calls:
        function = dict(call["function"])
        try:
            parsed = json.loads(function["arguments"])
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            function["arguments"] = parsed
        out.append({"id": call["id"], "type": "function", "function": function})
    return out
