"""The request bodies the server accepts, and how they become prompts and SamplingParams.

The models are strict, as OpenAI's API is: a number is not a string, a boolean is not a number
(`"stream": "yes"`, `"max_tokens": true`, `"n": "2"` are 400s), every integer has a range the
engine can represent (`top_k`, `seed`, `max_tokens` ... a value past it is a 400 naming the range,
never an overflow inside the engine), and no number is NaN or infinite.

Every field is declared; an undeclared one is rejected (extra="forbid") with a 400 naming it,
so a client never believes a feature works when it is ignored. Fields whose defaults OpenAI
clients send, or that change nothing at their neutral value, are accepted at that value only
(logit_bias={}, echo=false). response_format json_object and json_schema constrain the answer
through a grammar (engine/structured.py: xgrammar, when installed). The penalties have OpenAI's ranges (presence and
frequency in [-2, 2]) and vLLM's for repetition_penalty (> 0, an extension).
A JSON null means "not given", as in OpenAI's API. The same models produce /openapi.json
(openapi.py), so the published schema is the one requests are checked against (the chat
messages and tools: chat_messages.py).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ..core.errors import UserError
from ..core.sampling_params import StructuredOutputsParams
from ..engine import structured
from ..frontend.tokenizer import check_template_kwargs
from . import tools
from .chat_messages import MAX_MESSAGES, MAX_TOOLS, ChatMessage, NamedToolChoice, Tool
from .errors import bad_request
from .strict_model import StrictModel, needs, only

MAX_N = 16  # choices per request
MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256  # a stop string is matched against the text at every token
MAX_STOP_TOKEN_IDS = 64
MAX_TEMPLATE_KWARGS = 32  # chat_template_kwargs' variables
INT32_MAX = 2**31 - 1  # top_k, max_tokens and token ids live in int32 device tensors
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # OpenAI's range for seed (a torch.Generator takes it)
FLOAT32_MAX = 3.4028234663852886e38  # the penalties live in float32 device tensors

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
PromptText = Annotated[str, Field(min_length=1)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class StreamOptions(StrictModel):
    include_usage: bool = False
    include_timing: bool = Field(
        False,
        description="extension: each chunk with tokens carries `timing`, the monotonic clock's seconds "
        "when its tokens reached the engine's host, left the detokenizer and left the server, and in a "
        "request's first such chunk when the server sent the request to the engine",
    )


class JsonSchema(StrictModel):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # `schema` would shadow pydantic's
    strict: bool | None = None


class ResponseFormat(StrictModel):
    model_config = ConfigDict(
        json_schema_extra={  # the rule below, stated in the published schema
            "if": {"properties": {"type": {"const": "json_schema"}}},
            "then": {"required": ["json_schema"], "properties": {"json_schema": {"type": "object"}}},
            "else": {"properties": {"json_schema": {"type": "null"}}},
        }
    )

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = Field(None, description="with type json_schema only")

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema goes with type json_schema, and only with it")
        return self

    def structured(self) -> StructuredOutputsParams | None:
        """The grammar this format asks for (None for text)."""
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.type == "json_schema":
            assert self.json_schema is not None
            return StructuredOutputsParams(json=self.json_schema.schema_ or {})
        return None


STREAM_OPTIONS_NEEDS_STREAM = needs("stream_options", stream=True)


class CommonFields(StrictModel):
    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1, le=INT32_MAX, description="extension: -1 or 0 for no limit")
    min_p: float = Field(0.0, ge=0, le=1, description="extension")
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stop_token_ids: list[TokenId] = Field(
        default_factory=list, max_length=MAX_STOP_TOKEN_IDS, description="extension"
    )
    ignore_eos: bool = Field(False, description="extension")
    skip_special_tokens: bool = Field(
        True,
        description="extension (vLLM's): false writes the special tokens the model generates into the text",
    )
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    user: str | None = None  # an end-user id for the client's own records; changes no output
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(
        1.0, gt=0, le=FLOAT32_MAX, description="extension: > 1 discourages repeats"
    )
    logit_bias: dict[str, float] = Field(default_factory=dict, json_schema_extra={"maxProperties": 0})

    @model_validator(mode="after")
    def _neutral_only(self) -> CommonFields:
        if self.logit_bias:
            raise ValueError("logit_bias is not supported (only {})")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        return self

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def include_timing(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_timing)


class ChatCompletionRequest(CommonFields):
    model_config = ConfigDict(
        json_schema_extra={
            "dependentSchemas": {**STREAM_OPTIONS_NEEDS_STREAM, **needs("top_logprobs", logprobs=True)}
        }
    )

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(None, ge=1, le=INT32_MAX)
    max_completion_tokens: int | None = Field(
        None, ge=1, le=INT32_MAX, description="the newer name of max_tokens; wins when both are given"
    )
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS, description="needs logprobs: true")
    response_format: ResponseFormat | None = None
    tools: Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description="auto by default with tools; needs tools (docs/serving/api.md, tool calling)"
    )
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = Field(
        None,
        json_schema_extra={"maxProperties": MAX_TEMPLATE_KWARGS},
        description="extension (vLLM's, SGLang's): more variables for the chat template, e.g. "
        '{"enable_thinking": false} for Qwen3',
    )

    @model_validator(mode="after")
    def _logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @field_validator("chat_template_kwargs")
    @classmethod
    def _not_ours(cls, kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
        try:
            check_template_kwargs(kwargs)  # here too, so the 400 names this field
        except UserError as err:
            raise ValueError(str(err)) from None
        return kwargs

    def check_tools(self) -> None:
        """What the schema cannot say about tools: a 400 naming the field."""
        names = [t.function.name for t in self.tools or []]
        if len(set(names)) != len(names):
            raise bad_request("the tools' function names must be unique", param="tools")
        if self.tool_choice is not None and not self.tools:
            raise bad_request("tool_choice needs tools", param="tool_choice")
        if isinstance(self.tool_choice, NamedToolChoice) and self.tool_choice.function.name not in names:
            raise bad_request(
                f"tool_choice names {self.tool_choice.function.name!r}, which is not among the tools",
                param="tool_choice",
            )
        if self.forced_tool_choice() is not None and self.response_format is not None:
            if self.response_format.type != "text":
                raise bad_request(
                    "response_format and a tool_choice that forces a call both constrain the answer: "
                    "give one", param="tool_choice",
                )  # fmt: skip

    def effective_tool_choice(self) -> str | dict[str, Any]:
        """OpenAI's default: auto with tools, none without."""
        if self.tool_choice is None:
            return "auto" if self.tools else "none"
        return self.tool_choice if isinstance(self.tool_choice, str) else self.tool_choice.model_dump()

    def forced_tool_choice(self) -> str | dict[str, Any] | None:
        """`required` or a named function: the answer is a call by grammar (tools.py)."""
        choice = self.effective_tool_choice()
        return None if choice in ("none", "auto") else choice

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools the chat template shows the model (none with tool_choice none)."""
        if not self.tools or self.effective_tool_choice() == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]

    def tool_names(self) -> set[str]:
        return {t.function.name for t in self.tools or []}

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def num_sequences(self) -> int:
        return self.n


class CompletionRequest(CommonFields):
    model_config = ConfigDict(json_schema_extra={"dependentSchemas": STREAM_OPTIONS_NEEDS_STREAM})

    prompt: (
        PromptText
        | Annotated[list[PromptText], Field(min_length=1)]
        | Annotated[list[TokenId], Field(min_length=1)]
        | Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1)]
    ) = Field(description="a string, a list of strings, a list of token ids, or a list of those")
    max_tokens: int = Field(16, ge=1, le=INT32_MAX)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = only(False)
    suffix: str | None = Field(None, json_schema_extra={"maxLength": 0})
    best_of: int | None = Field(None, ge=1, le=MAX_N, description="only equal to n")

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported (only false)")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (only equal to n)")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]

    def num_sequences(self) -> int:
        """Prompts × n: what the request asks the engine to run (counted before tokenizing)."""
        p = self.prompt
        prompts = 1 if isinstance(p, str) or all(isinstance(x, int) for x in p) else len(p)
        return prompts * self.n


def structured_outputs(req: CommonFields) -> StructuredOutputsParams | None:
    """A chat request's response_format, or the call its tool_choice forces, as a grammar; a 400
    now when the grammar engine is missing, rather than after the request is queued."""
    spec, param = None, "response_format"
    if isinstance(req, ChatCompletionRequest) and (forced := req.forced_tool_choice()) is not None:
        assert req.tools is not None  # check_tools
        tool_dicts = [t.model_dump() for t in req.tools]
        schema = tools.forced_schema(tool_dicts, forced, req.parallel_tool_calls)
        spec = StructuredOutputsParams(json=schema, disable_any_whitespace=True)
        param = "tool_choice"
    elif (response_format := getattr(req, "response_format", None)) is not None:
        spec = response_format.structured()
    if spec is not None and not structured.available():
        raise bad_request(structured.MISSING, param=param)
    return spec
