"""Synthetic labels for a DB: a teacher (``lib.teachers``) answers new random pairs."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lib.errors import UserError, warn
from lib.labels import LABELS_FILE, LOCK_FILE, Label, append_labels, labeling_lock, load_labels, pair_key
from lib.sampling import MODEL_MODES, SegmentBeliefs, SegmentLooks, choose_pairs
from lib.seaquest import OXYGEN_GAMES
from lib.segments import SegmentError, db_game, list_segments, read_segment
from lib.teachers import GAUGE_TEACHERS, SegmentFacts, Teacher, segment_facts

BATCH = 100  # labels appended at a time: a full disk keeps the batches written before


@dataclass
class OracleSummary:
    db: str
    requested: int
    labeled: int
    counts: dict[int, int]
    skipped_unreadable: int
    seconds: float


def _beliefs(root: Path, game: str | None, sampling: str, reward: str | os.PathLike | None) -> SegmentBeliefs | None:
    """The reward model's view of the DB, for the sampling modes that need one."""
    if sampling not in MODEL_MODES:
        return None
    if reward is None:
        raise UserError(f"--sampling {sampling} needs the reward model's view: pass --reward MODEL")
    from lib.reward_model import load_reward_model  # torch only when a model is used

    return SegmentBeliefs(load_reward_model(reward, game=game), root)


@dataclass
class _FactsCache:
    """Each segment's ``SegmentFacts``, read once; None for an unreadable segment (counted)."""

    root: Path
    game: str | None
    facts: dict[str, SegmentFacts | None] = field(default_factory=dict)
    bad: int = 0

    def __call__(self, rel: str) -> SegmentFacts | None:
        if rel not in self.facts:
            try:
                seg = read_segment(self.root, rel)
            except SegmentError as e:
                warn(f"skipped: {e}")
                self.bad += 1
                self.facts[rel] = None
                return None
            if seg.rewards is None:
                raise UserError(
                    f"DB {self.root} is a legacy DB without true rewards ({rel}): oracle labels are not possible"
                )
            self.facts[rel] = segment_facts(seg.frames, seg.rewards, seg.dones, self.game)
        return self.facts[rel]


def label_extra(
    fa: SegmentFacts, fb: SegmentFacts, rule: str, teacher: str, noise: float = 0.0, sampling: str = "random"
) -> dict[str, object]:
    """What an oracle label records beside its answer: the teacher, the rule that decided, and the
    facts of the pair as [#1, #2] (``oracle_label_db``)."""
    extra: dict[str, object] = {"teacher": teacher, "rule": rule, "returns": [fa.ret, fb.ret]}
    if noise:
        extra["teacher_noise"] = noise
    if sampling != "random":
        extra["sampling"] = sampling
    if fa.oxygen is not None and fb.oxygen is not None:
        extra["refills"] = [fa.oxygen.refills, fb.oxygen.refills]
        extra["oxygen_deaths"] = [fa.oxygen.oxygen_deaths, fb.oxygen.oxygen_deaths]
        extra["deaths"] = [fa.oxygen.deaths, fb.oxygen.deaths]
    if fa.surface is not None and fb.surface is not None:
        extra["climb"] = [fa.surface.climb_rows, fb.surface.climb_rows]
        extra["diver_climb"] = [fa.surface.diver_climb_rows, fb.surface.diver_climb_rows]
        extra["rescues"] = [fa.surface.rescues, fb.surface.rescues]
        extra["low_diver_steps"] = [fa.surface.low_diver_steps, fb.surface.low_diver_steps]
        extra["idle"] = [fa.surface.idle_steps, fb.surface.idle_steps]
    return extra


def oracle_label_db(
    db_root: str | os.PathLike,
    n_pairs: int,
    seed: int | None = None,
    teacher: str = "score",
    noise: float = 0.0,
    ties: str = "equal",
    sampling: str = "random",
    reward: str | os.PathLike | None = None,
    pool: int | None = None,
) -> OracleSummary:
    """Label ``n_pairs`` new pairs of a DB with a synthetic teacher (``lib.teachers``: ``score``,
    ``oxygen`` or ``surface``, ``noise`` share of random answers, ``ties`` equal|skip), the pairs
    picked as the label page would pick them (``lib.sampling``: ``sampling`` mode, ``reward``
    model, ``pool`` of candidates). Each label records source "oracle", the teacher, the rule that
    decided (``rule``: ``lib.teachers``' rule names, "noise" for a random answer) and what it saw:
    ``returns``, and for SeaQuest ``oxygen_deaths``, ``refills``, ``climb`` (rows climbed with a
    low gauge), ``idle`` (steps at the surface with a full gauge), each a [#1, #2] pair.
    UserError for a DB without true rewards (the book's) or a teacher that cannot read the DB's
    game."""
    t0 = time.time()
    root = Path(db_root)
    if not root.is_dir():
        raise UserError(f"DB not found: {root}")
    rng = np.random.default_rng(seed)
    try:
        judge = Teacher(teacher, noise, ties, rng)
    except ValueError as e:
        raise UserError(str(e)) from None
    segs = list_segments(root)
    if len(segs) < 2:
        raise UserError(f"DB {root} has {len(segs)} segment(s): at least 2 are needed to make a pair")
    game = (db_game(root) or (None, None))[0]
    if teacher in GAUGE_TEACHERS and game not in OXYGEN_GAMES:
        held = game or "an unknown game"
        raise UserError(f"the {teacher} teacher reads SeaQuest's oxygen gauge; DB {root} holds {held}")
    beliefs = _beliefs(root, game, sampling, reward)
    looks = SegmentLooks(root) if sampling == "rare" else None
    facts_of = _FactsCache(root, game)
    labels: list[Label] = []
    kept = 0

    def flush() -> None:
        nonlocal kept
        try:
            append_labels(root, labels[kept:])
        except OSError as e:
            raise UserError(
                f"cannot write {root / LABELS_FILE} ({e.strerror or e}): kept {kept} of the {len(labels)} oracle "
                "labels of this run, nothing torn; free some space and run again"
            ) from None
        kept = len(labels)

    # Concurrent oracles: the labels on disk are read, pairs picked and answers appended under one
    # lock, so a second run picks only pairs the first did not label.
    with labeling_lock(root, on_wait=lambda: warn(f"another labeler holds {root / LOCK_FILE}: waiting for it")):
        taken = set(load_labels(root))
        while len(labels) < n_pairs:
            pairs = choose_pairs(segs, taken, n_pairs - len(labels), rng, sampling, beliefs, pool, looks)
            if not pairs:
                break
            for a, b in pairs:
                taken.add(pair_key(a, b))
                fa, fb = facts_of(a), facts_of(b)
                if fa is None or fb is None:
                    continue
                answer, rule = judge.answer_rule(fa, fb)
                extra = label_extra(fa, fb, rule, teacher, noise, sampling)
                labels.append(Label(a, b, answer, time=time.time(), source="oracle", extra=extra))
                if len(labels) - kept >= BATCH:
                    flush()
        flush()
    return OracleSummary(
        db=str(root),
        requested=n_pairs,
        labeled=len(labels),
        counts=dict(Counter(lab.label for lab in labels)),
        skipped_unreadable=facts_of.bad,
        seconds=time.time() - t0,
    )
