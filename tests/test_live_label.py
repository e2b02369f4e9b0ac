"""Live rounds, stage 2 (issue 31): the label page and the oracle pick up segments a recorder adds
while they run, ``--recent N`` draws from the newest segments only, and ``--oracle N --follow``
labels as clips appear, at a schedule, and stops cleanly on SIGINT / SIGTERM.

Real parts: SeaQuest segments recorded from the real emulator (``bench.dbs.make_atari_db``),
written into the DB the way a recorder writes them (``save_segment``: temp file, then a link to
the final name), the real ``02_label_ui.py`` as a subprocess, the page through NiceGUI's simulated
user (``tests/test_label_ui.py``'s ``label_app``)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from nicegui import ui
from test_label_ui import label_app, label_lines, list_texts, see, until  # noqa: F401 (label_app: a fixture)

from bench.dbs import make_atari_db, make_synthetic_db
from lib.core.errors import UserError
from lib.core.files import atomic_write
from lib.core.signals import SignalStop
from lib.label_ui.cli import main
from lib.label_ui.oracle import FollowSettings, OracleSettings, labels_due, oracle_follow, oracle_label_db
from lib.label_ui.sampling import SegmentLooks, recent_segments
from lib.store.labels import Label, append_labels, pair_key, parse_label_line, read_label_log
from lib.store.segment_writer import save_segment
from lib.store.segments import RACY_NS, SegmentWatch, load_segment

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "02_label_ui.py"


@pytest.fixture(scope="module")
def seaquest(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six real SeaQuest segments of 50 steps, two envs: 0N/00000050, 0N/00000100, 0N/00000150."""
    src = tmp_path_factory.mktemp("seaquest") / "db"
    make_atari_db(src, 6, t=50, n_envs=2, seed=0)
    return src


def db_of(seaquest: Path, dest: Path, steps: tuple[int, ...] = (50, 100)) -> Path:
    """A DB holding ``seaquest``'s segments of the given step counters (both envs)."""
    for env in ("00", "01"):
        (dest / env).mkdir(parents=True)
        for step in steps:
            shutil.copy(seaquest / env / f"{step:08d}.dat", dest / env / f"{step:08d}.dat")
    return dest


def record(db: Path, seaquest: Path, rel: str, env: int, step: int) -> str:
    """Write a copy of ``seaquest``'s segment ``rel`` into ``db`` as the recorder does (temp file,
    then the final name ``NN/SSSSSSSS.dat``); returns its name."""
    seg = dataclasses.replace(load_segment(seaquest / rel), env_index=env, step=step)
    return save_segment(db, seg, fsync=False).relative_to(db).as_posix()


def plant_partial_files(db: Path, seaquest: Path) -> tuple[str, str]:
    """What must never be labelled or shown: a whole segment still under a recorder's temp name,
    and a segment under its final name cut short (a copy that stopped halfway)."""
    data = (seaquest / "00/00000150.dat").read_bytes()
    (db / "00" / ".00009000.dat.a1b2c3.tmp").write_bytes(data)
    atomic_write(db / "01" / "00000150.dat", data[: len(data) // 2], fsync=False)
    return "00/00009000.dat", "01/00000150.dat"


class Stage2:
    """``02_label_ui.py`` as a process; its stdout read line by line by a thread, so a wait for a
    line that never comes ends in time."""

    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen(
            [sys.executable, str(MAIN), *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def read_until(self, needle: str, timeout: float = 60.0) -> list[str]:
        """stdout lines up to (and with) the first that holds ``needle``."""
        out: list[str] = []
        end = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(end - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"no {needle!r} in {timeout} s: {out}") from None
            if line is None:
                raise AssertionError(f"stdout ended before {needle!r}: {out}; stderr: {self.p.stderr.read()}")
            out.append(line)
            if needle in line:
                return out

    def finish(self, timeout: float = 60.0) -> tuple[int, list[str], str]:
        """Exit status, the rest of stdout, stderr."""
        try:
            rc = self.p.wait(timeout=timeout)
        finally:
            self.p.kill()
        rest = []
        while (line := self.lines.get(timeout=10)) is not None:
            rest.append(line)
        return rc, rest, self.p.stderr.read()


def whole_lines(db: Path) -> list[dict]:
    """Every line of labels.jsonl, each checked to be a whole label line."""
    data = (db / "labels.jsonl").read_bytes()
    assert data.endswith(b"\n"), "a torn last line"
    lines = data.decode().splitlines()
    for line in lines:
        parse_label_line(line)  # raises on a half line
    return [json.loads(x) for x in lines]


# --- the schedule and T -----------------------------------------------------------------------


def test_labels_due_constant_and_paper() -> None:
    assert [labels_due("constant", 10, t) for t in (0, 99, 100, 200, 5150)] == [0, 0, 1, 2, 51]
    assert labels_due("constant", 9, 3000) == 27  # 0.009 * 3000 is 26.999999999999996 in floats
    # paper: R/1000 * 5e6 * ln(1 + T/5e6): about R/1000 * T early on, half the rate at T = 5e6
    assert labels_due("paper", 1, 5_000_000) == math.floor(5000 * math.log(2)) == 3465
    assert labels_due("paper", 1, 100_000) == 99 and labels_due("constant", 1, 100_000) == 100
    late = labels_due("paper", 1, 5_100_000) - labels_due("paper", 1, 5_000_000)
    assert late in (49, 50, 51)  # the rate at T = 5e6: 0.5 labels / 1,000 steps
    with pytest.raises(ValueError, match="unknown schedule"):
        labels_due("weekly", 1, 10)


def test_watch_lists_only_whole_new_segments_and_counts_agent_steps(seaquest: Path, tmp_path: Path) -> None:
    """T is the sum over env dirs of their largest step counter of a readable segment (the cut one
    is said once, left out, and env 01 counts its 100 steps); temp files never show; a directory
    that did not change is not listed again; a name that is not a segment is said once."""
    import lib.store.segments

    db = db_of(seaquest, tmp_path / "db")
    said: list[str] = []
    watch = SegmentWatch(db, warn=said.append)
    assert watch.segments == ["00/00000050.dat", "00/00000100.dat", "01/00000050.dat", "01/00000100.dat"]
    assert watch.agent_steps() == 200
    assert watch.refresh() == []
    temp, cut = plant_partial_files(db, seaquest)
    (db / "01" / "notes.txt").write_text("x")
    new = record(db, seaquest, "00/00000150.dat", 0, 5000)
    assert watch.refresh() == [new, cut]  # the temp file is not a segment; the cut one is named like one
    assert watch.agent_steps() == 5000 + 100 and cut not in watch.segments  # the cut one does not read
    assert len(said) == 2 and "01/notes.txt" in said[0] and cut in said[1]
    watch.refresh()
    assert watch.agent_steps() == 5000 + 100 and len(said) == 2  # said once
    # Directories whose time is older than RACY_NS are not listed again until they change.
    past = time.time_ns() - 10 * RACY_NS
    for env in ("00", "01"):
        os.utime(db / env, ns=(past, past))
    watch.refresh()  # lists them once more (they were racy), now they are settled
    listed: list[str] = []
    scan = lib.store.segments._scan_env_dir
    try:
        lib.store.segments._scan_env_dir = lambda d, *a: (listed.append(d.name), scan(d, *a))[1]
        assert watch.refresh() == [] and listed == []
        newer = record(db, seaquest, "01/00000050.dat", 1, 6000)
        assert watch.refresh() == [newer] and listed == ["01"]
    finally:
        lib.store.segments._scan_env_dir = scan
    assert temp not in watch.segments and watch.agent_steps() == 5000 + 6000


def test_watch_lists_a_racy_directory_again(seaquest: Path, tmp_path: Path) -> None:
    """A segment renamed into a directory in the same clock tick as the last scan leaves the
    directory's time as it was: a directory changed less than RACY_NS before a scan is listed
    again at the next one (played here by setting its time back to what the scan saw)."""
    db = db_of(seaquest, tmp_path / "db")
    watch = SegmentWatch(db)
    seen = (db / "00").stat().st_mtime_ns
    new = record(db, seaquest, "00/00000150.dat", 0, 5000)
    os.utime(db / "00", ns=(seen, seen))
    assert watch.refresh() == [new]


def test_rare_looks_fold_new_segments_without_reading_old_ones(seaquest: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lib.label_ui.sampling

    rels = sorted(p.relative_to(seaquest).as_posix() for p in seaquest.glob("*/*.dat"))
    reads: list[str] = []
    read = lib.label_ui.sampling.read_segment
    monkeypatch.setattr(
        lib.label_ui.sampling, "read_segment", lambda root, rel: (reads.append(rel), read(root, rel))[1]
    )
    looks = SegmentLooks(seaquest)
    looks.rarity(rels[:4])
    assert sorted(reads) == rels[:4]
    reads.clear()
    folded = looks.rarity(rels)
    assert sorted(reads) == rels[4:]  # only the new ones are read
    fresh = SegmentLooks(seaquest).rarity(rels)
    assert folded.keys() == fresh.keys()
    assert np.allclose([folded[r] for r in rels], [fresh[r] for r in rels], rtol=1e-9, atol=1e-9)
    part = looks.rarity(rels[2:5])  # a window: rarity among those three only
    assert np.allclose([part[r] for r in rels[2:5]], [SegmentLooks(seaquest).rarity(rels[2:5])[r] for r in rels[2:5]])


# --- --recent N ---------------------------------------------------------------------------------


def test_recent_orders_by_step_counter_then_env() -> None:
    segs = ["00/00000300.dat", "00/00000400.dat", "01/00000400.dat", "02/00000100.dat", "10/00000400.dat"]
    assert recent_segments(segs, 2) == ["01/00000400.dat", "10/00000400.dat"]
    assert recent_segments(segs, 4) == segs[:3] + segs[4:]
    assert recent_segments(segs, 0) == segs and recent_segments(segs, 9) == segs


@pytest.mark.parametrize("sampling", ["random", "rare"])
def test_oracle_recent_labels_only_the_newest(tmp_path: Path, sampling: str) -> None:
    db = tmp_path / "db"
    segs = make_synthetic_db(db, 12, seed=1)  # 4 envs, steps 12, 24, 36
    newest = {s for s in segs if s.endswith("00000036.dat")}
    # Labels of old pairs do not use up the window's pairs.
    old = [s for s in segs if s not in newest]
    append_labels(db, [Label(a, b, 1, source="human") for i, a in enumerate(old) for b in old[i + 1 :]][:20])
    s = oracle_label_db(db, 10, seed=0, settings=OracleSettings(sampling=sampling, recent=4))
    assert s.labeled == 6  # every pair of the 4 newest, and no other
    mine = [lab for lab in read_label_log(db) if lab.source == "oracle"]
    assert len(mine) == 6 and all({lab.sample1, lab.sample2} <= newest for lab in mine)


def test_labels_within_a_window_are_counted_either_way(tmp_path: Path) -> None:
    """``LabelIndex.count_within`` walks the labels or the window's pairs, whichever is shorter."""
    from lib.label_ui.state import LabelIndex

    db = tmp_path / "db"
    segs = make_synthetic_db(db, 12, seed=1)
    append_labels(db, [Label(a, b, 1, source="human") for i, a in enumerate(segs[:7]) for b in segs[i + 1 : 7]])
    index = LabelIndex(db)  # 21 labels, all among the first 7 segments
    assert index.count_within(segs[:4]) == 6  # 6 pairs < 21 labels: a walk over the pairs
    assert index.count_within(segs[5:10]) == 1  # 10 pairs: over the pairs; only (5, 6) is labelled
    assert index.count_within(segs) == 21  # 66 pairs > 21 labels: a walk over the labels


async def test_page_recent_lists_only_pairs_of_the_newest(label_app, tmp_path: Path) -> None:  # noqa: F811
    db = tmp_path / "db"
    segs = make_synthetic_db(db, 12, seed=1)
    newest = sorted(s for s in segs if s.endswith("00000036.dat"))
    old = [s for s in segs if s not in newest]
    labels = [Label(a, b, 1, source="human") for i, a in enumerate(old) for b in old[i + 1 :]][:20]
    append_labels(db, [*labels, Label(newest[0], newest[1], 2, source="human")])  # 5 pairs of the 4 left
    async with label_app("-d", str(db), "--recent", "4", "--pairs", "10", "--control-rate", "0") as user:
        await user.open("/label")
        await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
        texts = list_texts(user, 5)
        assert all(set(t.split()[1:4:2]) <= set(newest) for t in texts), texts
        keys = {pair_key(*t.split()[1:4:2]) for t in texts}
        assert len(keys) == 5 and pair_key(newest[0], newest[1]) not in keys
        await user.should_not_see(marker="pair-5")  # 5 pairs left in the window, no more
        await user.open("/")
        await see(user, "pairs from the 4 newest (--recent)")
        await see(user, "unlabeled pairs left")
        texts = [el.text for el in user.find(ui.label).elements]
        assert "5 unlabeled pairs left" in texts, texts  # the window's pairs, not the DB's 66 - 21


# --- the page picks up new segments -------------------------------------------------------------


async def test_page_shows_a_segment_recorded_while_it_runs(label_app, seaquest: Path, tmp_path: Path) -> None:  # noqa: F811
    """Every pair of the first 4 segments is labelled; then a recorder adds one segment, one that is
    still a temp file and one cut short: the Overview counts the two with final names, the next
    list pairs the new one with the old ones, the cut one is skipped with a notice, never
    labelled, and the temp file never shows."""
    db = db_of(seaquest, tmp_path / "db")
    old = sorted(p.relative_to(db).as_posix() for p in db.glob("*/*.dat"))
    append_labels(db, [Label(a, b, 1, source="oracle") for i, a in enumerate(old) for b in old[i + 1 :]])
    async with label_app("-d", str(db), "--pairs", "10", "--control-rate", "0") as user:
        await user.open("/")
        await see(user, "4 segments")
        temp, cut = plant_partial_files(db, seaquest)
        new = record(db, seaquest, "00/00000150.dat", 0, 5000)
        await user.open("/")
        await see(user, "6 segments")  # 4 + the new one + the cut one; not the temp file
        await user.open("/label")
        await see(user, "skipped unreadable segment")
        for n in range(1, 5):  # the new segment with each of the 4 old ones
            await until(lambda: user.find(marker="clip-1").elements.pop().props.get("data-clip"))
            user.find(marker="answer-1").click()
            await until(lambda n=n: len(label_lines(db)) == 6 + n)
        await see(user, "No pairs to label.")
        fresh = label_lines(db)[6:]
        assert {pair_key(x["sample1"], x["sample2"]) for x in fresh} == {pair_key(new, o) for o in old}
        assert not any({cut, temp} & {x["sample1"], x["sample2"]} for x in label_lines(db))
        await user.open("/")
        await see(user, "6 segments (1 unreadable)")


def test_a_list_prepared_before_new_segments_came_is_made_again(seaquest: Path, tmp_path: Path) -> None:
    """Near the end of a list the tab prepares the next one (to prefetch its clips); when a rescan
    finds new segments meanwhile, the next list is picked again, so it can hold them."""
    from lib.label_ui.state import AppState, DbState, TabSession

    db = db_of(seaquest, tmp_path / "db")
    app = AppState([DbState.open(0, db)], pairs=3, seed=0)
    tab = TabSession(app, "tab")
    assert tab.resample() == 3
    tab.answer(1)
    tab.answer(1)
    assert tab.upcoming() and tab.prepared is not None  # the next list, prepared at the last pair
    new = record(db, seaquest, "00/00000150.dat", 0, 5000)
    app.rescan()
    old = [s for s in app.dbs[0].segments if s != new]
    append_labels(db, [Label(a, b, 1, source="oracle") for i, a in enumerate(old) for b in old[i + 1 :]])
    app.dbs[0].labels.refresh()
    assert tab.resample() == 3
    assert all(new in (it.a, it.b) for it in tab.items)


def test_recent_window_moves_on_and_the_next_lists_come_from_it(seaquest: Path, tmp_path: Path) -> None:
    """--recent 4 and lists of 3: after the first list, four newer segments come; the next two lists
    are of them (its 6 pairs: 3 and 3), though the tab was given (and the server holds reserved)
    pairs outside the new window. What is left is counted within the window (was: the pairs given
    before counted against the window's 6 pairs, and the third list was empty: "No unlabeled pairs
    left" with 3 free pairs)."""
    from lib.label_ui.state import AppState, DbState, TabSession

    db = db_of(seaquest, tmp_path / "db")
    app = AppState([DbState.open(0, db, recent=4)], pairs=3, seed=0, control_rate=0)
    tab = TabSession(app, "tab")
    assert tab.resample() == 3
    first = {it.key for it in tab.items}
    tab.answer(1)
    new = [record(db, seaquest, "00/00000150.dat", env, 5000 + env) for env in range(4)]
    app.rescan()
    lists = []
    for _ in range(2):
        assert tab.resample() == 3
        lists.append({it.key for it in tab.items})
        tab.upcoming()  # prepares the next list, as the page does near the end of one
    assert all(a in new and b in new for pairs in lists for a, b in pairs)
    assert lists[0] | lists[1] == {pair_key(a, b) for i, a in enumerate(new) for b in new[i + 1 :]}
    assert not first & (lists[0] | lists[1])


async def test_a_new_list_is_picked_off_the_event_loop(tmp_path: Path) -> None:
    """The page's new list (``label_page.next_list``: the Resample button, a list's end, a new tab)
    is picked in a worker thread, where its cost grows with the DB (160-449 ms at 50k segments under
    --recent 50), not on the event loop every tab's requests wait on (was: ``TabSession.resample``
    on the loop). ``AppState.sample`` is watched for the thread it runs on."""
    from lib.label_ui.label_page import next_list
    from lib.label_ui.state import AppState, DbState, TabSession

    db = tmp_path / "db"
    make_synthetic_db(db, 8, seed=1)
    app = AppState([DbState.open(0, db)], pairs=3, seed=0, control_rate=0)
    where: list[threading.Thread] = []
    sample = app.sample

    def watched(*args, **kwargs):
        where.append(threading.current_thread())
        return sample(*args, **kwargs)

    app.sample = watched
    tab = TabSession(app, "tab")
    assert await next_list(app, tab) == 3 and len(tab.items) == 3
    assert where and threading.current_thread() not in where, where


def test_a_rescan_gives_new_segments_the_models_view_off_the_event_loop(tmp_path: Path) -> None:
    """--reward with a model's mode: a segment found by a rescan (run off the event loop by the
    pages) gets the model's view there, so picking the next list never waits on the model."""
    from bench.dbs import SEAQUEST, action_model, synthetic_frames, write_action_db
    from lib.label_ui.sampling import SegmentBeliefs
    from lib.label_ui.state import AppState, DbState
    from lib.models.reward import load_reward_model
    from lib.store.segments import Segment

    db = tmp_path / "db"
    write_action_db(db, [(0, 0.0), (1, 0.0), (4, 0.0)], 10, 64)
    rm = load_reward_model(action_model(64, tmp_path / "m.pt", [{0: 0.0, 1: 0.05, 4: 1.0, 5: 1.6}]))
    d = DbState.open(0, db)
    beliefs = SegmentBeliefs(rm, db)
    beliefs.all(d.segments)
    app = AppState([d], pairs=3, seed=0, sampling="uncertain", beliefs=[beliefs])
    z = np.zeros(10)
    seg = Segment(synthetic_frames(10, 64, 64, 9), np.full(10, 5), z.astype(np.float32), z.astype(bool),
                  z.astype(bool), np.full(10, 3, dtype=np.int32), env_id=SEAQUEST, env_index=1, step=1000)  # fmt: skip
    new = save_segment(db, seg, fsync=False).relative_to(db).as_posix()
    app.rescan()
    assert beliefs.views[new].member_returns.tolist() == pytest.approx([16.0], abs=1e-3)


def test_a_rescan_folds_new_segments_into_the_rare_looks(seaquest: Path, tmp_path: Path) -> None:
    """--sampling rare: a segment found by a rescan is read and folded in there (off the event
    loop), not when the next list is picked; the rarity then equals one computed afresh."""
    from lib.label_ui.server import rare_view
    from lib.label_ui.state import AppState, DbState

    db = db_of(seaquest, tmp_path / "db")
    d = DbState.open(0, db)
    app = AppState([d], pairs=2, seed=0, sampling="rare", looks=rare_view([d]))
    new = record(db, seaquest, "00/00000150.dat", 0, 5000)
    app.rescan()
    assert new in app.looks[0].looks
    got, fresh = app.looks[0].rarity(d.segments), SegmentLooks(db).rarity(d.segments)
    assert np.allclose([got[r] for r in d.segments], [fresh[r] for r in d.segments])


# --- --oracle N --follow --------------------------------------------------------------------------


def test_follow_oracle_labels_a_segment_that_appears_mid_run(seaquest: Path, tmp_path: Path) -> None:
    """T = 200 at start: at 10 labels / 1,000 steps the schedule owes 2 labels, then waits. A new
    segment at step 5,000 makes T 5,100 (the cut 01/00000150.dat does not read: env 01 is at 100):
    the oracle labels every pair left (10 in all, then it is done, exit 0); the new segment is in 4
    of them, the temp file and the cut file in none."""
    db = db_of(seaquest, tmp_path / "db")
    p = Stage2("-d", str(db), "--oracle", "10", "--follow", "--label-rate", "10", "--poll", "0.1", "--seed", "0")
    p.read_until("2/10 labels")
    time.sleep(0.5)  # five more looks: the schedule owes nothing more
    assert len(whole_lines(db)) == 2
    temp, cut = plant_partial_files(db, seaquest)
    new = record(db, seaquest, "00/00000150.dat", 0, 5000)
    out = p.read_until("10/10 labels")
    rc, rest, err = p.finish()
    out += rest
    assert rc == 0, err
    assert "T 5,100 agent steps, 5 segments seen" in out[-2] and "10 oracle labels" in out[-1]
    lines = whole_lines(db)
    assert len(lines) == 10 and all(x["source"] == "oracle" for x in lines)
    assert len({pair_key(x["sample1"], x["sample2"]) for x in lines}) == 10
    assert sum(new in (x["sample1"], x["sample2"]) for x in lines) == 4
    assert not any({temp, cut} & {x["sample1"], x["sample2"]} for x in lines)
    assert err.count("warning:") == 1 and cut in err, err  # the cut segment: one warning, skipped


def test_names_alone_do_not_move_the_agent_steps(tmp_path: Path) -> None:
    """Audit 5 item 6: T counts readable segments that record what their names say, within what a
    recorder reaches. A 1-byte 08/999999999999.dat (was: T 10^12, every label owed at once), a
    1-byte 09/00050000.dat, a real segment copied to 10/00070000.dat and a whole segment past the
    8-digit counter (11/100000000.dat) leave T at 96: at 50 labels / 1,000 steps a following oracle
    owes 4 labels, not its 28. Each is said once; the unreadable one is never paired."""
    db = tmp_path / "db"
    segs = make_synthetic_db(db, 8, seed=3)  # 4 envs, steps 12 and 24: T = 4 x 24 = 96
    copy = (db / segs[-1]).read_bytes()
    for rel, data in (("08/999999999999.dat", b"x"), ("09/00050000.dat", b"x"), ("10/00070000.dat", copy)):
        (db / rel).parent.mkdir()
        (db / rel).write_bytes(data)
    save_segment(db, dataclasses.replace(load_segment(db / segs[0]), env_index=11, step=10**8), fsync=False)
    said: list[str] = []
    watch = SegmentWatch(db, warn=said.append)
    assert watch.agent_steps() == 96 and watch.agent_steps() == 96
    assert len(said) == 4 and "09/00050000.dat" not in watch.segments, said
    assert all(rel in " ".join(said) for rel in ("08/999999999999", "09/00050000", "10/00070000", "11/100000000"))
    logged: list[str] = []
    stop = SignalStop()

    def log(line: str) -> None:  # stop after the first batch written
        logged.append(line)
        if "labels (+" in line:
            stop.event.set()

    (s,) = oracle_follow([db], FollowSettings(28, "constant", 50.0, 0.05), seed=0, stop=stop, log=log)
    assert s.labeled == 4 and "4/28 labels (+4), T 96 agent steps" in logged[-1], logged
    assert not any("09/00050000.dat" in (x["sample1"], x["sample2"]) for x in whole_lines(db))


def test_follow_oracle_waits_for_a_db_without_segments_and_says_so(seaquest: Path, tmp_path: Path) -> None:
    db = tmp_path / "db"
    db.mkdir()
    p = Stage2("-d", str(db), "--oracle", "1", "--follow", "--poll", "0.1", "--teacher", "surface")
    p.read_until("0 readable segment(s), at least 2 make a pair: waiting for clips")
    db_of(seaquest, tmp_path / "staged")  # a recorder's first segments, moved in whole
    for env in ("00", "01"):
        os.rename(tmp_path / "staged" / env, db / env)
    record(db, seaquest, "00/00000150.dat", 0, 1000)  # T 1,100: one label owed
    out = p.read_until("1/1 labels")
    rc, _, err = p.finish()
    assert rc == 0 and "T 1,100 agent steps" in out[-1], err
    (lab,) = whole_lines(db)
    assert lab["teacher"] == "surface" and "climb" in lab  # the SeaQuest facts, read from the segments


@pytest.mark.parametrize("sig, rc", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_follow_oracle_stops_on_a_signal_with_every_label_whole(
    seaquest: Path, tmp_path: Path, sig: signal.Signals, rc: int
) -> None:
    """Stopped while it waits for clips (T 200 at 50 labels / 1,000 steps owes 10, 4 segments make
    6 pairs): the labels it printed are in labels.jsonl, every line whole; Ctrl-C exits 130 (as
    stage 3), SIGTERM (a supervisor's stop) 0."""
    db = db_of(seaquest, tmp_path / "db")
    p = Stage2("-d", str(db), "--oracle", "100", "--follow", "--label-rate", "50", "--poll", "0.1")
    p.read_until("6/100 labels")
    p.read_until("waiting for new clips")
    p.p.send_signal(sig)
    code, out, err = p.finish(timeout=30)
    assert code == rc, err
    assert "Traceback" not in err and "6 oracle labels" in out[-1] and f"stopped by {sig.name}" in out[-1]
    assert len(whole_lines(db)) == 6


def test_follow_oracle_stopped_mid_batch_writes_what_it_labelled(tmp_path: Path, monkeypatch) -> None:
    """A real SIGINT to this process while the teacher answers the 150th pair of 720 owed (the
    first batch of 100 written, 50 more in hand): the labeler stops after that label, writes the
    50 and returns; the file holds exactly what the summary counts, every line whole."""
    from lib.models.teachers import Teacher

    db = tmp_path / "db"
    make_synthetic_db(db, 60, seed=2)  # 4 envs up to step 180: T = 720; 1,770 pairs
    answered = []
    answer_rule = Teacher.answer_rule

    def answer_and_signal(self, a, b):
        answered.append(1)
        if len(answered) == 150:
            os.kill(os.getpid(), signal.SIGINT)
        return answer_rule(self, a, b)

    monkeypatch.setattr(Teacher, "answer_rule", answer_and_signal)
    logged: list[str] = []
    with SignalStop() as stop:
        (s,) = oracle_follow([db], FollowSettings(1000, "constant", 1000.0, 0.1), seed=0, stop=stop, log=logged.append)
    assert stop.signal == "SIGINT" and s.labeled == 150
    assert len(whole_lines(db)) == 150
    assert [line.split(": ")[1].split(",")[0] for line in logged[1:]] == [
        "100/1000 labels (+100)",
        "150/1000 labels (+50)",
    ]


# --- flags ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--recent", "-1"], "--recent must be between 0"),
        (["--recent", "x"], "argument --recent: invalid int value"),
        (["--recent", str(10**9)], "--recent must be between 0"),
        (["--follow"], "--follow needs --oracle N"),
        (["--oracle", "5", "--schedule", "paper"], "--schedule is for --oracle N --follow"),
        (["--label-rate", "2"], "--label-rate is for --oracle N --follow"),
        (["--poll", "1"], "--poll is for --oracle N --follow"),
        (["--oracle", "5", "--follow", "--schedule", "weekly"], "argument --schedule: invalid choice"),
        (["--oracle", "5", "--follow", "--label-rate", "0"], "--label-rate must be more than 0"),
        (["--oracle", "5", "--follow", "--label-rate", "nan"], "--label-rate must be more than 0"),
        (["--oracle", "5", "--follow", "--label-rate", "1001"], "at most 1000 labels per 1,000 agent steps"),
        (["--oracle", "5", "--follow", "--poll", "0"], "--poll must be in [0.05, 3600] seconds"),
        (["--oracle", "5", "--follow", "--poll", "inf"], "--poll must be in"),
    ],
)
def test_bad_live_flags_are_one_line_and_exit_2(args, message, tmp_path: Path, capsys) -> None:
    db = tmp_path / "db"
    make_synthetic_db(db, 3)
    with pytest.raises(SystemExit) as e:
        main(["-d", str(db), *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (db / "labels.jsonl").exists()


def test_help_explains_the_live_flags() -> None:
    out = subprocess.run(
        [sys.executable, str(MAIN), "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    ).stdout
    flat = " ".join(out.split())
    for needle in (
        "--recent N draw pairs only from the N newest segments",
        "--follow with --oracle N: keep running",
        "sum over env directories of the largest step counter",
        "--schedule {constant,paper}",
        "H = 5,000,000 steps",
        "--label-rate R with --follow: labels per 1,000 agent steps",
        "--poll SECONDS with --follow: how often to look for new segments",
    ):
        assert needle in flat, needle


def test_oracle_without_follow_still_needs_two_segments(tmp_path: Path) -> None:
    db = tmp_path / "db"
    db.mkdir()
    with pytest.raises(UserError, match="at least 2 are needed"):
        oracle_label_db(db, 3, settings=OracleSettings(recent=5))
