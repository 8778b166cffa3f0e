"""Who may use the server: the API key of ``/v1/*`` and the Host-header check against DNS rebinding.

:class:`Guard` is an ASGI middleware in front of the app; it answers refused requests itself, with
OpenAI's JSON error object, before the app reads their body:

- Host check (every path, ``/health`` and the page too): a web page on another site can make its
  visitors' browsers reach a server on their own machine by DNS rebinding (its name, resolved
  again, now points at 127.0.0.1); the browser then sends that name in ``Host``. With
  ``allowed_hosts`` set, a request whose ``Host`` (without its port) is not in it gets **421**.
- API key (``/v1`` and below; ``/health`` and the page stay open): with ``api_key`` set, a request
  without ``Authorization: Bearer <key>`` gets **401**, telling a missing header from a wrong key.
  Keys are compared in constant time (:func:`hmac.compare_digest`).
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from typing import Iterable

from starlette.responses import JSONResponse

from swiftspec.errors import InvalidRequestError
from swiftspec.serve.openai_schema import RequestError

# A Host header: a name or IPv4 address, or an IPv6 address in brackets; then an optional port.
_HOST = re.compile(r"(?P<host>\[[0-9a-f:.]+\]|[a-z0-9._-]+)(?::(?P<port>[0-9]{1,5}))?", re.IGNORECASE)


def check_api_key(key: str) -> str:
    """``key`` when it can be sent in an HTTP header: non-empty, visible ASCII (no spaces).

    Raises:
        InvalidRequestError: naming what is wrong (never quoting the key).
    """
    if not isinstance(key, str) or not key:
        raise InvalidRequestError("the API key must not be empty")
    bad = next((i for i, c in enumerate(key) if not "!" <= c <= "~"), None)
    if bad is not None:
        raise InvalidRequestError(
            f"the API key may hold visible ASCII characters only (no spaces); character "
            f"{bad + 1} of {len(key)} is not one"
        )
    return key


def host_of(header: str) -> str | None:
    """The host of a ``Host`` header value: lowercase, without the port, an IPv6 address without
    its brackets (``"[::1]:8000"`` -> ``"::1"``); None when the value is not a host."""
    m = _HOST.fullmatch(header.strip())
    if m is None or (m["port"] is not None and int(m["port"]) > 65535):
        return None
    host = m["host"].lower()
    if host.startswith("["):
        try:
            return ipaddress.IPv6Address(host[1:-1]).compressed
        except ValueError:
            return None
    return host


def parse_allowed_hosts(hosts: str | Iterable[str] | None) -> frozenset[str] | None:
    """The Host names to answer, from a comma-separated string or a list of names: host names or
    IP addresses without a port (IPv6 with or without brackets). None or ``"*"`` (alone or in the
    list): any Host.

    Raises:
        InvalidRequestError: an empty entry, or one that is not a host (or has a port).
    """
    if hosts is None:
        return None
    entries = [h.strip() for h in (hosts.split(",") if isinstance(hosts, str) else hosts)]
    if "*" in entries:
        return None
    out = set()
    for entry in entries:
        as_header = f"[{entry}]" if ":" in entry and not entry.startswith("[") else entry  # a bare IPv6 address
        m = _HOST.fullmatch(as_header)
        host = host_of(as_header) if m and m["port"] is None else None
        if not host:
            raise InvalidRequestError(
                f"the allowed host {entry!r:.80} is not a host name or IP address without a port "
                "(give names such as localhost,my-host.lan; '*' for any)"
            )
        out.add(host)
    return frozenset(out)


class Guard:
    """ASGI middleware: refuses HTTP requests with a Host not in ``allowed_hosts`` (421) and, under
    ``/v1``, requests without the right ``api_key`` (401); passes every other request to ``app``.

    Args:
        app: the ASGI app guarded.
        api_key: the key clients must send (None: no key is asked for), as :func:`check_api_key` takes it.
        allowed_hosts: as :func:`parse_allowed_hosts` takes them (None: any Host).
    """

    def __init__(self, app, *, api_key: str | None = None, allowed_hosts=None):
        self.app = app
        self.api_key = None if api_key is None else check_api_key(api_key).encode("ascii")
        self.allowed_hosts = parse_allowed_hosts(allowed_hosts)

    async def __call__(self, scope, receive, send) -> None:
        refusal = self.refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        headers = {"WWW-Authenticate": "Bearer"} if refusal.status == 401 else None
        await JSONResponse(refusal.body(), status_code=refusal.status, headers=headers)(scope, receive, send)

    def refusal(self, scope) -> RequestError | None:
        """Why the HTTP request of ``scope`` is refused (a 421 or 401 error), or None."""
        headers = scope["headers"]
        if self.allowed_hosts is not None:
            given = [v.decode("latin-1") for k, v in headers if k == b"host"]
            host = host_of(given[0]) if len(given) == 1 else None
            if host not in self.allowed_hosts:
                what = (
                    f"for the Host {given[0]!r:.100}"
                    if len(given) == 1
                    else f"with {len(given)} Host headers"
                    if given
                    else "without a Host header"
                )
                return RequestError(
                    f"this server does not answer requests {what}; it answers "
                    f"{', '.join(sorted(self.allowed_hosts))} (swiftspec serve --allowed-hosts)",
                    status=421,
                    code="invalid_host",
                )
        path = scope["path"]
        if self.api_key is None or not (path == "/v1" or path.startswith("/v1/")):
            return None
        given = [v for k, v in headers if k == b"authorization"]
        if not given:
            return RequestError(
                "this server needs an API key: send the header 'Authorization: Bearer <key>'",
                status=401,
                code="missing_api_key",
            )
        scheme, _, token = given[0].strip().partition(b" ")
        if len(given) > 1 or scheme.lower() != b"bearer" or not token.strip():
            return RequestError(
                "the Authorization header must be 'Bearer <key>' (one header)", status=401, code="invalid_authorization"
            )
        if not hmac.compare_digest(token.strip(), self.api_key):
            return RequestError(
                "the API key is not this server's (Authorization: Bearer <key>)", status=401, code="invalid_api_key"
            )
        return None
