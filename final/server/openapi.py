"""/openapi.json from the request models themselves, so clients and fuzzers read the API as it
really validates.

The generation routes read their bodies by hand (body.py: size cap, JSON only, parsing off the
event loop), so FastAPI cannot see their models; we add them here: each POST's request body is
its pydantic model's JSON schema (strict types, ranges, the neutral-only fields as `enum`), with
the top-level optional fields nullable (a JSON null means "not given"), and every error response
is OpenAI's error object.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema

from .protocol import ChatCompletionRequest, CompletionRequest
from .tokenize_api import DetokenizeRequest, TokenizeRequest

REQUEST_MODELS = {
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/completions": CompletionRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
SUCCESS = {
    "/v1/chat/completions": "the completion; with stream: true, Server-Sent Events (text/event-stream)",
    "/v1/completions": "the completion; with stream: true, Server-Sent Events (text/event-stream)",
    "/tokenize": "count, max_model_len, tokens and (with return_token_strs) token_strs",
    "/detokenize": "prompt: the text of the token ids, special tokens written out",
}

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

ERRORS = {
    "400": "invalid request: malformed JSON, a field of the wrong type or out of range, a prompt too long",
    "401": "missing or wrong API key (only with --api-key)",
    "404": "the model named is not served",
    "413": "the body is larger than --max-request-bytes",
    "415": "the body is not application/json",
    "500": "the engine failed",
    "503": "overloaded (Retry-After), shutting down, or the engine has stopped",
}


def request_schemas() -> dict[str, Any]:
    """The request models' schemas, as `components.schemas` entries."""
    models = [(m, "validation") for m in REQUEST_MODELS.values()]
    _, top = models_json_schema(models, ref_template="#/components/schemas/{model}")
    schemas = top["$defs"]
    for model in REQUEST_MODELS.values():
        schema = schemas[model.__name__]
        required = set(schema.get("required", []))
        for name, prop in schema["properties"].items():
            if name not in required:
                schema["properties"][name] = {"anyOf": [prop, {"type": "null"}]}
    return schemas


def build_openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(request_schemas())
    components["Error"] = ERROR_SCHEMA
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, model in REQUEST_MODELS.items():
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
        operation["responses"] = {
            "200": {"description": SUCCESS[path]},
            **{status: {"description": text, **error} for status, text in ERRORS.items()},
        }
    app.openapi_schema = schema
    return schema
