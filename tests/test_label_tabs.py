"""The pairs the label page's tabs hold (``AppState.reserved``, ``TabSession``): a pair is offered to
one tab at a time, from the list's draw until its label is in the index, and a closed tab holds
none. Real DBs and label files; the draw runs in a thread, as the page runs it."""

from __future__ import annotations

import threading
from pathlib import Path

from bench.dbs import make_synthetic_db
from lib.label_ui.state import AppState, DbState, TabSession


def _app(tmp_path: Path, segments: int, pairs: int = 3) -> AppState:
    db = tmp_path / "db"
    make_synthetic_db(db, segments, seed=1)
    return AppState([DbState.open(0, db)], pairs=pairs, seed=0, control_rate=0)


def test_an_answered_pair_stays_reserved_until_its_label_is_in_the_index(tmp_path: Path) -> None:
    """Three segments, three pairs, all in one tab's list. The tab answers one; while the page
    saves the label (in a thread) another tab draws a list: it does not hold the answered pair (was:
    released at the answer, before the save, and shown in both tabs: two answers for one pair)."""
    app = _app(tmp_path, 3)
    one, two = TabSession(app, "one"), TabSession(app, "two")
    assert one.resample() == 3
    item, label = one.answer(1)
    assert two.resample() == 0  # drawn while the label is being saved
    app.dbs[0].labels.append(label)  # what the page's save does
    one.saved(item)
    assert (0, item.key) not in app.reserved  # labelled now: the index keeps it from every list
    assert two.resample() == 0


def test_a_failed_save_keeps_the_pair_for_its_tab(tmp_path: Path) -> None:
    """A label that could not be saved: the pair is open again in its tab and no other tab is
    given it meanwhile."""
    app = _app(tmp_path, 3)
    one, two = TabSession(app, "one"), TabSession(app, "two")
    assert one.resample() == 3
    item, _ = one.answer(1)
    one.answer_failed(item)
    assert item.status == "open" and app.reserved[(0, item.key)] == "one"
    assert two.resample() == 0


def test_a_list_drawn_for_a_tab_closed_meanwhile_reserves_nothing(tmp_path: Path) -> None:
    """The tab is closed (``close``, 3 s after its disconnect) while its list is being drawn in a
    worker thread: the draw that ends after it reserves nothing, so another tab gets those pairs
    (was: reserved for good for a tab that no longer exists). The draw is held at its first look at
    the DB until the tab is closed."""
    app = _app(tmp_path, 3)
    gone = TabSession(app, "gone")
    d = app.dbs[0]
    free_pairs, started, go = d.free_pairs, threading.Event(), threading.Event()

    def held() -> int:
        started.set()
        go.wait(30)
        return free_pairs()

    d.free_pairs = held  # type: ignore[method-assign]
    drawn: list = []
    draw = threading.Thread(target=lambda: drawn.append(gone.draw()))
    draw.start()
    try:
        assert started.wait(30)
        gone.close()
    finally:
        go.set()
        draw.join(30)
    d.free_pairs = free_pairs  # type: ignore[method-assign]
    gone.use(drawn[0])  # what the page does with a draw's list (``label_page.new_list``)
    assert not app.reserved, app.reserved
    assert TabSession(app, "other").resample() == 3
