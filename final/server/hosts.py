"""DNS rebinding: only requests whose Host header names this server are served.

CORS keeps a web page from reading another origin's answers, but DNS rebinding makes the server
the page's own origin: a page at http://rebind.attacker.example:1919 has its name re-resolved to
127.0.0.1, and the browser, believing it still talks to the page's own site, sends its requests
(and hands over the answers) to the server on the visitor's machine, with
`Host: rebind.attacker.example:1919`. Checking the Host header stops that. Accepted, port aside:

- an IP address (127.0.0.1, [::1], 10.0.0.5, a cloud machine's public address, which is on none of
  its interfaces): a page has an IP address as its origin only when it was served from that
  address, so no rebinding can produce one;
- `localhost` and its subdomains, which resolve to loopback only (RFC 6761);
- the name the server is bound to (`--host NAME`), and, when it is bound beyond loopback, this
  machine's host names (`hostname`, `hostname -f`): what other machines on the network type;
- the names in `--allowed-hosts` (a DNS alias, the name a reverse proxy passes on); `*` accepts any.

Anything else gets a 400 `host_not_allowed` naming the flag. A request without a Host header
(HTTP/1.0) is served: browsers always send one.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import APIError

ANY_HOST = "*"


def accepted_host_names(bind: str, allowed: Collection[str], beyond_loopback: bool) -> frozenset[str] | None:
    """The host names (lowercase, no port) the Host header may carry besides IP addresses and
    localhost; None when any is accepted."""
    if ANY_HOST in allowed:
        return None
    names = {name.strip().lower().rstrip(".") for name in allowed if name.strip()}
    if not is_ip_address(bind):
        names.add(bind.lower())
    if beyond_loopback:
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return frozenset(names)


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


def host_name(header: str) -> str:
    """`example.org:1919` -> `example.org`, `[::1]:1919` -> `[::1]`, lowercase, no trailing dot."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 literal: the port follows the bracket
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0].rstrip(".") if header.count(":") == 1 else header.rstrip(".")


def host_allowed(header: str, names: frozenset[str] | None) -> bool:
    if names is None:
        return True
    host = host_name(header)
    if is_ip_address(host) or host == "localhost" or host.endswith(".localhost"):
        return True
    return host in names


class HostCheckMiddleware:
    """A 400 in OpenAI's shape for a request whose Host header names another server."""

    def __init__(self, app: ASGIApp, names: frozenset[str] | None):
        self.app, self.names = app, names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            header = next((v for k, v in scope["headers"] if k == b"host"), None)
            if header is not None and not host_allowed(header.decode("latin-1"), self.names):
                shown = header.decode("latin-1")[:100]
                await APIError(
                    400,
                    f"this server does not answer to the host name {shown!r}: add it with --allowed-hosts "
                    "(this check keeps web pages from reaching the server through DNS rebinding)",
                    code="host_not_allowed",
                ).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)
