"""The real label server (``02_label_ui.py`` in a subprocess, no browser): what it prints at start."""

from __future__ import annotations

import http.cookiejar
import http.server
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.dbs import make_synthetic_db
from bench.label_harness import LabelServer, chromium, free_port


def _status(opener: urllib.request.OpenerDirector, url: str | urllib.request.Request) -> tuple[int, str]:
    try:
        with opener.open(url, timeout=20) as r:
            return r.status, r.geturl()
    except urllib.error.HTTPError as e:
        return e.code, e.geturl()


def test_loopback_asks_for_the_token_printed_at_start(tmp_path: Path) -> None:
    """Medium 4: without --token (or --no-token) the server makes a token and prints the link that
    carries it; another account's browser without the link gets the login form."""
    db = tmp_path / "db"
    make_synthetic_db(db, 4)
    with LabelServer("-d", str(db), "--cache-dir", str(tmp_path / "clips"), default_token=True) as server:
        m = re.fullmatch(r"Open http://localhost:(\d+)/label\?token=([A-Za-z0-9_-]{32,})\s+\(.*\)", server.open_line)
        assert m and int(m.group(1)) == server.port, server.open_line
        stranger = urllib.request.build_opener()
        assert _status(stranger, f"{server.url}/label")[0] == 401
        assert _status(stranger, f"{server.url}/label?token=not-the-token")[0] == 401
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
        status, landed = _status(browser, f"{server.url}/label?token={m.group(2)}")
        assert status == 200 and landed == f"{server.url}/label"  # the link logs in and drops the token
        assert _status(browser, f"{server.url}/")[0] == 200  # the cookie keeps it in


def test_a_login_cookie_opens_only_this_server_run(tmp_path: Path) -> None:
    """Audit 4 item 6: browsers do not separate cookies by port, and the cookie was an HMAC of the
    token, so another server on the same host received a credential that opened this one for 30
    days. Now the cookie is random per server run and named after its port."""
    db = tmp_path / "db"
    make_synthetic_db(db, 4)
    token = "the-same-token-for-both"
    args = ("-d", str(db), "--cache-dir", str(tmp_path / "clips"), "--token", token)
    jar = http.cookiejar.CookieJar()  # one browser: like a browser's, its cookies ignore the port
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with LabelServer(*args) as a:
        assert _status(browser, f"{a.url}/label?token={token}")[0] == 200
        assert [c.name for c in jar] == [f"rlhf_label_auth_{a.port}"]
        with LabelServer(*args) as b:  # same token, another port: the cookie reaches it
            assert _status(browser, f"{b.url}/label")[0] == 401
            assert _status(browser, f"{b.url}/label?token={token}")[0] == 200
            assert _status(browser, f"{a.url}/label")[0] == 200  # b's login did not log a out
        port = a.port
    with LabelServer(*args, port=port) as again:  # the same server started again
        assert _status(browser, f"{again.url}/label")[0] == 401


# Cookies of other apps on this host that Python's SimpleCookie cannot read, and stopped at: browsers
# send every cookie of the host whatever its port, so any local app (or a page on another port, on
# purpose) can put one beside the login cookie.
JUNK_COOKIES = ['prefs={"a":1,"b":2}', "cart[item]=1", "msg=hello world"]


@pytest.mark.parametrize("junk", JUNK_COOKIES)
def test_other_apps_cookies_do_not_lock_the_owner_out(tmp_path: Path, junk: str) -> None:
    """The login cookie is found among whatever other cookies the browser sends with it, before
    or after it; without it, or with a wrong value, the junk lets nobody in."""
    db = tmp_path / "db"
    make_synthetic_db(db, 4)
    token = "the-owners-token"
    with LabelServer("-d", str(db), "--cache-dir", str(tmp_path / "clips"), "--token", token) as server:
        jar = http.cookiejar.CookieJar()
        browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
        assert _status(browser, f"{server.url}/label?token={token}")[0] == 200
        (login,) = [f"{c.name}={c.value}" for c in jar]
        plain = urllib.request.build_opener()  # sends the Cookie header exactly as written here
        for header in (f"{junk}; {login}", f"{login}; {junk}", f"{junk}; {login}; {junk}"):
            req = urllib.request.Request(f"{server.url}/label", headers={"Cookie": header})
            assert _status(plain, req) == (200, f"{server.url}/label"), header
        wrong = login.split("=")[0] + "=" + "0" * 64
        for header in (junk, f"{junk}; {wrong}", f"{wrong}; {junk}"):
            req = urllib.request.Request(f"{server.url}/label", headers={"Cookie": header})
            assert _status(plain, req)[0] == 401, header


# What a browser sends (Fetch Metadata) with a login attempt that a page of another site makes:
# an <img src=".../?token=guess"> on any web page, or on a page of another port of this host
# (ports do not make another site: Sec-Fetch-Site says same-site there).
IMG_CROSS_SITE = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
IMG_OTHER_PORT = {"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
TYPED_LINK = {"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}


def test_other_sites_cannot_lock_the_owner_out(tmp_path: Path) -> None:
    """Audit 4 item 7: ~40 bad tokens a second from an <img> on any page made every correct login
    answer 429. Attempts from other sites are refused without counting against the address; the
    owner's correct token, from the printed link, gets in while they go on."""
    db = tmp_path / "db"
    make_synthetic_db(db, 4)
    token = "the-owners-token"
    with LabelServer("-d", str(db), "--cache-dir", str(tmp_path / "clips"), "--token", token) as server:
        stranger = urllib.request.build_opener()
        flood, logins = [], []
        for k in range(10):
            for n, headers in enumerate((IMG_CROSS_SITE, IMG_OTHER_PORT) * 2):
                req = urllib.request.Request(f"{server.url}/label?token=guess-{k}-{n}", headers=headers)
                flood.append(_status(stranger, req)[0])
            owner = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
            req = urllib.request.Request(f"{server.url}/label?token={token}", headers=TYPED_LINK)
            logins.append(_status(owner, req))
        assert logins == [(200, f"{server.url}/label")] * 10, logins
        assert set(flood) == {403}, flood
        wrong = urllib.request.Request(f"{server.url}/label?token=a-typo", headers=TYPED_LINK)
        assert _status(stranger, wrong)[0] == 401  # the owner's own typo: counted, not 429


@contextmanager
def page_server(html: str) -> Iterator[int]:
    """Another web server on this machine serving one page; yields its port."""

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = html.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Page) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        try:
            yield httpd.server_address[1]
        finally:
            httpd.shutdown()


@pytest.mark.browser
def test_img_tags_of_other_pages_do_not_lock_the_owner_out(tmp_path: Path) -> None:
    """Item 7 in Chromium: what it really sends for <img> tags on a page of another site
    (localhost:P) and on a page of another port of the label server's host (127.0.0.1:P)."""
    db = tmp_path / "db"
    make_synthetic_db(db, 4)
    token = "the-owners-token"
    with LabelServer("-d", str(db), "--cache-dir", str(tmp_path / "clips"), "--token", token) as server:
        imgs = "".join(f'<img src="{server.url}/label?token=guess-{k}">' for k in range(20))
        with page_server(f"<!doctype html><body>{imgs}</body>") as port, chromium() as page:
            for host in ("localhost", "127.0.0.1"):
                page.goto(f"http://{host}:{port}/")
                page.wait_for_function("[...document.images].every(i => i.complete)")
            response = page.goto(f"{server.url}/label?token={token}")  # the printed link
            assert response is not None and response.status == 200, response and response.status
            assert page.url == f"{server.url}/label" and page.locator("#token").count() == 0
