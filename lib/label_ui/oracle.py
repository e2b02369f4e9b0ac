"""Synthetic labels for a DB: a teacher (``lib.models.teachers``) answers new pairs (``--oracle N``), or,
following a DB while the agent trains, new pairs of the clips as they appear, at a schedule of
labels per agent step (``--oracle N --follow``, ``oracle_follow``)."""

from __future__ import annotations

import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lib.atari.seaquest import OXYGEN_GAMES
from lib.core.errors import UserError, warn
from lib.core.signals import SignalStop
from lib.label_ui.sampling import MODEL_MODES, SegmentBeliefs, SegmentLooks, choose_pairs
from lib.models.teachers import DEFAULT_TEACHER, GAUGE_TEACHERS, SegmentFacts, Teacher, segment_facts
from lib.store.labels import LABELS_FILE, LOCK_FILE, Label, append_labels, labeling_lock, load_labels, pair_key
from lib.store.segments import SegmentError, SegmentWatch, db_game, list_segments, read_segment

BATCH = 100  # labels appended at a time: a full disk keeps the batches written before
SCHEDULES = ("constant", "paper")  # --follow: labels owed by agent step T (``labels_due``)
PAPER_HORIZON = 5e6  # Christiano et al. 2017, Atari: the label rate falls as 5e6 / (T + 5e6)
MAX_LABEL_RATE = 1000.0  # --label-rate: at most one label per agent step


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
    from lib.models.reward import load_reward_model  # torch only when a model is used

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
    fa: SegmentFacts,
    fb: SegmentFacts,
    rule: str,
    teacher: str,
    noise: float = 0.0,
    sampling: str = "random",
    death_penalty: float = 0.0,
) -> dict[str, object]:
    """What an oracle label records beside its answer: the teacher, the rule that decided, and the
    facts of the pair as [#1, #2] (``oracle_label_db``)."""
    extra: dict[str, object] = {"teacher": teacher, "rule": rule, "returns": [fa.ret, fb.ret]}
    extra["lives_lost"] = [fa.lives_lost, fb.lives_lost]
    if noise:
        extra["teacher_noise"] = noise
    if death_penalty:
        extra["death_penalty"] = death_penalty
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
    if fa.pay is not None and fb.pay is not None:  # the refill teacher's sums, and the climb steps among them
        extra["pay"] = [fa.pay.total, fb.pay.total]
        extra["climb_steps"] = [int(fa.pay.climb.sum()), int(fb.pay.climb.sum())]
    return extra


def labels_due(schedule: str, rate: float, steps: int) -> int:
    """Labels a schedule owes by agent step T (``--schedule``; ``rate`` R per 1,000 agent steps):
    ``constant`` R/1000 * T; ``paper`` Christiano et al. 2017's rate, proportional to H/(T + H) with
    H = ``PAPER_HORIZON``, so R/1000 * H * ln(1 + T/H) by step T."""
    per_step = rate / 1000.0
    if schedule == "constant":
        due = per_step * steps
    elif schedule == "paper":
        due = per_step * PAPER_HORIZON * math.log1p(steps / PAPER_HORIZON)
    else:
        raise ValueError(f"unknown schedule {schedule!r}: choose from {', '.join(SCHEDULES)}")
    return int(math.floor(due + 1e-9))  # 1e-9: 0.009 * 3000 is 26.999999999999996


@dataclass(frozen=True)
class OracleSettings:
    """How an oracle labels: the teacher (``lib.models.teachers``: ``teacher``, ``noise`` share of random
    answers, ``ties`` equal|skip) and how pairs are picked (``lib.label_ui.sampling``: ``sampling`` mode,
    ``reward`` model, ``pool`` of candidates, only the ``recent`` newest segments)."""

    teacher: str = DEFAULT_TEACHER
    noise: float = 0.0
    ties: str = "equal"
    sampling: str = "random"
    reward: str | os.PathLike | None = None
    pool: int | None = None
    recent: int = 0
    death_penalty: float = 0.0


class _Labeler:
    """One DB's synthetic labeler: the teacher, how pairs are picked (``lib.label_ui.sampling``), each
    segment's facts read once. Kept between the batches of ``oracle_follow``."""

    def __init__(self, root: Path, rng: np.random.Generator, s: OracleSettings) -> None:
        try:
            self.judge = Teacher(s.teacher, s.noise, s.ties, rng, s.death_penalty)
        except ValueError as e:
            raise UserError(str(e)) from None
        self.root, self.rng, self.teacher, self.noise = root, rng, s.teacher, s.noise
        self.sampling, self.pool, self.recent = s.sampling, s.pool, s.recent
        known = db_game(root)
        self.beliefs = _beliefs(root, known[0] if known else None, s.sampling, s.reward)
        self.looks = SegmentLooks(root) if s.sampling == "rare" else None
        self.facts_of = _FactsCache(root, None)
        self.game_checked = False

    def check_game(self) -> bool:
        """Read the DB's game (db.json, else a segment) before the first label: UserError when the
        teacher cannot read it; False while the DB names no game yet (no db.json, no segment)."""
        if self.game_checked:
            return True
        known = db_game(self.root, warn=None)
        if known is None and self.teacher in GAUGE_TEACHERS and not list_segments(self.root, warn=None):
            return False
        game = known[0] if known else None
        if self.teacher in GAUGE_TEACHERS and game not in OXYGEN_GAMES:
            held = game or "an unknown game"
            raise UserError(f"the {self.teacher} teacher reads SeaQuest's oxygen gauge; DB {self.root} holds {held}")
        self.facts_of.game, self.game_checked = game, True
        return True

    def readable(self, segments: list[str]) -> list[str]:
        """``segments`` but those found unreadable."""
        bad = self.facts_of.facts
        return [s for s in segments if s not in bad or bad[s] is not None]

    def labels(
        self, segments: list[str], taken: set[tuple[str, str]], want: int, stop: Callable[[], bool] = lambda: False
    ) -> Iterator[Label]:
        """Up to ``want`` labels of new pairs of ``segments`` (none in ``taken``, which grows with
        each pair picked): fewer when the pairs run out, none more once ``stop()``."""
        got = 0
        while got < want and not stop():
            pairs = choose_pairs(
                segments, taken, want - got, self.rng, self.sampling, self.beliefs, self.pool, self.looks, self.recent
            )
            if not pairs:
                return
            for a, b in pairs:
                if stop():
                    return
                taken.add(pair_key(a, b))
                fa, fb = self.facts_of(a), self.facts_of(b)
                if fa is None or fb is None:
                    continue
                answer, rule = self.judge.answer_rule(fa, fb)
                extra = label_extra(fa, fb, rule, self.teacher, self.noise, self.sampling, self.judge.death_penalty)
                yield Label(a, b, answer, time=time.time(), source="oracle", extra=extra)
                got += 1


class _Appender:
    """Labels appended to ``<db>/labels.jsonl`` in batches of ``BATCH``: a full disk keeps the
    batches written before, and nothing torn (``append_labels``)."""

    def __init__(self, root: Path, on_flush: Callable[[int], None] | None = None) -> None:
        self.root, self.on_flush = root, on_flush
        self.labels: list[Label] = []
        self.kept = 0

    def add(self, label: Label) -> None:
        self.labels.append(label)
        if len(self.labels) - self.kept >= BATCH:
            self.flush()

    def flush(self) -> None:
        new = self.labels[self.kept :]
        if not new:
            return
        try:
            append_labels(self.root, new)
        except OSError as e:
            raise UserError(
                f"cannot write {self.root / LABELS_FILE} ({e.strerror or e}): kept {self.kept} of the "
                f"{len(self.labels)} oracle labels of this run, nothing torn; free some space and run again"
            ) from None
        self.kept = len(self.labels)
        if self.on_flush is not None:
            self.on_flush(len(new))


def oracle_label_db(
    db_root: str | os.PathLike,
    n_pairs: int,
    seed: int | None = None,
    settings: OracleSettings = OracleSettings(),
) -> OracleSummary:
    """Label ``n_pairs`` new pairs of a DB with a synthetic teacher, as ``settings`` say (the
    teacher, its noise and ties, how pairs are picked). Each label has source "oracle" and records
    the teacher, the rule that decided ("noise" for a random answer) and what it saw, as
    ``label_extra`` writes it. UserError for a DB without true rewards or a teacher that cannot read
    the DB's game."""
    t0 = time.time()
    root = Path(db_root)
    if not root.is_dir():
        raise UserError(f"DB not found: {root}")
    segs = list_segments(root)
    labeler = _Labeler(root, np.random.default_rng(seed), settings)
    if len(segs) < 2:
        raise UserError(f"DB {root} has {len(segs)} segment(s): at least 2 are needed to make a pair")
    labeler.check_game()
    out = _Appender(root)
    # Concurrent oracles: the labels on disk are read, pairs picked and answers appended under one
    # lock, so a second run picks only pairs the first did not label.
    with labeling_lock(root, on_wait=lambda: warn(f"another labeler holds {root / LOCK_FILE}: waiting for it")):
        for label in labeler.labels(segs, set(load_labels(root)), n_pairs):
            out.add(label)
        out.flush()
    return _summary(root, n_pairs, out.labels, labeler, time.time() - t0)


def _summary(root: Path, requested: int, labels: list[Label], labeler: _Labeler, seconds: float) -> OracleSummary:
    return OracleSummary(
        db=str(root),
        requested=requested,
        labeled=len(labels),
        counts=dict(Counter(lab.label for lab in labels)),
        skipped_unreadable=labeler.facts_of.bad,
        seconds=seconds,
    )


# --- following a DB while the agent trains ---------------------------------------------------


@dataclass
class FollowSettings:
    """``--oracle N --follow``: N labels per DB, the schedule (``labels_due``), the poll interval."""

    n_labels: int
    schedule: str = "constant"
    rate: float = 1.0
    poll: float = 2.0


@dataclass
class _Follower:
    """One followed DB: its segments (``SegmentWatch``), its labeler and what this run wrote."""

    root: Path
    labeler: _Labeler
    watch: SegmentWatch
    at_start: int  # the DB's labels when following began: they count toward the schedule
    labels: list[Label] = field(default_factory=list)
    waiting: str = ""  # the last waiting line said (said again only when it changes)


def oracle_follow(
    dbs: list[Path],
    follow: FollowSettings,
    settings: OracleSettings = OracleSettings(),
    seed: int | None = None,
    stop: SignalStop | None = None,
    log: Callable[[str], None] = print,
) -> list[OracleSummary]:
    """``--oracle N --follow``: label new pairs of each DB as ``oracle_label_db`` does while a
    recorder adds segments. Every ``follow.poll`` s it reads the DB's new segment names, takes T =
    its ``agent_steps`` and labels what the schedule owes by T (``labels_due``) less the DB's labels
    at start and this run's. A DB is done at ``follow.n_labels`` labels; with no unlabelled pair
    left it waits for new clips. Stops when every DB is done or at ``stop``, every label written
    whole."""
    t0 = time.time()
    rng = np.random.default_rng(seed)
    followers = []
    for root in dbs:
        labeler = _Labeler(root, rng, settings)
        followers.append(_Follower(root, labeler, SegmentWatch(root), len(load_labels(root))))
    stop = stop or SignalStop()
    rule = f"{follow.rate:g} labels / 1,000 agent steps" + (" at the start" if follow.schedule == "paper" else "")
    log(
        f"following {', '.join(map(str, dbs))}: {follow.n_labels} labels each, schedule {follow.schedule} ({rule}), "
        f"a look every {follow.poll:g} s; Ctrl-C stops (labels written so far stay)"
    )
    while not stop():
        for f in followers:
            if len(f.labels) < follow.n_labels and not stop():
                _follow_step(f, follow, stop, log)
        if all(len(f.labels) >= follow.n_labels for f in followers):
            break
        stop.event.wait(follow.poll)
    return [_summary(f.root, follow.n_labels, f.labels, f.labeler, time.time() - t0) for f in followers]


def _follow_step(f: _Follower, follow: FollowSettings, stop: Callable[[], bool], log: Callable[[str], None]) -> None:
    """One look at a followed DB: its new segments, T, and the labels the schedule owes now."""
    f.watch.refresh()
    steps = f.watch.agent_steps()
    segs = f.labeler.readable(f.watch.segments)
    due = min(labels_due(follow.schedule, follow.rate, steps) - f.at_start, follow.n_labels)
    if len(segs) < 2:
        _say_once(f, f"{len(segs)} readable segment(s), at least 2 make a pair: waiting for clips", log)
        return
    if due <= len(f.labels) or not f.labeler.check_game():
        f.waiting = ""
        return
    root = f.root

    def progress(n: int) -> None:
        done = f"{len(f.labels)}/{follow.n_labels} labels (+{n})"
        log(f"{root}: {done}, T {steps:,} agent steps, {len(segs)} segments seen")

    out = _Appender(root, on_flush=progress)
    out.labels, out.kept = f.labels, len(f.labels)
    with labeling_lock(root, on_wait=lambda: warn(f"another labeler holds {root / LOCK_FILE}: waiting for it")):
        for label in f.labeler.labels(segs, set(load_labels(root)), due - len(f.labels), stop):
            out.add(label)
        out.flush()
    short = due - len(f.labels)
    if short > 0 and not stop():
        recent = f.labeler.recent
        which = f"the {recent} newest of {len(segs)}" if 0 < recent < len(segs) else f"the {len(segs)}"
        line = f"T {steps:,}: {short} label(s) owed, every pair of {which} readable segments is labelled"
        _say_once(f, f"{line}: waiting for new clips", log)
    else:
        f.waiting = ""


def _say_once(f: _Follower, line: str, log: Callable[[str], None]) -> None:
    """A waiting line, said when it differs from the last one said for this DB."""
    if line != f.waiting:
        log(f"{f.root}: {line}")
    f.waiting = line
