"""Who may use the label server: a token asked once per browser and kept in a cookie, the Host and
Origin check, bounded request bodies. A token is the default, on loopback too (another account of
the machine reaches 127.0.0.1); ``--no-token`` is for loopback only. Wrong tokens are rate-limited
per address (``LoginLimiter``), and a login made by another site's page is refused uncounted, so no
web page can lock the owner out."""

from __future__ import annotations

import hmac
import html
import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

COOKIE = "rlhf_label_auth"
LOGIN_PATH = "/login"
_MAX_FORM = 4096


def cookie_name(port: int) -> str:
    """The login cookie's name on the server of ``port``: ``rlhf_label_auth_8080``."""
    return f"{COOKIE}_{port}"


def _safe_next(target: str | None) -> str:
    # Only a local path: never redirect to another site after login.
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def login_form(next_path: str = "/", error: str = "") -> str:
    """A plain HTML form (no NiceGUI: the page must work before the browser is let in)."""
    err = f'<p style="color:#b00020">{html.escape(error)}</p>' if error else ""
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>RLHF labels: token</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body style="font-family:sans-serif;max-width:28rem;margin:4rem auto">
<h2>RLHF labeling</h2><p>This server asks for its access token (see <code>--token</code>).</p>{err}
<form method="post" action="{LOGIN_PATH}">
<input type="hidden" name="next" value="{html.escape(next_path)}">
<input id="token" type="password" name="token" autofocus placeholder="token" style="width:16rem">
<button id="login" type="submit">Enter</button></form></body></html>"""


async def read_bounded(request: Request, limit: int) -> bytes | None:
    """The request's body, or None when it is larger than ``limit`` bytes: refused by its
    Content-Length before reading, and never read past ``limit`` (a chunked upload stops there)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                return None
        except ValueError:
            return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def from_another_site(headers: Mapping[str, str]) -> bool:
    """Whether a browser marked the request as made by a page of another site (Fetch Metadata,
    https://www.w3.org/TR/fetch-metadata/): ``Sec-Fetch-Site`` other than ``same-origin`` (our own
    form) or ``none`` (a link typed, pasted or opened from a terminal) -- ``same-site`` included, as
    a page on another port of this host is same-site -- or, with no ``Origin``, anything but a
    navigation (an ``<img>``). A request without these headers (a script, an old browser) is not."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        return True
    mode = headers.get("sec-fetch-mode")
    return mode is not None and mode != "navigate" and "origin" not in headers


class LoginLimiter:
    """Wrong tokens per client address: a burst of ``burst``, then one more every ``1 / rate``
    seconds; past that, ``wait`` says how long the address must wait (the login answers 429)."""

    MAX_ADDRESSES = 10_000

    def __init__(self, burst: int = 5, rate: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.rate, self.clock = burst, rate, clock
        self.debt: dict[str, tuple[float, float]] = {}  # address -> (wrong attempts owed, when counted)

    def _owed(self, who: str) -> float:
        owed, at = self.debt.get(who, (0.0, 0.0))
        return max(owed - (self.clock() - at) * self.rate, 0.0)

    def wait(self, who: str) -> float:
        """Seconds ``who`` must wait before its next attempt is looked at (0: now)."""
        over = self._owed(who) - (self.burst - 1)
        return over / self.rate if over > 0 else 0.0

    def failed(self, who: str) -> None:
        if len(self.debt) >= self.MAX_ADDRESSES:  # many addresses: forget the ones that owe nothing
            self.debt = {k: v for k, v in self.debt.items() if self._owed(k) > 0}
        self.debt[who] = (self._owed(who) + 1.0, self.clock())


def cookie_values(header: bytes, name: bytes) -> list[bytes]:
    """The values of every cookie called ``name`` in a Cookie header (``b"a=1; b=2"``), read
    leniently: pairs are split on ';' and anything that is not ``name=value`` is skipped. Python's
    ``SimpleCookie`` gives up on the whole header at the first cookie it cannot read (``msg=hello
    world``, ``cart[item]=1``), and browsers send every cookie of the host, other apps' included."""
    values = []
    for pair in header.split(b";"):
        key, eq, value = pair.partition(b"=")
        if eq and key.strip() == name:
            values.append(value.strip())
    return values


class TokenMiddleware:
    """ASGI middleware: every HTTP request and websocket needs the cookie
    ``rlhf_label_auth_<port>``, else it gets the login form (pages) or 401. The cookie holds a
    random secret of this run, not the token, so the token is never stored in the browser; browsers
    do not separate cookies by port, so the value is good for this run only and the port in the name
    keeps two servers apart. ``/login`` and ``/?token=T`` set it (HttpOnly, SameSite=Strict, until
    the browser closes)."""

    def __init__(self, app: Any, token: str, port: int, limiter: LoginLimiter | None = None) -> None:
        self.app = app
        self.token = token
        self.cookie = cookie_name(port)
        self.expected = secrets.token_hex(32)  # this run's: a restart logs every browser out
        self.limiter = limiter or LoginLimiter()

    def _authorized(self, scope: dict[str, Any]) -> bool:
        raw = b"; ".join(v for k, v in scope.get("headers", []) if k == b"cookie")
        # Any cookie of that name may be ours: a page on another port can set a decoy of the same
        # name, and the browser sends both. Each is compared in constant time; a wrong one lets no one in.
        expected = self.expected.encode()
        return any(hmac.compare_digest(got, expected) for got in cookie_values(raw, self.cookie.encode()))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self._authorized(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        response = await self._login_flow(Request(scope, receive))
        await response(scope, receive, send)

    async def _login_flow(self, request: Request) -> Response:
        path = request.url.path
        if path == LOGIN_PATH and request.method == "POST":
            body = await read_bounded(request, _MAX_FORM)
            if body is None:
                return PlainTextResponse(f"a login form has at most {_MAX_FORM} bytes", status_code=413)
            form = parse_qs(body.decode("utf-8", "replace"))
            return self._attempt(request, form.get("token", [""])[0], _safe_next(form.get("next", ["/"])[0]))
        query_token = request.query_params.get("token")
        if query_token is not None and request.method == "GET":
            return self._attempt(request, query_token, _safe_next(path))
        if request.method == "GET" and "text/html" in request.headers.get("accept", "") or path == LOGIN_PATH:
            nxt = _safe_next(request.query_params.get("next") if path == LOGIN_PATH else path)
            return HTMLResponse(login_form(nxt), status_code=401)
        return PlainTextResponse("token required: open the page in a browser and enter it", status_code=401)

    def _attempt(self, request: Request, token: str, nxt: str) -> Response:
        """A login attempt: the cookie for the right token, the form again for a wrong one, 429 when
        this address has tried too often. One made by another site's page is refused uncounted."""
        if from_another_site(request.headers):
            return HTMLResponse(login_form(nxt, "A login from another site's page is refused: enter it here."), 403)
        who = request.client.host if request.client is not None else ""
        wait = self.limiter.wait(who)
        if wait > 0:
            return PlainTextResponse(
                "too many login attempts: wait a moment", status_code=429, headers={"Retry-After": str(math.ceil(wait))}
            )
        if hmac.compare_digest(token.encode(), self.token.encode()):
            return self._grant(nxt)
        self.limiter.failed(who)
        return HTMLResponse(login_form(nxt, "Wrong token."), status_code=401)

    def _grant(self, nxt: str) -> Response:
        response = RedirectResponse(quote(nxt, safe="/?=&"), status_code=303)
        response.set_cookie(self.cookie, self.expected, httponly=True, samesite="strict")  # until the browser closes
        return response


MAX_BODY = 1 << 20  # any request: the pages post small socket.io messages and the login form


class BodyLimitMiddleware:
    """ASGI middleware: a request body larger than ``limit`` is refused before it is read (413 by
    its Content-Length), and one without a Content-Length is cut off past ``limit`` (the app sees
    the client disconnect), so no route, NiceGUI's included, ever holds more than ``limit``."""

    def __init__(self, app: Any, limit: int = MAX_BODY) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = [v for k, v in scope.get("headers", []) if k == b"content-length"]
        try:
            too_big = any(int(v) > self.limit for v in declared)
        except ValueError:
            too_big = True
        if too_big:
            await PlainTextResponse(f"request body over {self.limit} bytes", status_code=413)(scope, receive, send)
            return
        seen = 0

        async def bounded_receive() -> dict[str, Any]:
            nonlocal seen
            if seen > self.limit:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, bounded_receive, send)


def _host_name(value: str) -> str:
    """'Example.org:8080' -> 'example.org', '[::1]:8080' -> '::1' (a Host header's name part)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _host_port(value: str) -> int | None:
    """'example.org:8080' -> 8080, '[::1]:8080' -> 8080, 'example.org' -> None."""
    value = value.strip()
    tail = value.rsplit("]", 1)[1] if value.startswith("[") and "]" in value else value
    if tail.count(":") != 1:
        return None
    digits = tail.rsplit(":", 1)[1]
    return int(digits) if digits.isdigit() and len(digits) <= 5 else -1


class HostCheckMiddleware:
    """ASGI middleware against DNS rebinding and cross-site websockets: a request is served only
    when its Host header names this server (the bound address, localhost, or a ``--public-host``)
    and, when it carries an Origin (browsers send one with websockets, socket.io and POSTs),
    that Origin's host is one of those names too. Anything else gets 403 (or a closed websocket)."""

    def __init__(self, app: Any, allowed: set[str]) -> None:
        self.app = app
        self.allowed = {_host_name(h) for h in allowed}

    def why_refused(self, scope: dict[str, Any]) -> str | None:
        headers = {k: v.decode("latin-1") for k, v in scope.get("headers", []) if k in (b"host", b"origin")}
        host_header = headers.get(b"host", "")
        host = _host_name(host_header)
        if host not in self.allowed:
            return f"this server does not answer to the host name {host!r}"
        origin = headers.get(b"origin")
        if origin is not None:
            try:
                parts = urlsplit(origin)
                origin_port = parts.port
            except ValueError:
                return f"requests from the page {origin[:80]!r} are not accepted"
            if parts.scheme not in ("http", "https") or (parts.hostname or "") not in self.allowed:
                return f"requests from the page {origin[:80]!r} are not accepted"
            # Same port as the Host header (a page of another local server is another site), an
            # absent port being the scheme's default: an SSH tunnel or a proxy keeps them equal.
            if origin_port is None:
                origin_port = 443 if parts.scheme == "https" else 80
            port = _host_port(host_header)
            if origin_port != port and not (port is None and origin_port in (80, 443)):
                return f"requests from the page {origin[:80]!r} (another port) are not accepted"
        return None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            why = self.why_refused(scope)
            if why is not None:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                names = ", ".join(sorted(self.allowed))
                text = f"{why}: it answers to {names} (start it with --public-host NAME to add one)"
                await PlainTextResponse(text, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)
