"""The label page's logic, with NiceGUI's simulated user (no browser, milliseconds per action).

Each test starts the real main file ``02_label_ui.py`` with its own command line (``sys.argv``),
in-process, through ``nicegui.testing.user_simulation`` -- the machinery of NiceGUI's ``user``
fixture -- and checks what a person would see and what lands in ``labels.jsonl``.
What only a browser can show (clips animating, real key presses) is in test_label_browser.py.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from nicegui import Client, core, ui
from nicegui.testing import User
from nicegui.testing.user_simulation import user_simulation

from bench.dbs import action_model, make_synthetic_db, write_action_db
from lib.core.settings import MAX_SEED
from lib.label_ui.cli import main
from lib.store.labels import CANT_TELL, RETRACTED, Label, append_labels, load_labels, pair_key, read_label_log

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "02_label_ui.py"


# --- helpers ---------------------------------------------------------------------------------


@pytest.fixture
def label_app(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    """``async with label_app('-d', db, ...) as user``: the app of that command line (with
    ``--no-token`` unless it gives a token or ``default_token=True``) and a user.

    Like NiceGUI's ``user`` fixture, a test fails when the app logged an ERROR."""

    @asynccontextmanager
    async def start(*args: str, default_token: bool = False) -> AsyncIterator[User]:
        # A token is the default, also on loopback: the tests of the pages opt out (--no-token)
        # unless they give one or test the default.
        no_token = [] if default_token or "--token" in args else ["--no-token"]
        argv = [
            "02_label_ui.py",
            "--cache-dir",
            str(tmp_path / "clips"),
            "--seed",
            "1",
            "--public-host",
            "test",
            *no_token,
            *args,
        ]
        monkeypatch.setattr(sys, "argv", argv)
        async with user_simulation(main_file=MAIN) as user:
            yield user
            # Close the pages first: on Python 3.11 a page's outbox loop can miss the shutdown's
            # cancel when it coincides with an update (asyncio.wait_for), stalling teardown 2 s.
            for client in list(Client.instances.values()):
                client.delete()
        errors = [r.getMessage() for r in caplog.get_records("call") if r.levelname == "ERROR"]
        assert not errors, f"the app logged errors: {errors}"

    return start


def second_user() -> User:
    """Another browser (its own cookies and tab) on the running simulated app."""
    return User(httpx.AsyncClient(transport=httpx.ASGITransport(core.app), base_url="http://test"))


async def press(user: User, key: str) -> None:
    """A key press as ui.keyboard reports it from the browser."""
    user.find(ui.keyboard).trigger(
        "key",
        {
            "action": "keydown",
            "key": key,
            "code": "",
            "repeat": False,
            "location": 0,
            "altKey": False,
            "ctrlKey": False,
            "metaKey": False,
            "shiftKey": False,
        },
    )


async def until(cond: Callable[[], object], timeout: float = 15.0) -> None:
    """Wait (yielding to the app) until ``cond()`` is true."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


async def see(user: User, *args: object, **kwargs: object) -> None:
    """``user.should_see`` with patience: clips encode in worker threads, so what depends on them
    (the pair on show, a notice about an unreadable segment) can take a while on a loaded machine.
    NiceGUI's default of 3 tries 0.1 s apart is too short there."""
    await user.should_see(*args, retries=150, **kwargs)


def shown_pair(user: User) -> tuple[str, str]:
    """The relative segment paths of the pair on show (from the clip elements' URLs)."""
    out = []
    for k in (1, 2):
        (el,) = user.find(marker=f"clip-{k}").elements
        url = el.props.get("data-clip")
        assert url, "no clip on show"
        _, _, _db, env, name = url.split("/")
        out.append(f"{env}/{name.removesuffix('.mp4')}.dat")
    return out[0], out[1]


def label_lines(db: Path) -> list[dict]:
    path = db / "labels.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def list_texts(user: User, n: int) -> list[str]:
    texts = []
    for i in range(n):
        (row,) = user.find(marker=f"pair-{i}").elements
        texts.append(" ".join(el.text for el in row.descendants() if isinstance(el, ui.label)))
    return texts


@pytest.fixture
def db(tmp_path: Path) -> Path:
    root = tmp_path / "db"
    make_synthetic_db(root, 8)
    return root


# --- the label page --------------------------------------------------------------------------


async def test_keys_answer_and_next_pair_is_selected(label_app, db: Path) -> None:
    async with label_app("-d", str(db), "--pairs", "6") as user:
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        answered = []
        for n, (key, value) in enumerate((("1", 1), ("2", 2), ("0", 0), ("x", CANT_TELL)), start=1):
            pair = shown_pair(user)
            await press(user, key)
            await until(lambda n=n: len(label_lines(db)) == n)
            await until(lambda p=pair: shown_pair(user) != p)  # the next pair came by itself
            answered.append((pair, value))
        lines = label_lines(db)
        assert [(x["sample1"], x["sample2"]) for x in lines] == [p for p, _ in answered]
        assert [x["label"] for x in lines] == [1, 2, 0, CANT_TELL]
        assert all(x["source"] == "human" and x["time"] > 0 for x in lines)
        assert len({pair_key(*p) for p, _ in answered}) == 4  # never the same pair twice
        await see(user, "4 answered in this tab")


async def test_buttons_undo_and_reanswer(label_app, db: Path) -> None:
    async with label_app("-d", str(db), "--pairs", "4") as user:
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        first = shown_pair(user)
        user.find(marker="answer-1").click()
        await until(lambda: len(label_lines(db)) == 1)
        await until(lambda: shown_pair(user) != first)
        await press(user, "u")
        await until(lambda: len(label_lines(db)) == 2)
        await until(lambda: shown_pair(user) == first)  # back on the undone pair
        assert label_lines(db)[1]["label"] == RETRACTED
        assert load_labels(db) == {}  # the answer is taken back, not just overwritten
        await see(user, "0 answered in this tab")
        user.find(marker="answer-2").click()
        await until(lambda: len(label_lines(db)) == 3)
        (lab,) = load_labels(db).values()
        assert (lab.sample1, lab.sample2, lab.label) == (*first, 2)
        await press(user, "u")
        await press(user, "u")  # nothing more to undo in this tab: no line, a notice
        await until(lambda: len(label_lines(db)) == 4)
        await see(user, "Nothing to undo in this tab")
        assert len(label_lines(db)) == 4


async def test_resample_offers_only_new_unlabeled_pairs(label_app, db: Path) -> None:
    async with label_app("-d", str(db), "--pairs", "5") as user:
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        before = list_texts(user, 5)
        await press(user, "1")
        await until(lambda: len(label_lines(db)) == 1)
        await press(user, "r")
        await see(user, "New list of 5 pairs")
        after = list_texts(user, 5)
        pairs = lambda texts: {pair_key(*t.split()[1:4:2]) for t in texts}  # noqa: E731
        assert not pairs(before) & pairs(after)
        labeled = set(load_labels(db))
        assert not pairs(after) & labeled


async def test_tabs_have_their_own_lists_and_skip_pairs_labeled_elsewhere(label_app, db: Path) -> None:
    async with label_app("-d", str(db), "--pairs", "6") as user:
        await user.open("/label")
        other = second_user()
        await other.open("/label")
        # Each tab encodes its own first clips: wait for both, not just the one opened last.
        await until(lambda: other.find(marker="clip-1").elements.pop().props.get("data-clip"))
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        with user:
            mine = {pair_key(*t.split()[1:4:2]) for t in list_texts(user, 6)}
        with other:
            theirs = {pair_key(*t.split()[1:4:2]) for t in list_texts(other, 6)}
        assert len(mine) == len(theirs) == 6 and not mine & theirs  # two tabs never get the same pair
        # An answer in the other tab goes to the file; this tab's list is untouched.
        await press(other, "2")
        await until(lambda: len(label_lines(db)) == 1)
        await see(user, "0 answered in this tab")
        # A label written meanwhile by another process for this tab's next pair: it is skipped.
        with user:
            current = shown_pair(user)
            texts = list_texts(user, 6)
        nxt = next(tuple(t.split()[1:4:2]) for t in texts if pair_key(*t.split()[1:4:2]) != pair_key(*current))
        append_labels(db, [Label(nxt[0], nxt[1], 1, source="oracle")])
        await press(user, "0")
        await until(lambda: len(label_lines(db)) == 3)
        with user:
            await until(lambda: shown_pair(user) != current)  # the next pair came by itself
            assert pair_key(*shown_pair(user)) != pair_key(*nxt)
        await see(user, "labeled elsewhere")


async def test_list_runs_out_then_db_runs_out(label_app, tmp_path: Path) -> None:
    db = tmp_path / "small"
    make_synthetic_db(db, 3)  # 3 pairs in all
    async with label_app("-d", str(db), "--pairs", "2") as user:
        await user.open("/label")
        for n in range(1, 4):
            await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
            await press(user, "1")
            await until(lambda n=n: len(label_lines(db)) == n)
        await see(user, "No pairs to label.")
        await see(user, "every pair of the 3 segments")
        assert len(load_labels(db)) == 3


@pytest.mark.parametrize("n_segments", [0, 1])
async def test_db_too_small_is_explained(label_app, tmp_path: Path, n_segments: int) -> None:
    db = tmp_path / "tiny"
    db.mkdir()
    make_synthetic_db(db, n_segments)
    async with label_app("-d", str(db)) as user:
        await user.open("/label")
        await see(user, "No pairs to label.")
        await see(user, "no segments yet" if n_segments == 0 else "at least 2 readable ones are needed")
        await user.open("/")
        await see(user, f"{n_segments} segments")


async def test_unreadable_segment_is_skipped_with_a_notice(label_app, tmp_path: Path) -> None:
    db = tmp_path / "db"
    rels = make_synthetic_db(db, 3)
    (db / rels[0]).write_bytes(b"not a segment")
    async with label_app("-d", str(db), "--pairs", "3") as user:
        await user.open("/label")
        await see(user, "skipped unreadable segment")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        assert rels[0] not in shown_pair(user)
        await press(user, "1")  # the server keeps working
        await until(lambda: len(label_lines(db)) == 1)
        assert rels[0] not in (label_lines(db)[0]["sample1"], label_lines(db)[0]["sample2"])
        await user.open("/")
        await see(user, "1 unreadable")


async def test_hostile_db_is_served_without_a_crash(label_app, tmp_path: Path) -> None:
    """Crafted segments (object dtype, negative offset, memory bomb), a FIFO, a link to /dev/zero and
    bad label lines: the page lists only real segments, skips the crafted ones, and keeps working."""
    import os

    from test_hostile_db import crafted_files

    db = tmp_path / "db"
    rels = make_synthetic_db(db, 4)
    crafted = {k: v for k, v in crafted_files().items() if "object dtype" in k or "offset" in k or "bomb" in k}
    (db / "05").mkdir()
    for k, data in enumerate(crafted.values()):
        (db / "05" / f"{k + 1:08d}.dat").write_bytes(data)
    os.mkfifo(db / "00" / "00000777.dat")
    os.symlink("/dev/zero", db / "00" / "00000778.dat")
    good = {"sample1": rels[0], "sample2": rels[1], "label": 1, "source": "human"}
    (db / "labels.jsonl").write_text(
        "\n".join(
            [
                json.dumps(dict(good, time=1e20)),  # finite, but past the calendar: shown as "?"
                json.dumps(dict(good, sample2=rels[2], time="yesterday")),
                json.dumps(good).replace('"label": 1', '"label": 1e999'),
            ]
        )
        + "\n"
    )
    async with label_app("-d", str(db), "--pairs", "12") as user:
        await user.open("/")
        await see(user, "skipping a bad line")
        await user.open("/labels")
        await see(user, "1 labels")
        await user.open("/label")
        for _ in range(3):
            await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
            assert not any(rel.startswith("05/") for rel in shown_pair(user))
            n = len(label_lines(db))
            await press(user, "1")
            await until(lambda n=n: len(label_lines(db)) == n + 1)
        await user.open("/")
        await see(user, "unreadable)")  # "N segments (K unreadable)": the crafted ones tried so far


async def test_pause_and_speed_keys(label_app, db: Path) -> None:
    async with label_app("-d", str(db)) as user:
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        await press(user, " ")
        await see(user, "play (space)")
        await press(user, "+")
        (speed,) = user.find(marker="speed").elements
        await until(lambda: speed.value == 2.0)
        await press(user, "-")
        await press(user, "-")
        await until(lambda: speed.value == 0.5)


async def test_torn_last_line_is_recovered_with_a_warning(label_app, db: Path) -> None:
    (db / "labels.jsonl").write_text(
        '{"sample1": "00/00000012.dat", "sample2": "01/00000012.dat", "label": 1, "source": "human"}\n'
        '{"sample1": "00/00000024.dat", "sampl'
    )
    async with label_app("-d", str(db)) as user:
        await user.open("/")
        await see(user, "torn last line")
        await see(user, "1 labels")
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        await press(user, "2")
        await until(lambda: len(load_labels(db)) == 2)  # the old label survives, the new line is whole


# --- Overview and Existing labels ------------------------------------------------------------


async def test_overview_counts_by_answer_and_source(label_app, db: Path) -> None:
    segs = sorted(p.relative_to(db).as_posix() for p in db.glob("*/*.dat"))
    append_labels(
        db,
        [
            Label(segs[0], segs[1], 1, source="human"),
            Label(segs[0], segs[2], 2, source="oracle"),
            Label(segs[1], segs[2], CANT_TELL, source="human"),
        ],
    )
    async with label_app("-d", str(db)) as user:
        await user.open("/")
        await see(user, "8 segments")
        await see(user, "3 labels — #1 better: 1, equal: 0, #2 better: 1, can't tell: 1")
        await see(user, "by source — human: 2, oracle: 1")
        await see(user, "5 segments no label has touched yet")
        await see(user, "25 unlabeled pairs left")


async def test_existing_labels_filter_and_change(label_app, db: Path) -> None:
    segs = sorted(p.relative_to(db).as_posix() for p in db.glob("*/*.dat"))
    append_labels(
        db,
        [
            Label(segs[0], segs[1], 1, time=1.0, source="oracle"),
            Label(segs[2], segs[3], 0, time=2.0, source="human"),
            Label(segs[4], segs[5], 2, time=3.0, source="oracle"),
        ],
    )
    async with label_app("-d", str(db)) as user:
        await user.open("/labels")
        await see(user, "3 labels")
        user.find(marker="filter-source").elements.pop().set_value("oracle")
        await see(user, "2 labels")
        user.find(marker="filter-answer").elements.pop().set_value("2")
        await see(user, "1 labels")
        user.find(marker="edit-0-x").click()  # change segs[4] vs segs[5] to can't tell
        await until(lambda: load_labels(db)[pair_key(segs[4], segs[5])].label == CANT_TELL)
        changed = read_label_log(db)[-1]
        assert changed.source == "human" and changed.extra.get("edited") is True
        await see(user, "0 labels")  # it no longer matches "oracle, #2 better"
        user.find(marker="filter-source").elements.pop().set_value("all")
        user.find(marker="filter-answer").elements.pop().set_value("all")
        await see(user, "3 labels")


async def test_existing_labels_pages_go_newest_first_over_every_db(label_app, tmp_path: Path) -> None:
    """A page of Existing labels comes from the kept order (item 11 of audit 4): newest first over
    both DBs, equal times in DB order, the last page partly filled."""
    a, b = tmp_path / "a", tmp_path / "b"
    segs_a, segs_b = make_synthetic_db(a, 9), make_synthetic_db(b, 3)
    pairs_a = [(x, y) for i, x in enumerate(segs_a) for y in segs_a[i + 1 :]][:27]
    append_labels(a, [Label(x, y, 1, time=float(t), source="human") for t, (x, y) in enumerate(pairs_a, 1)])
    append_labels(b, [Label(segs_b[0], segs_b[1], 2, time=27.0), Label(segs_b[0], segs_b[2], 0, time=0.5)])

    def rows(n: int) -> list[str]:
        found = [user.find(marker=f"label-row-{k}").elements.pop().descendants() for k in range(n)]
        return [next(el.text for el in row if isinstance(el, ui.label)) for row in found]

    name = {str(a): pairs_a, str(b): [(segs_b[0], segs_b[1]), (segs_b[0], segs_b[2])]}
    row = {f"{d} · {x} vs {y}": (d, i) for d, ps in name.items() for i, (x, y) in enumerate(ps)}
    async with label_app("-d", str(a), "-d", str(b)) as user:
        await user.open("/labels")
        await see(user, "29 labels")
        assert [row[r] for r in rows(3)] == [(str(a), 26), (str(b), 0), (str(a), 25)]
        first = rows(1)
        user.find(marker="labels-pager").elements.pop().set_value(2)
        await until(lambda: rows(1) != first)
        assert [row[r] for r in rows(4)] == [(str(a), 2), (str(a), 1), (str(a), 0), (str(b), 1)]
        await user.should_not_see(marker="label-row-4")


async def test_navigation_keeps_the_tab_list(label_app, db: Path) -> None:
    async with label_app("-d", str(db), "--pairs", "4") as user:
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        before = list_texts(user, 4)
        user.find(marker="nav-overview").click()
        await see(user, "unlabeled pairs left")
        user.find(marker="nav-label").click()
        await see(user, marker="pair-3")
        assert list_texts(user, 4) == before


# --- what the server serves ------------------------------------------------------------------


async def test_server_serves_clips_of_db_segments_only(label_app, db: Path, tmp_path: Path) -> None:
    segs = sorted(p.relative_to(db).as_posix() for p in db.glob("*/*.dat"))
    append_labels(db, [Label(segs[0], segs[1], 1)])  # a label the server must not hand out as a file
    rel = segs[0]
    env, name = rel.split("/")
    before = sorted(p for p in db.rglob("*"))
    async with label_app("-d", str(db)) as user:
        c = user.http_client
        r = await c.get(f"/clip/0/{env}/{name.removesuffix('.dat')}.mp4")
        assert r.status_code == 200 and r.headers["content-type"] == "video/mp4" and r.content[4:8] == b"ftyp"
        for bad in (
            f"/clip/1/{env}/{name}",  # no such DB
            f"/clip/0/{env}/99999999.mp4",  # no such segment
            f"/clip/0/{env}/{name}",  # not a clip name
            "/clip/0/../labels.mp4",
            f"/clip/0/{env}/..%2F..%2Fdb%2Flabels.mp4",
        ):
            r = await c.get(bad)
            assert r.status_code == 404 or "not found" in r.text, bad
        r = await c.get("/labels.jsonl")
        assert "sample1" not in r.text
    assert sorted(p for p in db.rglob("*")) == before  # nothing written into the DB
    assert list((tmp_path / "clips").glob("*/*.mp4"))  # the clip cache is outside it


async def test_token_is_asked_once_per_browser(label_app, db: Path) -> None:
    token = "s3cret-token"
    async with label_app("-d", str(db), "--token", token) as user:
        c = user.http_client
        r = await c.get("/label", headers={"accept": "text/html"})
        assert r.status_code == 401 and 'name="token"' in r.text
        rel = sorted(p.relative_to(db).as_posix() for p in db.glob("*/*.dat"))[0]
        r = await c.get(f"/clip/0/{rel.removesuffix('.dat')}.mp4")
        assert r.status_code == 401
        r = await c.post("/login", data={"token": "wrong-token", "next": "/label"})
        assert r.status_code == 401 and "Wrong token" in r.text
        r = await c.post("/login", data={"token": token, "next": "https://evil.example/"})
        assert r.status_code == 303 and r.headers["location"] == "/"  # never off-site
        assert "rlhf_label_auth_8080" in c.cookies and token not in c.cookies["rlhf_label_auth_8080"]  # --port's
        await user.open("/label")  # the cookie lets this browser in from now on
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        other = second_user()  # another browser has to give the token itself
        r = await other.http_client.get("/label")
        assert r.status_code == 401


# --- the command line ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["-d", "{tmp}/missing"], "not found"),
        (["-d", "{db}", "--host", "0.0.0.0"], "refusing to listen on 0.0.0.0 without a token"),
        (["-d", "{db}", "--host", "192.168.1.5", "--port", "9000"], "ssh -L 9000:127.0.0.1:9000"),
        (["-d", "{db}", "--pairs", "0"], "--pairs must be between 1 and"),
        (["-d", "{db}", "--token", "short"], "--token must have at least 8 characters"),
        (["-d", "{db}", "--port", "70000"], "--port must be between"),
        (["-d", "{db}", "--fps", "0"], "--fps must be in"),
        (["-d", "{db}", "-d", "{db}"], "is given twice"),
        (["-d", "{db}", "--cache-dir", "{db}/.clips"], "is inside the DB"),
        (["-d", "{db}", "--oracle", "0"], "--oracle must be at least 1"),
        (["-d", "{db}/00/00000012.dat"], "is not a directory"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, db: Path, tmp_path: Path, capsys) -> None:
    argv = [a.format(tmp=tmp_path, db=db) for a in args]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "args, message",
    [
        (["-d", "{db}", "--seed", "-1"], f"--seed must be in 0..{MAX_SEED}"),
        (["-d", "{db}", "--seed", str(MAX_SEED + 1)], f"--seed must be in 0..{MAX_SEED}"),
        (["-d", "{db}", "--oracle", "3", "--seed", "-1"], "--seed must be in"),
        (["-d", "{db}", "--seed", "abc"], "argument --seed: invalid int value"),
        (["-d", "{db}", "--port", "0"], "--port must be between"),
        (["-d", "{db}", "--port", "-5"], "--port must be between"),
        (["-d", "{db}", "--pairs", str(10**9)], "--pairs must be between 1 and"),
        (["-d", "{db}", "--oracle", str(10**12)], "--oracle must be at most"),
        (["-d", "{db}", "--pool", "0"], "--pool must be at least 1"),
        (["-d", "{db}", "--fps", "nan"], "--fps must be in"),
        (["-d", "{db}", "--fps", "inf"], "--fps must be in"),
        (["-d", "{db}", "--teacher-noise", "nan"], "--teacher-noise must be in"),
        (["-d", "{db}", "--control-rate", "nan"], "--control-rate must be in"),
        (["-d", "{db}", "--cache-dir", "{db}/00/00000012.dat"], "--cache-dir"),
        (["-d", "{db}", "--cache-dir", "{tmp}/afile"], "is a file, not a directory"),
        (["-d", "{db}", "--cache-dir", "/proc/x"], "--cache-dir /proc/x cannot be used"),
        (["-d", "{db}", "--token-file", "{tmp}/missing"], "cannot read --token-file"),
        (["-d", "{db}", "--token-file", "{tmp}"], "cannot read --token-file"),
        (["-d", "{db}", "--reward", "{tmp}"], "no such file"),
        (["-d", "{db}", "--no-token", "--token", "long-enough-token"], "contradict"),
        (["-d", "{db}", "--no-token", "--host", "0.0.0.0"], "without a token"),
        (["-d", "{db}", "--teacher", "nobody"], "argument --teacher: invalid choice"),
        (["-d"], "argument -d/--db: expected one argument"),
        ([], "the following arguments are required: -d/--db"),
        (["-d", ""], "-d/--db: an empty path"),
        (["-d", "{db}", "--cache-dir", ""], "argument --cache-dir: an empty path"),
        (["-d", "{db}", "--fps", "1e-300"], "--fps must be in [0.5, 120]"),
        (["-d", "{db}", "--host", ""], "--host must be an address or a host name"),
        (["-d", "{db}", "--public-host", ""], "--public-host must be a host name"),
        (["-d", "{db}", "--token", "t" * 2000], "at most 1024 characters"),
    ],
)
def test_every_bad_flag_value_is_one_line_and_exit_2(args, message, db: Path, tmp_path: Path, capsys) -> None:
    """Issue 24, Low 4: negative or huge seeds, ports, counts, NaN, a file or /proc as a directory,
    argparse's own errors: each one line ``error: ...`` and exit 2, never a traceback or usage block."""
    (tmp_path / "afile").write_text("x")
    argv = [a.format(tmp=tmp_path, db=db) for a in args]
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "afile").is_dir() and not (db / "labels.jsonl").exists()


def test_port_in_use_is_one_line_and_exit_2(db: Path, tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = subprocess.run(
            [sys.executable, str(MAIN), "-d", str(db), "--port", str(port), "--cache-dir", str(tmp_path / "c")],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
    assert p.returncode == 2
    assert p.stderr.startswith("error: cannot listen on") and p.stderr.count("\n") == 1, p.stderr


@pytest.mark.parametrize("extra", [[], ["--oracle", "5"]], ids=["page", "oracle"])
def test_a_retired_sampling_mode_is_one_line_exit_2_naming_its_last_commit(extra, db: Path, tmp_path: Path) -> None:
    """``--sampling gauge`` (docs/reference.md, "Retired flags") is refused by 02_label_ui.py in one
    line, exit 2, before a label is written or a server starts: it names the last commit that had
    the mode (a real commit of this repository, whose lib/label_ui/sampling.py still lists it) and where
    its figures are."""
    argv = ["-d", str(db), "--cache-dir", str(tmp_path / "c"), "--sampling", "gauge", *extra]
    r = subprocess.run([sys.executable, str(MAIN), *argv], capture_output=True, text=True, timeout=60, cwd=ROOT)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.stdout, r.stderr)
    assert lines[0].startswith("error: --sampling gauge was retired after commit ") and "docs/results.md" in lines[0]
    assert not (db / "labels.jsonl").exists()
    commit = re.search(r"after commit ([0-9a-f]{7,40}):", lines[0]).group(1)
    shown = subprocess.run(["git", "show", f"{commit}:lib/sampling.py"], cwd=ROOT, capture_output=True, text=True)
    if shown.returncode != 0 and not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the commit cannot be looked up")
    assert shown.returncode == 0 and '"rare", "gauge")' in shown.stdout, shown.stderr


def test_token_from_environment(db: Path) -> None:
    from lib.label_ui.config import parse_label_config

    cfg = parse_label_config(["-d", str(db), "--host", "0.0.0.0"], environ={"RLHF_LABEL_TOKEN": "from-the-env"})
    assert cfg.token == "from-the-env" and cfg.host == "0.0.0.0"


def test_token_from_a_file_and_a_warning_for_the_command_line(db: Path, tmp_path: Path, capsys) -> None:
    from lib.label_ui.config import parse_label_config

    (tmp_path / "token").write_text("from-a-file-123\nignored second line\n")
    cfg = parse_label_config(["-d", str(db), "--host", "0.0.0.0", "--token-file", str(tmp_path / "token")], environ={})
    assert cfg.token == "from-a-file-123" and capsys.readouterr().err == ""
    cfg = parse_label_config(["-d", str(db), "--token", "on-the-command-line"], environ={})
    assert cfg.token == "on-the-command-line"
    err = capsys.readouterr().err
    assert err.startswith("warning: --token is visible to every user") and err.count("\n") == 1


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_labels_file_that_is_not_a_plain_file_is_refused(db: Path, tmp_path: Path, capsys, kind: str) -> None:
    import os

    target = tmp_path / "profile"
    target.write_text("# a shell start-up file\n")
    if kind == "symlink":
        os.symlink(target, db / "labels.jsonl")
    else:
        os.mkfifo(db / "labels.jsonl")
    for extra in ([], ["--oracle", "3"]):
        with pytest.raises(SystemExit) as e:
            main(["-d", str(db), "--cache-dir", str(tmp_path / "c"), *extra])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "labels.jsonl is" in err and err.count("\n") == 1, err
    assert target.read_text() == "# a shell start-up file\n"


# --- the reward model's view (--reward) ------------------------------------------------------

# per-step prediction of each action under action_model: segment k always takes action k
MODEL_VALUES = {0: 0.0, 1: 0.1, 2: 0.5, 3: 1.0, 4: 2.0}
MODEL_T = 10


@pytest.fixture
def model_db(tmp_path: Path) -> tuple[Path, list[str], Path]:
    root = tmp_path / "mdb"
    segs = write_action_db(root, [(a, float(a)) for a in MODEL_VALUES], MODEL_T, 64)
    return root, segs, action_model(64, tmp_path / "model.pt", [MODEL_VALUES])


def model_p(segs: list[str], a: str, b: str) -> float:
    """P(a better) under the action model: sigmoid of the predicted return difference."""
    ra, rb = (MODEL_T * MODEL_VALUES[segs.index(s)] for s in (a, b))
    return 1.0 / (1.0 + math.exp(-(ra - rb)))


async def test_label_page_shows_the_model_view(label_app, model_db) -> None:
    db, segs, model = model_db
    async with label_app("-d", str(db), "--reward", str(model), "--sampling", "uncertain") as user:
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        a, b = shown_pair(user)
        # uncertain: the first pair is the closest one, segments 0 and 1 (returns 0 and 1)
        assert pair_key(a, b) == pair_key(segs[0], segs[1])
        await see(user, f"reward model: P(#1 better) = {model_p(segs, a, b):.2f}")
        for k, rel in ((1, a), (2, b)):
            (plot,) = user.find(marker=f"model-plot-{k}").elements
            svg = plot.content
            (vid,) = user.find(marker=f"clip-{k}").elements
            assert f'data-plot-for="{vid.html_id}"' in svg and f'data-steps="{MODEL_T}"' in svg
            points = re.search(r'<polyline points="([^"]+)"', svg).group(1).split()
            assert len(points) == MODEL_T
            # both clips on one scale: the higher predicting clip (segment 1) is at the top
            ys = {float(pt.split(",")[1]) for pt in points}
            assert ys == ({2.0} if rel == segs[1] else {46.0})
        await press(user, "1")
        await until(lambda: shown_pair(user) != (a, b))
        a2, b2 = shown_pair(user)
        await see(user, f"reward model: P(#1 better) = {model_p(segs, a2, b2):.2f}")


async def test_model_vs_you_lists_contradicted_labels_most_confident_first(label_app, model_db) -> None:
    db, segs, model = model_db
    append_labels(
        db,
        [
            Label(segs[0], segs[4], 1, time=1.0, source="human"),  # model: #2 by 20 -> contradicted, most sure
            Label(segs[1], segs[2], 1, time=2.0, source="human"),  # model: #2 by 4 -> contradicted
            Label(segs[3], segs[0], 1, time=3.0, source="human"),  # model agrees
            Label(segs[2], segs[3], 0, time=4.0, source="human"),  # a tie: not a preference
        ],
    )
    async with label_app("-d", str(db), "--reward", str(model)) as user:
        await user.open("/labels")
        await see(user, "4 labels")
        user.find(marker="filter-order").elements.pop().set_value("model")
        await see(user, "2 labels")
        rows = [
            " ".join(
                el.text
                for el in user.find(marker=f"label-row-{n}").elements.pop().descendants()
                if isinstance(el, ui.label)
            )
            for n in range(2)
        ]
        assert f"{segs[0]} vs {segs[4]}" in rows[0] and f"{segs[1]} vs {segs[2]}" in rows[1]
        await see(user, f"model P(#1) {model_p(segs, segs[1], segs[2]):.2f}")


async def test_control_pairs_come_back_swapped_and_never_change_a_label(label_app, db: Path) -> None:
    segs = sorted(p.relative_to(db).as_posix() for p in db.glob("*/*.dat"))
    done = [
        Label(segs[0], segs[1], 1, time=1.0, source="human", extra={"labeler": "ann"}),
        Label(segs[2], segs[3], 2, time=2.0, source="human", extra={"labeler": "ann"}),
        Label(segs[4], segs[5], 1, time=3.0, source="oracle"),
    ]  # not ann's: never a control
    append_labels(db, done)
    async with label_app("-d", str(db), "--pairs", "4", "--control-rate", "1", "--labeler", "ann") as user:
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        texts = list_texts(user, 6)  # 4 new pairs and both of ann's answered pairs, swapped
        assert sum(f"{segs[1]} vs {segs[0]}" in t for t in texts) == 1
        assert sum(f"{segs[3]} vs {segs[2]}" in t for t in texts) == 1
        assert not any(segs[4] in t and segs[5] in t for t in texts)
        answers = {pair_key(segs[0], segs[1]): "2", pair_key(segs[2], segs[3]): "2"}  # agree, contradict
        for k in range(6):
            a, b = shown_pair(user)
            n = len(label_lines(db))
            await press(user, answers.get(pair_key(a, b), "0"))
            await until(lambda n=n: len(label_lines(db)) == n + 1)
            if k < 5:
                await until(lambda p=(a, b): shown_pair(user) != p)
        controls = [x for x in label_lines(db) if x.get("control")]
        assert [(x["sample1"], x["sample2"]) for x in controls] == [(segs[1], segs[0]), (segs[3], segs[2])] or [
            (x["sample1"], x["sample2"]) for x in controls
        ] == [(segs[3], segs[2]), (segs[1], segs[0])]
        current = load_labels(db)
        assert current[pair_key(segs[0], segs[1])].label == 1 and current[pair_key(segs[2], segs[3])].label == 2
        await user.open("/")
        await see(user, marker="consistency-0")
        text = user.find(marker="consistency-0").elements.pop().text
        assert text == "consistency (pairs shown again, order swapped) — ann: 1/2 (50%)", text


# --- issue 24: the server under attack and under load ----------------------------------------


async def test_login_body_is_bounded_before_reading(label_app, db: Path) -> None:
    """Medium 3: a large POST to /login is refused (413) after at most the form's 4 KB, by its
    Content-Length before reading, and a chunked one stops being read past the bound."""
    token = "s3cret-token"
    async with label_app("-d", str(db), "--token", token) as user:
        c = user.http_client
        sent = 0

        async def endless() -> AsyncIterator[bytes]:  # 128 MB offered, no Content-Length
            nonlocal sent
            for _ in range(2048):
                sent += 1
                yield b"token=" + b"x" * 65536

        r = await c.post("/login", content=endless())
        assert r.status_code == 413
        assert sent <= 2, f"{sent} chunks of 64 KB were read"
        r = await c.post("/login", content=b"token=" + b"x" * 100_000)  # Content-Length over the bound
        assert r.status_code == 413
        r = await c.post("/login", data={"token": token, "next": "/label"})
        assert r.status_code == 303  # a real form still logs in


def test_a_token_is_made_by_default_and_no_token_opts_out(db: Path, capsys) -> None:
    """Medium 4: on the default loopback bind a token is required unless --no-token."""
    from lib.label_ui.config import parse_label_config

    a = parse_label_config(["-d", str(db)], environ={})
    b = parse_label_config(["-d", str(db)], environ={})
    assert a.host == "127.0.0.1" and a.token_generated and len(a.token) >= 32 and a.token != b.token
    none = parse_label_config(["-d", str(db), "--no-token"], environ={})
    assert none.token is None and not none.token_generated
    given = parse_label_config(["-d", str(db)], environ={"RLHF_LABEL_TOKEN": "from-the-env"})
    assert given.token == "from-the-env" and not given.token_generated
    oracle = parse_label_config(["-d", str(db), "--oracle", "3"], environ={})
    assert oracle.token is None  # no server, no token


async def test_the_default_token_guards_the_pages(label_app, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import secrets

    monkeypatch.setattr(secrets, "token_urlsafe", lambda *a: "made-at-start-0123456789")
    async with label_app("-d", str(db), default_token=True) as user:
        c = user.http_client
        r = await c.get("/label", headers={"accept": "text/html"})
        assert r.status_code == 401 and 'name="token"' in r.text
        r = await c.get("/label?token=made-at-start-0123456789")  # the printed link
        assert r.status_code == 303 and r.headers["location"] == "/label" and "rlhf_label_auth_8080" in c.cookies
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))


async def test_a_bare_get_reserves_no_pair(label_app, tmp_path: Path) -> None:
    """Medium 4: GET /label without JavaScript (no websocket) must not take pairs from people."""
    db = tmp_path / "small"
    make_synthetic_db(db, 3)  # 3 pairs in all
    async with label_app("-d", str(db), "--pairs", "3") as user:
        for _ in range(3):
            r = await user.http_client.get("/label")
            assert r.status_code == 200
        await asyncio.sleep(0.3)  # what the bare pages' builders would do, they have done
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        assert len({pair_key(*t.split()[1:4:2]) for t in list_texts(user, 3)}) == 3


async def test_overview_reads_only_new_label_lines_off_the_event_loop(
    label_app, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Low 2: after start-up the Overview never reads labels.jsonl whole, and what it reads (the
    appended lines) is read in a worker thread, not on the event loop; consistency stays right."""
    import threading

    import lib.store.labels
    from lib.label_ui.state import LabelIndex

    segs = sorted(p.relative_to(db).as_posix() for p in db.glob("*/*.dat"))
    pairs = [(a, b) for i, a in enumerate(segs) for b in segs[i + 1 :]]
    append_labels(db, [Label(a, b, 1, source="human", extra={"labeler": "ann"}) for a, b in pairs[:20]])
    whole, on_loop = [], []
    read_regular, refresh = lib.store.labels.read_regular, LabelIndex.refresh

    def spy_read(path, max_bytes):
        whole.append(str(path))
        return read_regular(path, max_bytes)

    def spy_refresh(self):
        if threading.current_thread() is threading.main_thread():
            on_loop.append("refresh")
        return refresh(self)

    async with label_app("-d", str(db)) as user:
        monkeypatch.setattr(lib.store.labels, "read_regular", spy_read)
        monkeypatch.setattr(LabelIndex, "refresh", spy_refresh)
        await user.open("/")
        await see(user, "20 labels")
        a, b = pairs[0]  # a control answer from another process: it agrees with ann's first answer
        append_labels(db, [Label(b, a, 2, source="human", extra={"labeler": "ann", "control": True})])
        append_labels(db, [Label(*pairs[20], 2, source="oracle")])
        await user.open("/")
        await see(user, "21 labels")
        await see(user, "consistency (pairs shown again, order swapped) — ann: 1/1 (100%)")
    assert whole == [] and on_loop == []


def test_origin_must_name_the_same_port() -> None:
    """Low 3: a page served on another local port is another site."""
    from lib.label_ui.auth import HostCheckMiddleware

    check = HostCheckMiddleware(None, {"127.0.0.1", "localhost", "::1"})

    def refused(host: str, origin: str) -> bool:
        return check.why_refused({"headers": [(b"host", host.encode()), (b"origin", origin.encode())]}) is not None

    assert not refused("127.0.0.1:8080", "http://127.0.0.1:8080")
    assert not refused("127.0.0.1:8080", "http://localhost:8080")
    assert not refused("[::1]:8080", "http://[::1]:8080")
    assert not refused("localhost", "http://localhost")  # no port: the scheme's default
    assert not refused("localhost:9000", "http://localhost:9000")  # ssh -L 9000:127.0.0.1:8080
    assert refused("127.0.0.1:8080", "http://127.0.0.1:9999")
    assert refused("127.0.0.1:8080", "http://localhost")
    assert refused("localhost", "http://localhost:3000")
    assert refused("localhost:8080", "http://localhost:99999")


async def test_a_page_on_another_port_gets_no_websocket(label_app, db: Path) -> None:
    async with label_app("-d", str(db)) as user:
        c = user.http_client
        sio = "/_nicegui_ws/socket.io/?EIO=4&transport=polling"
        for path in ("/label", sio):
            r = await c.get(path, headers={"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:9999"})
            assert r.status_code == 403 and "another port" in r.text, path
        r = await c.get("/label", headers={"host": "127.0.0.1:8080", "origin": "http://127.0.0.1:8080"})
        assert r.status_code == 200


async def test_login_attempts_are_rate_limited_per_address(label_app, db: Path) -> None:
    """Low 3: a few wrong tokens, then 429 (with Retry-After) for that address only, for a while."""
    token = "s3cret-token"
    async with label_app("-d", str(db), "--token", token) as user:
        c = user.http_client
        codes = [(await c.post("/login", data={"token": f"guess-{k}"})).status_code for k in range(8)]
        assert codes[:5] == [401] * 5 and codes[5:] == [429] * 3, codes
        r = await c.get("/label?token=guess-9")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert (await c.post("/login", data={"token": token})).status_code == 429  # not even looked at
        elsewhere = httpx.AsyncClient(
            transport=httpx.ASGITransport(core.app, client=("10.1.2.3", 5000)), base_url="http://test"
        )
        assert (await elsewhere.post("/login", data={"token": token})).status_code == 303
        await asyncio.sleep(1.1)  # one attempt a second comes back
        assert (await c.post("/login", data={"token": token})).status_code == 303


def test_a_hard_linked_labels_file_is_refused(db: Path, tmp_path: Path, capsys) -> None:
    """Low 5: labels.jsonl with another name (a hard link) would append into that file too."""
    import os

    other = tmp_path / "elsewhere.jsonl"
    other.write_text("# not a label file\n")
    os.link(other, db / "labels.jsonl")
    for extra in ([], ["--oracle", "3"]):
        with pytest.raises(SystemExit) as e:
            main(["-d", str(db), "--cache-dir", str(tmp_path / "c"), *extra])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "has 2 hard links" in err and err.count("\n") == 1, err
    assert other.read_text() == "# not a label file\n"


async def test_every_request_body_is_bounded(label_app, db: Path) -> None:
    """Medium 3, beyond /login: no route (socket.io's included) is handed a body over 1 MB."""
    async with label_app("-d", str(db)) as user:
        c = user.http_client
        for path in ("/_nicegui_ws/socket.io/?EIO=4&transport=polling", "/label", "/clip/0/00/00000012.mp4"):
            r = await c.post(path, content=b"x" * (2 << 20))
            assert r.status_code == 413, path


def test_pruning_the_clip_cache_deletes_only_its_own_clips(tmp_path: Path) -> None:
    """Low 4: a --cache-dir given by mistake (a directory of the user's videos) loses nothing."""
    import os

    from lib.label_ui.clips import prune_cache

    mine = tmp_path / "holiday" / "beach.mp4"
    mine.parent.mkdir()
    mine.write_bytes(b"v" * 4096)
    clip = tmp_path / "ab" / ("ab" + "0" * 38 + ".mp4")
    clip.parent.mkdir()
    clip.write_bytes(b"c" * 4096)
    os.utime(mine, (1, 1))  # the oldest: pruned first, were it a clip
    killed = clip.parent / ".tmp-abc123.mp4"  # an encode killed with its server
    killed.write_bytes(b"t" * 100)
    os.utime(killed, (1, 1))
    running = clip.parent / ".tmp-def456.mp4"  # an encode of a server running now
    running.write_bytes(b"t" * 100)
    assert prune_cache(tmp_path, max_bytes=1024, keep_bytes=0) == 2
    assert mine.exists() and not clip.exists() and not killed.exists() and running.exists()


def test_the_clip_cache_defaults_to_the_users_cache_directory_and_help_says_where(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --cache-dir the clips go to the user's cache directory ($XDG_CACHE_HOME, else
    ~/.cache, under rlhf-atari/clips), wherever the page is started from (was: the checkout's
    .cache/clips, the code's directory); --help names the rule and where it is now."""
    from lib.label_ui.config import build_parser, parse_label_config

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    argv = ["-d", str(db), "--no-token"]
    xdg = parse_label_config(argv, environ={"XDG_CACHE_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")})
    assert xdg.cache_dir == tmp_path / "xdg" / "rlhf-atari" / "clips" and xdg.cache_dir.is_dir()
    home = parse_label_config(argv, environ={"XDG_CACHE_HOME": "relative/ignored", "HOME": str(tmp_path / "home")})
    assert home.cache_dir == tmp_path / "home" / ".cache" / "rlhf-atari" / "clips" and home.cache_dir.is_dir()
    assert list(elsewhere.iterdir()) == []
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    text = " ".join(build_parser().format_help().split())
    assert "$XDG_CACHE_HOME" in text and f"{tmp_path / 'xdg' / 'rlhf-atari' / 'clips'}" in text.replace(" ", ""), text
