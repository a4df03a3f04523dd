"""The request bodies the server accepts, and how they become prompts and SamplingParams.

Every field is declared; an undeclared one is rejected (extra="forbid") with a 400 naming it,
so a client never believes a feature works when it is ignored. Fields whose defaults OpenAI
clients send, or that change nothing at their neutral value, are accepted at that value only
(presence_penalty=0, frequency_penalty=0, logit_bias={}, echo=false, response_format text).
A JSON null means "not given", as in OpenAI's API.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import bad_request

MAX_N = 16  # choices per request
MAX_TOP_LOGPROBS = 20  # OpenAI's limit


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(StrictModel):
    include_usage: bool = False


class ChatMessage(StrictModel):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]]  # a string, or content parts of which only text is supported

    @model_validator(mode="after")
    def _text_parts_only(self) -> ChatMessage:
        if isinstance(self.content, list):
            for part in self.content:
                if (
                    part.get("type") != "text"
                    or not isinstance(part.get("text"), str)
                    or set(part) - {"type", "text"}
                ):
                    raise ValueError(f"only text content parts are supported, got {part.get('type')!r}")
        return self

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p["text"] for p in self.content)

    def template_role(self) -> str:
        return "system" if self.role == "developer" else self.role  # OpenAI's newer name for system


class ResponseFormat(BaseModel):
    type: str

    @model_validator(mode="after")
    def _text_only(self) -> ResponseFormat:
        if self.type != "text":  # json_object / json_schema need structured output, which we lack
            raise ValueError(f"response_format {self.type!r} is not supported (only 'text')")
        return self


class CommonFields(StrictModel):
    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # extension (vLLM, SGLang): -1 or 0 no limit
    min_p: float = Field(0.0, ge=0, le=1)  # extension
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)  # extension
    ignore_eos: bool = False  # extension
    n: int = Field(1, ge=1, le=MAX_N)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None  # an end-user id for the client's own records; changes no output
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0  # extension
    logit_bias: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _neutral_only(self) -> CommonFields:
        for name, neutral in [
            ("presence_penalty", 0.0),
            ("frequency_penalty", 0.0),
            ("repetition_penalty", 1.0),
        ]:
            if getattr(self, name) != neutral:
                raise ValueError(f"{name} is not supported (only {neutral:g})")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported (only {})")
        return self

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(CommonFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: ResponseFormat | None = None

    @model_validator(mode="after")
    def _logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(CommonFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @model_validator(mode="after")
    def _unsupported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported (only false)")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (only equal to n)")
        if isinstance(self.prompt, list) and not self.prompt:
            raise ValueError("prompt is empty")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if all(isinstance(x, int) for x in p):
            return [list(p)]  # type: ignore[arg-type]
        return list(p)  # type: ignore[arg-type]


def parse(model: type[StrictModel], body: Any) -> Any:
    """Validate a decoded JSON body; a 400 naming the first offending field otherwise."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}
    try:
        return model.model_validate(body)
    except ValidationError as err:
        first = err.errors()[0]
        param = _param_name(first.get("loc", ()))
        if first.get("type") == "extra_forbidden":
            raise bad_request(
                f"unsupported field {param!r}: this server does not implement it", param=param
            ) from None
        message = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
        raise bad_request(f"{param}: {message}" if param else message, param=param or None) from None


def _param_name(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in (
            "str",
            "list[TextPart]",
            "list[str]",
            "list[int]",
            "list[list[int]]",
            "function-after[_neutral_only()]",
        ):
            continue  # pydantic's union-branch labels, not field names
        else:
            out += f".{part}" if out else str(part)
    return out
