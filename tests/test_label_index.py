"""The label server's kept counts and order (``LabelTallies`` in ``LabelIndex``): after any run of
new answers, changed answers, retractions and control answers, read from a real labels.jsonl as
the server reads it, they equal what a walk over every current label gives."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from bench.dbs import make_synthetic_db
from lib.label_ui.state import LabelIndex
from lib.store.labels import RETRACTED, Label, append_labels


def random_label(rng: random.Random, segs: list[str], clock: list[float]) -> Label:
    """An answer as they come: mostly later than the one before, some at the same time, some with an
    older time (a hand-set one, another process) or none (the book's labels); some retractions and
    control answers, from two sources."""
    a, b = rng.sample(segs, 2)
    r = rng.random()
    if r < 0.1:
        when = None
    elif r < 0.3:
        when = clock[0]  # the same time as the one before
    elif r < 0.4:
        when = clock[0] - rng.uniform(1, 50)
    else:
        clock[0] += 1.0
        when = clock[0]
    value = RETRACTED if rng.random() < 0.15 else rng.choice([1, 2, 0, -1])
    extra = {"control": True} if rng.random() < 0.1 else {}
    return Label(a, b, value, time=when, source=rng.choice(["human", "oracle"]), extra=extra)


def walked(index: LabelIndex, segs: list[str]) -> tuple[Counter, int, list[Label]]:
    """What the pages computed by walking every current label: counts by (answer, source),
    segments no label names, the labels newest first (a stable sort of the file order)."""
    labels = index.snapshot()
    named = {s for lab in labels for s in (lab.sample1, lab.sample2)}
    newest = sorted(labels, key=lambda lab: lab.time or 0.0, reverse=True)
    return Counter((lab.label, lab.source) for lab in labels), sum(s not in named for s in segs), newest


def kept(index: LabelIndex, segs: list[str]) -> tuple[Counter, int, list[Label]]:
    return index.kinds(), index.untouched(segs), [lab for _, _, lab in index.newest_first()]


def test_kept_counts_and_order_equal_a_walk_over_every_label(tmp_path: Path) -> None:
    db = tmp_path / "db"
    segs = make_synthetic_db(db, 7)
    index = LabelIndex(db)
    rng, clock = random.Random(0), [1000.0]
    for step in range(400):
        batch = [random_label(rng, segs, clock) for _ in range(rng.choice([1, 1, 3]))]
        append_labels(db, batch)
        index.refresh()
        assert kept(index, segs) == walked(index, segs), f"after line batch {step}"
    assert 0 < sum(index.kinds().values()) == len(index.snapshot()) <= 21  # 7 segments: 21 pairs
    again = LabelIndex(db)  # the server started again: the same, from the whole file at once
    assert kept(again, segs) == kept(index, segs) == walked(again, segs)
