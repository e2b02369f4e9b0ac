"""The label page in a real browser: the real server (``02_label_ui.py`` subprocess) in headless
Chromium (Debian's, driven by Playwright). What the simulated user cannot show: clips really
play (two screenshots differ) and in step, real key presses answer, the token login form."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from bench.dbs import action_model, make_atari_db
from bench.label_harness import LabelServer, answer_and_wait, chromium, shown_pair, wait_shown
from lib.store.labels import CANT_TELL, pair_key

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def atari_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("label") / "db"
    make_atari_db(db, 10, t=30)  # real SeaQuest frames from random play
    return db


def label_lines(db: Path) -> list[dict]:
    path = db / "labels.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def videos(page) -> list[dict]:
    return page.evaluate(
        "[...document.querySelectorAll('video[data-clip]')].map(v => ({t: v.currentTime, paused: v.paused,"
        " ready: v.readyState, rate: v.playbackRate, w: v.videoWidth}))"
    )


def test_clips_play_in_step_and_keys_answer(atari_db: Path, tmp_path: Path) -> None:
    args = ("-d", str(atari_db), "--cache-dir", str(tmp_path / "clips"), "--pairs", "8")
    with LabelServer(*args) as server, chromium() as page:
        page.goto(f"{server.url}/label")
        wait_shown(page, 1)
        # Both clips are loaded, playing, full size (2x the Atari screen), and in step.
        page.wait_for_function("[...document.querySelectorAll('video[data-clip]')].every(v => v.currentTime > 0.2)")
        vs = videos(page)
        assert len(vs) == 2 and all(v["ready"] >= 2 and not v["paused"] and v["w"] == 320 for v in vs), vs
        assert abs(vs[0]["t"] - vs[1]["t"]) < 0.15, vs
        # The clip animates: two screenshots of it a moment apart differ.
        clip = page.locator("video[data-clip]").first
        first = clip.screenshot()
        time.sleep(0.3)
        assert clip.screenshot() != first
        # Keys 1, 2, 0, x answer the pair on show; the next pair comes by itself.
        answered = []
        for key in ("1", "2", "0", "x"):
            pair = shown_pair(page)
            answer_and_wait(page, key)
            assert shown_pair(page) != pair
            answered.append(pair)
        deadline = time.monotonic() + 5
        while len(label_lines(atari_db)) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        lines = label_lines(atari_db)
        assert [(x["sample1"], x["sample2"]) for x in lines] == answered
        assert [x["label"] for x in lines] == [1, 2, 0, CANT_TELL]
        assert all(x["source"] == "human" for x in lines)
        assert len({pair_key(*p) for p in answered}) == 4
        # Existing labels: newest first; a pair's clips play in a dialog; a click changes the label.
        page.get_by_text("Existing labels").click()
        page.get_by_text("4 labels").wait_for()
        n = page.evaluate("window.rlhfTiming.shown.length")
        page.get_by_role("button", name="play this pair").first.click()
        wait_shown(page, n + 1)
        page.keyboard.press("Escape")
        page.get_by_role("button", name="2", exact=True).first.click()
        deadline = time.monotonic() + 5
        while len(label_lines(atari_db)) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        last = label_lines(atari_db)[-1]
        assert (last["sample1"], last["sample2"], last["label"], last["edited"]) == (*answered[-1], 2, True)


def test_pause_and_speed_keys_drive_both_clips(atari_db: Path, tmp_path: Path) -> None:
    args = ("-d", str(atari_db), "--cache-dir", str(tmp_path / "clips"))
    with LabelServer(*args) as server, chromium() as page:
        page.goto(f"{server.url}/label")
        wait_shown(page, 1)
        page.keyboard.press(" ")
        page.wait_for_function("[...document.querySelectorAll('video[data-clip]')].every(v => v.paused)")
        page.keyboard.press(" ")
        page.keyboard.press("+")
        page.wait_for_function(
            "[...document.querySelectorAll('video[data-clip]')].every(v => !v.paused && v.playbackRate === 2)"
        )


def test_token_is_asked_once_then_the_page_works(atari_db: Path, tmp_path: Path) -> None:
    token = "browser-token-123"
    args = ("-d", str(atari_db), "--cache-dir", str(tmp_path / "clips"), "--token", token)
    with LabelServer(*args) as server, chromium() as page:
        page.goto(f"{server.url}/label")
        page.fill("#token", "not-the-token")
        page.click("#login")
        assert "Wrong token" in page.content()
        page.fill("#token", token)
        page.click("#login")
        page.wait_for_url(f"{server.url}/label")
        wait_shown(page, 1)  # clips load too: the cookie covers them and the websocket
        page.goto(f"{server.url}/")  # asked once: the next page opens without the form
        assert page.locator("#token").count() == 0
        page.get_by_text("Label new data").first.wait_for()


def test_the_printed_link_opens_the_page_with_the_default_token(atari_db: Path, tmp_path: Path) -> None:
    """No token given: the link the server prints logs the browser in (clips and websocket too);
    without it a browser gets the login form."""
    args = ("-d", str(atari_db), "--cache-dir", str(tmp_path / "clips"))
    with LabelServer(*args, default_token=True) as server, chromium() as page:
        page.goto(f"{server.url}/label")
        assert page.locator("#token").count() == 1
        link = server.open_line.split()[1].replace("localhost", "127.0.0.1")
        page.goto(link)
        page.wait_for_url(f"{server.url}/label")
        wait_shown(page, 1)


def _get(url: str, **headers: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as r:
            return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def test_only_its_own_host_names_and_origins_are_served(atari_db: Path, tmp_path: Path) -> None:
    """DNS rebinding: a page of another site that resolves its name to 127.0.0.1 sends that name
    as Host; cross-site scripts send their Origin. Both are refused; the server's names work."""
    args = ("-d", str(atari_db), "--cache-dir", str(tmp_path / "clips"), "--public-host", "labels.example")
    with LabelServer(*args) as server:
        port = server.port
        url = f"{server.url}/label"
        assert _get(url, Host=f"127.0.0.1:{port}")[0] == 200
        assert _get(url, Host=f"localhost:{port}")[0] == 200
        assert _get(url, Host=f"labels.example:{port}")[0] == 200
        status, body = _get(url, Host=f"rebind.attacker.example:{port}")
        assert status == 403 and "--public-host" in body
        assert _get(url, Origin="http://attacker.example")[0] == 403
        assert _get(url, Origin=f"http://localhost:{port}")[0] == 200
        status, body = _get(url, Origin=f"http://localhost:{port + 1}")  # a page of another local server
        assert status == 403 and "another port" in body
        socketio = f"{server.url}/_nicegui_ws/socket.io/?EIO=4&transport=polling"
        assert _get(socketio, Origin="http://attacker.example")[0] == 403
        assert _get(socketio, Origin=f"http://127.0.0.1:{port}")[0] == 200
        assert _get(socketio, Origin=f"http://127.0.0.1:{port + 1}")[0] == 403


def test_model_view_plots_follow_the_clips(atari_db: Path, tmp_path: Path) -> None:
    """--reward: under each clip the model's per-step prediction, its cursor moving with the video."""
    model = action_model((210, 160), tmp_path / "model.pt", [{a: 0.1 * (a % 5) for a in range(18)}])
    args = ("-d", str(atari_db), "--cache-dir", str(tmp_path / "clips"), "--reward", str(model))
    with LabelServer(*args) as server, chromium() as page:
        page.set_viewport_size({"width": 1280, "height": 760})
        page.goto(f"{server.url}/label")
        wait_shown(page, 1)
        page.get_by_text("reward model: P(#1 better) =").wait_for()
        assert page.locator("svg[data-plot-for] polyline").count() == 2
        cursor = "document.querySelector('svg[data-plot-for] .rlhf-cursor').getAttribute('x1')"
        page.wait_for_function(f"Number({cursor}) > 0")
        first = float(page.evaluate(cursor))
        page.wait_for_function(f"Number({cursor}) !== {first}")  # it moves as the clip plays
        # the cursor sits where the video is: x / width = currentTime / duration
        frac = page.evaluate(
            "(() => { const s = document.querySelector('svg[data-plot-for]');"
            " const v = document.getElementById(s.dataset.plotFor); v.pause();"
            " return new Promise(r => requestAnimationFrame(() => requestAnimationFrame(() => r("
            "[Number(s.querySelector('.rlhf-cursor').getAttribute('x1')) / s.width.baseVal.value,"
            " v.currentTime / v.duration]))))})()"
        )
        assert abs(frac[0] - frac[1]) < 0.02, frac
        shot = tmp_path / "label_model_view.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 20_000
