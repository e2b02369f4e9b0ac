"""Costs that grow with the DB stay off the label page's event loop and out of each look of a
following trainer (audit 5 item 9): a tab's new list is picked in a thread, and a following
trainer reads only the label lines appended since its last look. Timings are in
``bench.bench_label_ui --only scale``; these tests check where the work happens and what is read."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from bench.dbs import make_synthetic_db
from lib.label_ui.label_page import next_list
from lib.label_ui.state import AppState, DbState, TabSession
from lib.labels import Label, append_labels
from lib.reward_follow import LabelWatch
from lib.sampling import SegmentLooks


async def test_a_new_list_is_picked_off_the_event_loop(tmp_path: Path) -> None:
    """--sampling rare reads the segments' looks while it picks (a warning for the unreadable one):
    the Resample button's new list (``next_list``) reads them in a worker thread, not on the event
    loop's (was: on the loop, where every tab's requests wait for it)."""
    db = tmp_path / "db"
    make_synthetic_db(db, 8, seed=1)
    (db / "00" / "00000099.dat").write_bytes(b"x")  # read, and said, only while a list is picked
    where: list[threading.Thread] = []
    looks = SegmentLooks(db, warn=lambda line: where.append(threading.current_thread()))
    app = AppState([DbState.open(0, db)], pairs=3, seed=0, sampling="rare", looks=[looks], control_rate=0)
    tab = TabSession(app, "tab")
    assert await next_list(app, tab) == 3
    assert where and threading.current_thread() not in where, where


def _label(db: Path, pairs: list[tuple[str, str]], value: int = 1) -> None:
    append_labels(db, [Label(a, b, value, time=1.0, source="human") for a, b in pairs])


def test_a_following_trainer_reads_only_what_was_appended(tmp_path: Path) -> None:
    """``LabelWatch.read`` after a change parses only the lines appended since (was: the whole
    file at each change, 3-4 s at 100k lines): the bad line 2 is said once, not at each look, and
    a bad appended line is named by its line in the file. A line still being written waits for its
    end. A file truncated, replaced, or rewritten in place is read whole again; each look agrees
    with a fresh reader's."""
    db = tmp_path / "db"
    s = make_synthetic_db(db, 8, seed=1)
    _label(db, [(s[0], s[1])])
    with open(db / "labels.jsonl", "ab") as f:
        f.write(b"not a label\n")
    _label(db, [(s[2], s[3])])
    said: list[str] = []
    watch = LabelWatch([str(db)], said.append)

    def fresh() -> dict:
        return LabelWatch([str(db)], lambda line: None).read()

    assert len(watch.read()) == 2 and len(said) == 1 and "labels.jsonl:2:" in said[0]
    _label(db, [(s[0], s[1])], 2)  # an edit
    _label(db, [(s[4], s[5]), (s[6], s[7])], -1)  # "can't tell": not a training label
    assert watch.read() == fresh() and len(said) == 1, said  # the bad line is not read again
    with open(db / "labels.jsonl", "ab") as f:
        f.write(b'{"sample1": "' + s[4].encode())  # a line still being written
    assert watch.read() == fresh() and len(said) == 1, said
    with open(db / "labels.jsonl", "ab") as f:
        f.write(b'", "sample2": "' + s[6].encode() + b'", "label": 1}\nbad\n')
    now = watch.read()
    assert now == fresh() and len(now) == 3 and len(said) == 2 and "labels.jsonl:8:" in said[1], said
    text = (db / "labels.jsonl").read_bytes()
    (db / "labels.jsonl").write_bytes(text[: text.index(b"\n") + 1])  # truncated in place: one label
    assert watch.read() == fresh() and len(watch.read()) == 1
    (db / "new.jsonl").write_bytes(text.replace(b'"label": 2', b'"label": 1'))
    os.replace(db / "new.jsonl", db / "labels.jsonl")  # replaced: another inode
    assert watch.read() == fresh() and len(watch.read()) == 3
    with open(db / "labels.jsonl", "r+b") as f:  # rewritten in place, longer: the tail read is gone
        f.write(text.replace(b'"label": 1', b'"label": 2') + text)
    assert watch.read() == fresh()
