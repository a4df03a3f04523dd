"""A chat request's messages and the tools it declares, as strict as the rest of the body
(protocol.py): each role with its own fields (content but for an assistant's tool calls, a tool
message's tool_call_id), stated in the published schema as well as checked."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from . import tools
from .strict_model import StrictModel

MAX_MESSAGES = 2048  # chat messages, and their content parts in all (counted before validation)
MAX_TOOLS = 128  # tools a request declares, and calls an assistant message carries (OpenAI: 128)


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class CalledFunction(StrictModel):
    name: str = Field(min_length=1, max_length=64)
    arguments: str = Field(description="JSON text, as the server sent it")


class MessageToolCall(StrictModel):
    id: str = Field(max_length=256)
    type: Literal["function"]
    function: CalledFunction


NOT_NULL = {"not": {"type": "null"}}


class ChatMessage(StrictModel):
    model_config = ConfigDict(
        json_schema_extra={  # the rules of _by_role, stated in the published schema
            "allOf": [
                {
                    "if": {"properties": {"role": {"const": "assistant"}}},
                    "then": {"properties": {"tool_call_id": {"type": "null"}}},
                    "else": {
                        "required": ["content"],
                        "properties": {"content": NOT_NULL, "tool_calls": {"type": "null"}},
                    },
                },
                {
                    "if": {"properties": {"role": {"const": "tool"}}},
                    "then": {"required": ["tool_call_id"], "properties": {"tool_call_id": NOT_NULL}},
                    "else": {"properties": {"tool_call_id": {"type": "null"}}},
                },
            ]
        }
    )

    role: Literal["system", "developer", "user", "assistant", "tool"]
    # A string, or content parts of which only text is supported; null only beside an assistant's
    # tool calls (OpenAI's clients send an earlier answer back that way).
    content: str | Annotated[list[TextPart], Field(min_length=1, max_length=MAX_MESSAGES)] | None = Field(
        None, description="required but for an assistant message", validate_default=True
    )
    tool_calls: Annotated[list[MessageToolCall], Field(max_length=MAX_TOOLS)] | None = Field(
        None, description="an assistant message's calls"
    )
    tool_call_id: str | None = Field(
        None, max_length=256, description="a tool message's: the call it answers", validate_default=True
    )

    # The rules by role, each on its field (so a 400 names `messages[0].content`); `role` comes
    # first, so it is known when they run.
    @field_validator("content")
    @classmethod
    def _content_by_role(cls, content: Any, info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if content is None and role not in (None, "assistant"):
            raise ValueError(f"a {role} message needs content")
        return content

    @field_validator("tool_calls")
    @classmethod
    def _calls_by_role(cls, calls: Any, info: ValidationInfo) -> Any:
        if calls is not None and info.data.get("role") not in (None, "assistant"):
            raise ValueError("tool_calls belong to assistant messages")
        return calls

    @field_validator("tool_call_id")
    @classmethod
    def _call_id_by_role(cls, call_id: Any, info: ValidationInfo) -> Any:
        role = info.data.get("role")
        if role == "tool" and call_id is None:
            raise ValueError("a tool message needs tool_call_id, the call it answers")
        if role not in (None, "tool") and call_id is not None:
            raise ValueError("only a tool message has a tool_call_id")
        return call_id

    def text(self) -> str:
        if self.content is None:
            return ""
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)

    def template_role(self) -> str:
        return "system" if self.role == "developer" else self.role  # OpenAI's newer name for system

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates take it (HF's format)."""
        message: dict[str, Any] = {"role": self.template_role(), "content": self.text()}
        if self.tool_calls:
            message["tool_calls"] = tools.template_tool_calls([c.model_dump() for c in self.tool_calls])
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionDefinition(StrictModel):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = Field(None, description="a JSON Schema of the arguments")
    strict: bool | None = Field(
        None, description="accepted; a forced call (tool_choice) always follows the schema"
    )


class Tool(StrictModel):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(StrictModel):
    name: str


class NamedToolChoice(StrictModel):
    type: Literal["function"]
    function: FunctionName
