"""Drive the real label server in headless Chromium: used by the browser tests and the benchmark.

``LabelServer`` starts ``02_label_ui.py`` as a subprocess on a free loopback port and waits
until it answers; ``chromium`` launches Debian's Chromium through Playwright (never
``playwright install``: ``executable_path=/usr/bin/chromium``). The page's clip player
(``player.js``) records in ``window.rlhfTiming`` when a key went down and when a new pair was on
screen, which is what ``answer_and_wait`` reads. ``Beside`` runs the rest of a live round next to
the page: ``03_reward_train.py --follow`` on the DB's labels and a recording ``01_a2c.py``.
"""

from __future__ import annotations

import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
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


BESIDE_NAME = "x"  # the run name of the trainer and the A2C beside the page
A2C_STEP_LINE = re.compile(r"^step\s+([0-9,]+) \|", re.MULTILINE)


class Beside:
    """A live round's other stages as real subprocesses beside the label page, on the same DB:
    ``03_reward_train.py -n x -o WORK/reward --follow`` (retrains as the page's answers arrive) and
    ``01_a2c.py -n x --save WORK/a2c --db-path DB`` (records new segments into it). Each writes its
    output to ``WORK/logs/NAME.log``; TensorBoard logs go to ``WORK/runs``. ``stop()`` sends Ctrl-C
    (SIGINT) as a person would, then SIGTERM, then SIGKILL to what does not end."""

    def __init__(
        self,
        db: Path,
        work: Path,
        envs: int = 8,
        record_prob: float = 0.01,
        retrain_every: int = 5,
        poll: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.db, self.work = Path(db), Path(work)
        self.out, self.save, self.runs, self.logs = (self.work / d for d in ("reward", "a2c", "runs", "logs"))
        self.logs.mkdir(parents=True, exist_ok=True)
        py = sys.executable
        trainer = [py, REPO_ROOT / "03_reward_train.py", "-n", BESIDE_NAME, "-o", self.out, "--follow"]
        trainer += ["--retrain-every", str(retrain_every), "--poll", f"{poll:g}", "--runs-dir", self.runs]
        trainer += ["--no-progress", self.db]
        a2c = [py, REPO_ROOT / "01_a2c.py", "-n", BESIDE_NAME, "--save", self.save, "--db-path", self.db]
        a2c += ["--record-prob", f"{record_prob:g}", "--envs", str(envs), "--max-steps", "100000000"]
        a2c += ["--test-every", "100000000", "--runs-dir", self.runs, "--seed", str(seed)]
        self.procs: dict[str, subprocess.Popen] = {}
        self.stopped_by: dict[str, str] = {}  # name -> the signal that ended it
        try:
            self.procs["trainer"] = self._spawn("trainer", trainer)
            self.procs["a2c"] = self._spawn("a2c", a2c)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, cmd: list[Any]) -> subprocess.Popen:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_CURRENT_TEST", "NICEGUI_USER_SIMULATION")}
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.logs / f"{name}.log", "w", encoding="utf-8") as log:
            # Its own session: a Ctrl-C in the terminal reaches the caller, which stops each in turn.
            argv = [str(c) for c in cmd]
            return subprocess.Popen(
                argv, cwd=self.work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def log(self, name: str) -> str:
        try:
            return (self.logs / f"{name}.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_size(self, name: str) -> int:
        """Where ``name``'s log ends now: ``log(name)[size:]`` later is what it printed since."""
        return len(self.log(name))

    def check_running(self) -> None:
        """RuntimeError naming a process that ended (with its log's tail)."""
        for name, p in self.procs.items():
            if p.poll() is not None:
                tail = "\n".join(self.log(name).splitlines()[-15:])
                raise RuntimeError(f"{name} beside the page ended (exit {p.returncode}):\n{tail}")

    def wait_for(self, what: str, done: Any, timeout: float, poll: float = 0.2) -> None:
        """Wait until ``done()``; a process ending meanwhile, or ``timeout`` s passing, is an error."""
        end = time.monotonic() + timeout
        while not done():
            self.check_running()
            if time.monotonic() > end:
                raise TimeoutError(f"no {what} within {timeout:.0f} s; logs in {self.logs}")
            time.sleep(poll)

    def a2c_logged_step(self) -> int | None:
        """The agent step of the A2C's newest progress line (one every 10 s), None before the first."""
        steps = A2C_STEP_LINE.findall(self.log("a2c"))
        return int(steps[-1].replace(",", "")) if steps else None

    def a2c_final_step(self) -> int | None:
        """Agent steps the stopped A2C saved in its ``last.pt`` (None when there is none)."""
        from lib.store.checkpoints import read_checkpoint

        last = self.save / "last.pt"
        if not last.exists():
            return None
        return int(read_checkpoint(last, "model").get("progress", {}).get("step", 0))

    @property
    def versions_path(self) -> Path:
        from lib.reward.follow import versions_log

        return versions_log(self.out, BESIDE_NAME)

    def versions(self) -> list[dict[str, Any]]:
        """The trainer's versions so far (``lib.reward.follow.read_versions``)."""
        from lib.reward.follow import read_versions

        return read_versions(self.versions_path)

    def stop(self, grace: float = 30.0) -> dict[str, int]:
        """SIGINT to every process still running, then SIGTERM, then SIGKILL to those that do not
        end within ``grace`` s (10 s for the harder ones); their exit codes. ``stopped_by`` says
        which signal ended each."""
        for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            running = {n: p for n, p in self.procs.items() if p.poll() is None}
            for name, p in running.items():
                p.send_signal(sig)
                self.stopped_by[name] = sig.name
            end = time.monotonic() + wait
            for p in running.values():
                with suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=max(0.0, end - time.monotonic()))
        return {name: p.wait() for name, p in self.procs.items()}

    def __enter__(self) -> Beside:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def small_png(png: bytes, colors: int = 128) -> bytes:
    """A PNG made smaller for the docs: a palette of ``colors`` colours (Atari frames have few)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    img.save(out, "PNG", optimize=True)
    return out.getvalue()
