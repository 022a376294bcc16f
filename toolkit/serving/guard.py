"""RequestGuard: what the server checks before any route reads a byte of the body.

    app = RequestGuard(app, api_key="sk-...", max_body_bytes=8 << 20, allowed_hosts=["127.0.0.1"])

In this order, each answered with OpenAI's error body and nothing parsed:
1. the Host header, when `allowed_hosts` is given (a key-less server on loopback is
   otherwise open to DNS rebinding: a web page's script reaching 127.0.0.1 under its own
   name): 400 for any other host;
2. the API key, when one is set, on every path but the open ones (`/health`, and `/metrics`
   unless `protect_metrics`; vLLM leaves both open): 401, so a large body from a client
   without the key costs nothing (the docs, /openapi.json and /redoc need the key too);
3. the body size: past `max_body_bytes` 413, at once from Content-Length, or as soon as
   the bytes received pass it.
The body is then handed to the app from memory, as it came.
"""

from __future__ import annotations

import hmac
import json
from typing import Any, Awaitable, Callable, Sequence

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]

DEFAULT_MAX_BODY_BYTES = 8 << 20          # 8 MiB: a max-length prompt is far smaller
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


class RequestGuard:
    def __init__(self, app: ASGIApp, *, api_key: str | None = None,
                 max_body_bytes: int | None = DEFAULT_MAX_BODY_BYTES,
                 allowed_hosts: Sequence[str] | None = None, protect_metrics: bool = False) -> None:
        if max_body_bytes is not None and (not isinstance(max_body_bytes, int) or max_body_bytes < 1):
            raise ValueError(f"max_body_bytes must be a positive integer or None, got {max_body_bytes!r}")
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.allowed_hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self.open_paths = {"/health"} if protect_metrics else {"/health", "/metrics"}

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _respond(send, *refusal)
            return
        body = await self._read_body(receive, headers)
        if body is None:
            await _respond(send, 413, f"the request body is larger than this server's limit of "
                                      f"{self.max_body_bytes} bytes (--max-request-body-bytes)",
                           "invalid_request_error", "request_too_large")
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()              # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str, str, str] | None:
        if self.allowed_hosts is not None:
            host = _host_name(headers.get("host", ""))
            if host not in self.allowed_hosts:
                return (400, f"the Host header {headers.get('host', '')!r} is not one this server "
                             f"answers to ({sorted(self.allowed_hosts)}; see --allowed-hosts)",
                        "invalid_request_error", "invalid_host")
        if self.api_key is not None and scope.get("path", "") not in self.open_paths:
            given = headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.api_key}".encode()):
                return 401, "Incorrect API key provided", "authentication_error", "invalid_api_key"
        return None

    async def _read_body(self, receive, headers: dict[str, str]) -> bytes | None:
        """The whole body, or None past the limit (from Content-Length before reading)."""
        limit = self.max_body_bytes
        declared = headers.get("content-length", "")
        if limit is not None and declared.isdigit() and int(declared) > limit:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if limit is not None and size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _host_name(host: str) -> str:
    """The Host header without its port ("[::1]:8000" -> "[::1]", "a:80" -> "a")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


async def _respond(send, status: int, message: str, type_: str, code: str) -> None:
    body = json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
