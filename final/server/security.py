"""Who may use the server: an optional API key, CORS (off unless asked), a warning for open binds.

- `--api-key KEY` (or the FINAL_API_KEY environment variable, which `ps` does not show): every
  path except the `--public-paths` (by default /health, /metrics, /openapi.json and /docs) needs
  `Authorization: Bearer KEY`, compared in constant time; anything else is a 401.
- CORS is off by default: a web page on another origin cannot read a response, and its "simple"
  POSTs (text/plain, forms) are refused by the JSON-only rule in body.py. `--allowed-origins`
  names the origins (or `*`) that may call the API from a browser.
- Binding an address other than loopback without a key logs a warning: anyone who reaches the
  port can use the model.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Collection

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import unauthorized

log = logging.getLogger(__name__)

API_KEY_ENV = "FINAL_API_KEY"
OPTIONAL_PUBLIC_PATHS = ("/health", "/metrics", "/openapi.json", "/docs")


class APIKeyMiddleware:
    """Refuse, with a 401 in OpenAI's shape, every request without the key (but the public paths)."""

    def __init__(self, app: ASGIApp, api_key: str, public_paths: Collection[str]):
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.public = set(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.public:
            given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            # compare_digest takes the same time wherever the first difference is.
            if not hmac.compare_digest(given, self.expected):
                await unauthorized().response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install(
    app: FastAPI, api_key: str | None, public_paths: Collection[str], allowed_origins: Collection[str]
) -> None:
    """Add the key check, then CORS outside it (a browser's preflight carries no key)."""
    if api_key:
        public = set(public_paths)
        if "/docs" in public:
            public.add("/docs/oauth2-redirect")
        app.add_middleware(APIKeyMiddleware, api_key=api_key, public_paths=public)
    if allowed_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(allowed_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def warn_if_open(host: str, api_key: str | None) -> None:
    if not api_key and not is_loopback(host):
        log.warning(
            "serving on %s without an API key: anyone who can reach this address can use the model. "
            "Set --api-key or the %s environment variable, or bind 127.0.0.1",
            host,
            API_KEY_ENV,
        )
