"""Drive the real label server in headless Chromium: used by the browser tests and the benchmark.

``LabelServer`` starts ``02_label_ui.py`` as a subprocess on a free loopback port and waits
until it answers; ``chromium`` launches Debian's Chromium through Playwright (never
``playwright install``: ``executable_path=/usr/bin/chromium``). The page's clip player
(``player.js``) records in ``window.rlhfTiming`` when a key went down and when a new pair was on
screen, which is what ``answer_and_wait`` reads.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lib.label_ui.config import REPO_ROOT

CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",  # required as root
    "--headless",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabelServer:
    """``02_label_ui.py`` in a subprocess: ``url``, ``startup_s`` (launch to first page), ``rss_mb()``.

    Without a token in ``args`` it runs with ``--no-token`` (the pages are what is tested), unless
    ``default_token``: then the server makes its own token and ``open_line`` is the line it
    printed to open the page (with ``?token=...``)."""

    def __init__(
        self,
        *args: str,
        port: int | None = None,
        cwd: Path | None = None,
        timeout: float = 60.0,
        default_token: bool = False,
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("PYTEST_CURRENT_TEST", "NICEGUI_USER_SIMULATION", "RLHF_LABEL_TOKEN")
        }
        env["PYTHONUNBUFFERED"] = "1"
        no_token = [] if default_token or "--token" in args or "--token-file" in args else ["--no-token"]
        cmd = [sys.executable, str(REPO_ROOT / "02_label_ui.py"), "--port", str(self.port), *no_token, *args]
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            cmd, cwd=cwd or REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.perf_counter() - t0
        self.open_line = ""
        if default_token:  # printed before the server answered: already in the pipe
            for line in self.proc.stdout:
                if line.startswith("Open "):
                    self.open_line = line.strip()
                    break

    def _wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"label server exited ({self.proc.returncode}): {self.proc.stdout.read()}")
            try:
                with urllib.request.urlopen(f"{self.url}/label", timeout=2) as r:
                    r.read()
                    return
            except urllib.error.HTTPError:
                return  # it answers (e.g. 401 with a token)
            except OSError:
                time.sleep(0.05)
        raise TimeoutError(f"label server did not answer on {self.url} within {timeout} s")

    def rss_mb(self) -> float:
        """Resident memory of the server process in MB (Linux /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> str:
        """Ctrl-C the server (it shuts down cleanly), kill it if it does not; returns its output."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.stdout.read() if self.proc.stdout else ""

    def __enter__(self) -> LabelServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextmanager
def chromium(viewport: tuple[int, int] = (1280, 800)) -> Any:
    """A fresh headless Chromium page (Playwright, sync API)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": viewport[0], "height": viewport[1]})
            yield page
        finally:
            browser.close()


def shown_count(page: Any) -> int:
    return page.evaluate("window.rlhfTiming ? window.rlhfTiming.shown.length : 0")


def wait_shown(page: Any, count: int, timeout_ms: float = 20_000) -> dict[str, Any]:
    """Wait until the player has put at least ``count`` pairs on screen; returns the last record."""
    page.wait_for_function(f"window.rlhfTiming && window.rlhfTiming.shown.length >= {count}", timeout=timeout_ms)
    return page.evaluate("window.rlhfTiming.shown[window.rlhfTiming.shown.length - 1]")


def shown_pair(page: Any) -> tuple[str, str]:
    """Relative segment paths of the two clips on show (from the videos' ``data-clip`` URLs)."""
    urls = [page.locator("video[data-clip]").nth(i).get_attribute("data-clip") for i in (0, 1)]
    out = []
    for url in urls:
        _, _, _db, env, name = url.split("/")
        out.append(f"{env}/{name.removesuffix('.mp4')}.dat")
    return out[0], out[1]


def answer_and_wait(page: Any, key: str) -> float:
    """Press ``key`` and wait for the next pair to be on screen; returns key-to-shown milliseconds
    as the page measured them (keydown event to the frame after both clips started)."""
    n = shown_count(page)
    page.keyboard.press(key)
    rec = wait_shown(page, n + 1)
    return float(rec["at"] - rec["keyAt"])


def small_png(png: bytes, colors: int = 128) -> bytes:
    """A PNG made smaller for the docs: a palette of ``colors`` colours (Atari frames have few)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    img.save(out, "PNG", optimize=True)
    return out.getvalue()
