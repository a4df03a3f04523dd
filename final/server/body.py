"""Reading a request body safely: JSON only, bounded in size, valid Unicode, any nesting.

Everything here answers a 4xx in OpenAI's shape and leaves the connection usable:

- a Content-Type other than application/json is a 415 (a browser's cross-origin "simple" POST is
  text/plain or a form, so this also keeps other web pages from driving the API);
- a body over --max-request-bytes is a 413, decided from Content-Length before reading, or as
  soon as a chunked body passes the limit;
- bytes that are not UTF-8, NaN and Infinity (Python's json accepts them, JSON does not), nesting
  deeper than the parser's recursion limit, and lone UTF-16 surrogates (`"\\ud800"`: valid JSON
  escapes, but not text a tokenizer can encode) are 400s.

request_body.py decodes large bodies in a worker thread, after which it counts and validates them.

A body must arrive within --read-timeout of its headers (timeouts.py bounds the headers): a 408
`request_timeout` otherwise, and the connection is closed. A client that goes away before its body
is complete is normal, not an error of the server: one INFO line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

from fastapi import Request
from starlette.requests import ClientDisconnect

from .errors import bad_request, request_timeout, too_large, unsupported_media_type
from .generation import ClientGone

log = logging.getLogger(__name__)

THREAD_ABOVE_BYTES = 64 * 1024  # decode bodies larger than this off the event loop
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # \ud800 .. \udfff, in either case


def check_content_type(request: Request) -> None:
    content_type = request.headers.get("content-type", "")
    media = content_type.split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise unsupported_media_type(content_type)


async def read_body(request: Request, limit: int, timeout: float | None = None) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(int(declared), limit)

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise too_large(None if declared is None else size, limit)
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        log.info("%s %s: the body did not arrive within %.0f s; closing the connection",
                 request.method, request.url.path, timeout)  # fmt: skip
        raise request_timeout(timeout) from None  # type: ignore[arg-type]
    except ClientDisconnect:
        log.info(
            "%s %s: the client went away before sending its whole body", request.method, request.url.path
        )
        raise ClientGone from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_json(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise bad_request(f"the request body is not valid UTF-8: {err}") from None
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    except (json.JSONDecodeError, ValueError) as err:
        raise bad_request(f"malformed JSON in the request body: {err}") from None
    if SURROGATE_ESCAPE.search(text):  # rare: only then look for an unpaired one
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request(
                "the request body contains a lone UTF-16 surrogate (a \\ud800-\\udfff escape without "
                "its pair), which is not valid Unicode text"
            ) from None
    return value
