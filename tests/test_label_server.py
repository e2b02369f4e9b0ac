"""The real label server (``02_label_ui.py`` in a subprocess, no browser): what it prints at start."""

from __future__ import annotations

import http.cookiejar
import re
import urllib.error
import urllib.request
from pathlib import Path

from bench.dbs import make_synthetic_db
from bench.label_harness import LabelServer


def _status(opener: urllib.request.OpenerDirector, url: str) -> tuple[int, str]:
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
