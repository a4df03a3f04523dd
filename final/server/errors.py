"""Errors in OpenAI's format: {"error": {"message", "type", "param", "code"}}, with a status code.

Every failure the server can name becomes an APIError; the app's handlers turn it (and FastAPI's
own 404/405, and anything unexpected, as a 500) into this body, so a client never sees HTML or
FastAPI's 422 shape.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status == 503 else None
        if self.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        if self.status == 408:  # the rest of the body may still come: this connection is done
            headers = {"Connection": "close"}
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def too_large(size: int | None, limit: int) -> APIError:
    got = f"{size} bytes" if size is not None else "more"
    return APIError(
        413,
        f"the request body is too large: {got}, the limit is {limit} bytes (--max-request-bytes)",
        code="request_too_large",
    )


def request_timeout(timeout: float) -> APIError:
    return APIError(
        408,
        f"the request body did not arrive within {timeout:g} s (--read-timeout)",
        code="request_timeout",
    )


def unsupported_media_type(content_type: str) -> APIError:
    return APIError(
        415,
        f"the request body must be JSON (Content-Type: application/json), got {content_type or 'none'!r}",
        code="unsupported_media_type",
    )


def unauthorized() -> APIError:
    return APIError(
        401,
        "missing or wrong API key: send the header 'Authorization: Bearer <key>' (--api-key)",
        code="invalid_api_key",
    )


def never_fits(asked: int, limit: int) -> APIError:
    return APIError(
        400,
        f"this request asks for {asked} sequences (prompts x n) but one request may have at most "
        f"{limit} (--max-running-requests); split it into smaller requests",
        param="n",
        code="too_many_sequences",
    )


def overloaded(in_flight: int, limit: int) -> APIError:
    return APIError(
        503,
        f"the server is overloaded: {in_flight} sequences (prompts x n) in flight, the limit is {limit} "
        f"(--max-running-requests + --max-waiting-requests); retry later",
        type="server_error",
        code="server_overloaded",
    )


def model_not_found(asked: str, served: str) -> APIError:
    return APIError(
        404,
        f"the model {asked!r} does not exist on this server; it serves {served!r}",
        param="model",
        code="model_not_found",
    )


def engine_dead() -> APIError:
    return APIError(
        503,
        "the engine process has stopped; the server is exiting (run it under a supervisor that restarts it)",
        type="server_error",
        code="engine_dead",
    )


def engine_failed() -> APIError:
    return APIError(
        500,
        "the engine failed while running this request; the server log has the details",
        type="server_error",
        code="engine_error",
    )


def internal_error(err: BaseException, where: str) -> APIError:
    """A 500 for a bug: the traceback goes to the log under a reference the client is given."""
    ref = uuid.uuid4().hex[:12]
    log.error("unexpected error %s (ref %s)", where, ref, exc_info=err)
    return APIError(500, f"internal error (ref {ref}); the server log has the details", type="server_error")
