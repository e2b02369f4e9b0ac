"""Synthetic (oracle) labels from the segments' true rewards."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lib.errors import UserError, warn
from lib.labels import (
    EQUAL,
    FIRST_BETTER,
    SECOND_BETTER,
    Label,
    append_labels,
    load_labels,
    pair_key,
    sample_unlabeled_pairs,
)
from lib.segments import SegmentError, list_segments, read_segment


@dataclass
class OracleSummary:
    db: str
    requested: int
    labeled: int
    counts: dict[int, int]
    skipped_unreadable: int
    seconds: float


def oracle_label_db(db_root: str | os.PathLike, n_pairs: int, seed: int | None = None) -> OracleSummary:
    """Label ``n_pairs`` new random pairs of a DB from true rewards: the higher return wins,
    equal returns are a tie (0). Source "oracle". Raises UserError for a legacy DB."""
    t0 = time.time()
    root = Path(db_root)
    if not root.is_dir():
        raise UserError(f"DB not found: {root}")
    segs = list_segments(root)
    if len(segs) < 2:
        raise UserError(f"DB {root} has {len(segs)} segment(s): at least 2 are needed to make a pair")
    rng = np.random.default_rng(seed)
    taken = set(load_labels(root))
    returns: dict[str, float | None] = {}
    bad = 0

    def ret(rel: str) -> float | None:
        nonlocal bad
        if rel not in returns:
            try:
                seg = read_segment(root, rel)
            except SegmentError as e:
                warn(f"skipped: {e}")
                bad += 1
                returns[rel] = None
                return None
            if seg.rewards is None:
                raise UserError(
                    f"DB {root} is a legacy DB without true rewards ({rel}): oracle labels are not possible"
                )
            returns[rel] = float(seg.rewards.sum())
        return returns[rel]

    labels: list[Label] = []
    while len(labels) < n_pairs:
        pairs = sample_unlabeled_pairs(segs, taken, n_pairs - len(labels), rng)
        if not pairs:
            break
        for a, b in pairs:
            taken.add(pair_key(a, b))
            ra, rb = ret(a), ret(b)
            if ra is None or rb is None:
                continue
            lab = FIRST_BETTER if ra > rb else SECOND_BETTER if rb > ra else EQUAL
            labels.append(Label(a, b, lab, time=time.time(), source="oracle", extra={"returns": [ra, rb]}))
    append_labels(root, labels)
    return OracleSummary(
        db=str(root),
        requested=n_pairs,
        labeled=len(labels),
        counts=dict(Counter(lab.label for lab in labels)),
        skipped_unreadable=bad,
        seconds=time.time() - t0,
    )
