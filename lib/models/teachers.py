"""Synthetic teachers: labels without a person. A teacher looks at two segments and answers as a
person would (1, 2, 0 or -1) and names the rule that decided (``judge_rule``; the oracle stores it
as ``rule``). ``score`` prefers the higher true return, a lost life costing ``death_penalty``
points; ``oxygen`` and ``surface`` (SeaQuest) first apply rules for what the score does not pay for,
then the score; ``refill`` (SeaQuest) weighs: the larger sum of the surface rule's per-step pay wins
(``lib.atari.seaquest.step_pay``). ``noise`` answers a share at random (the paper's model of a person). Each rule and
its thresholds: docs/reference.md; the screen is read by ``lib.atari.seaquest``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lib.atari.seaquest import (
    OxygenCounts,
    StepPay,
    SurfaceCounts,
    oxygen_counts,
    shows_gauge,
    step_pay,
    surface_counts,
)
from lib.store.labels import CANT_TELL, EQUAL, FIRST_BETTER, SECOND_BETTER

TIE_RULES = ("equal", "skip")
CLIMB_MIN_ROWS = 8  # surface teacher: low-gauge climbs with a diver closer than this do not decide
IDLE_MIN_STEPS = 20  # surface teacher: idle-at-the-surface counts closer than this do not decide


# --- teachers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentFacts:
    """What a teacher knows of a segment: its true return (None: the DB has no true rewards) and,
    for SeaQuest at full resolution, what its oxygen gauge showed, what the sub did with a low
    gauge, with divers and at the surface, and what the surface rule pays each step (None for other
    games; the pay also None without true rewards)."""

    ret: float | None
    oxygen: OxygenCounts | None = None
    surface: SurfaceCounts | None = None
    lives_lost: int = 0  # steps that ended a life (or the game) within the clip
    pay: StepPay | None = None


def segment_facts(
    frames: np.ndarray, rewards: np.ndarray | None, life_lost: np.ndarray | None, game: str | None
) -> SegmentFacts:
    """Facts of one segment (``life_lost``: the segment's ``dones``, a life or the game ended)."""
    ret = None if rewards is None else float(np.sum(rewards, dtype=np.float64))
    lost = 0 if life_lost is None else int(np.count_nonzero(life_lost))
    if not shows_gauge(game, frames.shape[1:]):
        return SegmentFacts(ret, lives_lost=lost)
    pay = None if rewards is None else step_pay(frames, rewards, life_lost)
    return SegmentFacts(ret, oxygen_counts(frames, life_lost), surface_counts(frames, life_lost), lost, pay)


Verdict = tuple[int, str]  # (answer, the rule that decided it)


def _more(x: float, y: float, rule: str) -> Verdict:
    """The clip with more of ``x`` / ``y`` wins (x != y)."""
    return (FIRST_BETTER if x > y else SECOND_BETTER), rule


def _by_score(a: SegmentFacts, b: SegmentFacts, death_penalty: float = 0.0) -> Verdict | None:
    if a.ret is None or b.ret is None:
        return None
    ra, rb = a.ret - death_penalty * a.lives_lost, b.ret - death_penalty * b.lives_lost
    if ra == rb:
        return EQUAL, "tie"
    plain = _more(a.ret, b.ret, "score")[0] if a.ret != b.ret else EQUAL
    verdict = _more(ra, rb, "score")
    return verdict if verdict[0] == plain else (verdict[0], "death")


def _by_oxygen_events(a: OxygenCounts, b: OxygenCounts) -> Verdict | None:
    if a.oxygen_deaths != b.oxygen_deaths:
        return _more(b.oxygen_deaths, a.oxygen_deaths, "oxygen_death")  # fewer wins
    if a.refills != b.refills:
        return _more(a.refills, b.refills, "refill")
    return None


def _by_oxygen(a: SegmentFacts, b: SegmentFacts, death_penalty: float = 0.0) -> Verdict | None:
    if a.oxygen is None or b.oxygen is None:
        return None
    return _by_oxygen_events(a.oxygen, b.oxygen) or _by_score(a, b)


def _by_surface(a: SegmentFacts, b: SegmentFacts, death_penalty: float = 0.0) -> Verdict | None:
    if a.oxygen is None or b.oxygen is None or a.surface is None or b.surface is None:
        return None
    oa, ob, sa, sb = a.oxygen, b.oxygen, a.surface, b.surface
    if oa.deaths != ob.deaths:
        return _more(ob.deaths, oa.deaths, "death")  # fewer wins
    if oa.refills != ob.refills:
        return _more(oa.refills, ob.refills, "refill")
    if abs(sa.diver_climb_rows - sb.diver_climb_rows) >= CLIMB_MIN_ROWS:
        return _more(sa.diver_climb_rows, sb.diver_climb_rows, "diver_climb")
    if sa.rescues != sb.rescues:
        return _more(sa.rescues, sb.rescues, "rescue")
    if abs(sa.idle_steps - sb.idle_steps) >= IDLE_MIN_STEPS:
        return _more(sb.idle_steps, sa.idle_steps, "idle")  # fewer wins
    return _by_score(a, b)


def _by_sum(pay_of: Callable[[StepPay], np.ndarray]) -> Callable[[SegmentFacts, SegmentFacts, float], Verdict | None]:
    """The judge of a teacher that weighs: the clip whose per-step pay (``pay_of`` its ``StepPay``)
    sums higher wins, rule "pay"; equal sums tie."""

    def judge(a: SegmentFacts, b: SegmentFacts, death_penalty: float = 0.0) -> Verdict | None:
        if a.pay is None or b.pay is None:
            return None
        pa, pb = (float(np.sum(pay_of(p), dtype=np.float64)) for p in (a.pay, b.pay))
        return (EQUAL, "tie") if pa == pb else _more(pa, pb, "pay")

    return judge


def _pay(p: StepPay) -> np.ndarray:
    return p.pay


def _moves_pay(p: StepPay) -> np.ndarray:
    return p.moves_pay


# The score teacher's --death-penalty: a clip with a lost life loses 100 points (a few shots'
# worth). Its models agreed more with the score on held-out pairs (docs/results.md), both papers'
# oracles penalise a death, and without it a death ties with idling.
DEFAULT_DEATH_PENALTY = 100.0


@dataclass(frozen=True)
class TeacherEntry:
    """One synthetic teacher, all in one place: adding a teacher is adding an entry to
    ``TEACHER_ENTRIES`` (and its judge). ``summary``: ``--teacher``'s help; ``rules``: the rule
    names that decide its labels, first to last; ``judge(a, b, death_penalty)``: its verdict, None
    where it cannot tell; ``reads_gauge``: it reads SeaQuest's gauge, so a DB of another game is
    refused; ``death_penalty``: its default (None: it takes none); ``old_facts``: the label fields,
    first to last, that say how a label written before labels named their rule was decided;
    ``step_pay``: the per-step pay it sums (of a clip's ``StepPay``), so that ``--evaluate`` also
    correlates a model's per-step reward with it; None for a teacher that orders rules."""

    name: str
    summary: str
    rules: tuple[str, ...]
    judge: Callable[[SegmentFacts, SegmentFacts, float], Verdict | None]
    reads_gauge: bool = False
    death_penalty: float | None = None
    old_facts: tuple[str, ...] = ()
    step_pay: Callable[[StepPay], np.ndarray] | None = None


TEACHER_ENTRIES: dict[str, TeacherEntry] = {
    t.name: t
    for t in (
        TeacherEntry(
            "score",
            "prefers the higher true return (a lost life costs --death-penalty points)",
            ("death", "score", "tie"),
            _by_score,
            death_penalty=DEFAULT_DEATH_PENALTY,
            old_facts=("returns",),
        ),
        TeacherEntry(
            "oxygen",
            "(SeaQuest) prefers fewer lives lost to an empty oxygen gauge, then more refills at the surface, "
            "then the higher return",
            ("oxygen_death", "refill", "score", "tie"),
            _by_oxygen,
            reads_gauge=True,
            old_facts=("oxygen_deaths", "refills", "returns"),
        ),
        TeacherEntry(
            "surface",
            "(SeaQuest) prefers fewer lives lost, more refills, the sub that climbs more with a low gauge and "
            "a diver aboard, more rescues, less idling at the surface with a full gauge, then the higher return",
            ("death", "refill", "diver_climb", "rescue", "idle", "score", "tie"),
            _by_surface,
            reads_gauge=True,
        ),
        TeacherEntry(
            "refill",
            "(SeaQuest) weighs: prefers the clip whose per-step pay sums higher, the score's sign on each step, "
            "+1 on each step the sub climbs with a low gauge and a diver aboard, +1 on each refill; equal sums tie",
            ("pay", "tie"),
            _by_sum(_pay),
            reads_gauge=True,
            step_pay=_pay,
        ),
        TeacherEntry(
            "moves",
            "(SeaQuest) weighs as 'refill' does, with each step up with a low gauge and a diver aboard +1 and each "
            "step down -1 in place of the climb: a pay each step earns by itself, which a reward model of one step "
            "can follow (the climb pays a rise above the highest point so far)",
            ("pay", "tie"),
            _by_sum(_moves_pay),
            reads_gauge=True,
            step_pay=_moves_pay,
        ),
    )
}
DEFAULT_TEACHER = "score"  # the teacher of --oracle, the live loop and the quality benchmark
TEACHERS = tuple(TEACHER_ENTRIES)
GAUGE_TEACHERS = tuple(t.name for t in TEACHER_ENTRIES.values() if t.reads_gauge)
# How a label recorded before labels named their rule was decided (``old_facts``). Labels now record
# the rule itself (``extra["rule"]``); the surface teacher's climb and idle rules have thresholds,
# so only that says how one of its labels was decided.
RULE_FACTS: dict[str, tuple[str, ...]] = {t.name: t.old_facts for t in TEACHER_ENTRIES.values() if t.old_facts}


def death_penalty_for(teacher: str, given: float | None) -> float:
    """The ``--death-penalty`` a teacher labels with: ``given``, or unset, its default (0 for a
    teacher that takes none). ValueError for a penalty out of range or given to such a teacher."""
    entry = TEACHER_ENTRIES[teacher]
    if given is None:
        return entry.death_penalty or 0.0
    if not 0.0 <= given < 1e9:
        raise ValueError(f"--death-penalty must be a number of points >= 0, got {given:g}")
    if given and entry.death_penalty is None:
        raise ValueError(f"--death-penalty is the score teacher's; the {teacher} teacher ranks lost lives already")
    return given


def teacher_help() -> str:
    """``--teacher``'s help: each teacher's ``summary``."""
    return "; ".join(f"'{t.name}' {t.summary}" for t in TEACHER_ENTRIES.values()) + " (lib/models/teachers.py)"


@dataclass
class Teacher:
    """A synthetic labeler of a pair of segments' facts. Both methods return a ``Verdict``: the
    answer, 1 / 2 / 0 / -1 (labels.py's values), and the rule that decided it. ``answer_rule`` is
    the labeler (the paper's random answers at rate ``noise``); ``judge_rule`` is the teacher's own
    rule, without noise, for scoring a model against it."""

    name: str = DEFAULT_TEACHER
    noise: float = 0.0
    ties: str = "equal"
    rng: np.random.Generator = field(default_factory=np.random.default_rng)
    death_penalty: float = 0.0  # score teacher: points a lost life costs in a clip's sum

    def __post_init__(self) -> None:
        if self.name not in TEACHER_ENTRIES:
            raise ValueError(f"unknown teacher {self.name!r}: choose from {', '.join(TEACHERS)}")
        if self.ties not in TIE_RULES:
            raise ValueError(f"unknown tie rule {self.ties!r}: choose from {', '.join(TIE_RULES)}")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"teacher noise must be in [0, 1], got {self.noise}")
        if not 0.0 <= self.death_penalty < 1e9:
            raise ValueError(f"the death penalty must be a number >= 0, got {self.death_penalty}")
        if self.death_penalty and TEACHER_ENTRIES[self.name].death_penalty is None:
            raise ValueError(f"the {self.name} teacher takes no death penalty: it ranks lost lives itself")

    def judge_rule(self, a: SegmentFacts, b: SegmentFacts) -> Verdict:
        """The teacher's own answer, without noise, and the rule that decided it; (-1, "cant_tell")
        where it cannot judge the pair."""
        verdict = TEACHER_ENTRIES[self.name].judge(a, b, self.death_penalty)
        if verdict is None:
            return CANT_TELL, "cant_tell"
        answer, rule = verdict
        if answer == EQUAL and self.ties == "skip":
            return CANT_TELL, rule
        return answer, rule

    def answer_rule(self, a: SegmentFacts, b: SegmentFacts) -> Verdict:
        """``judge_rule`` with the paper's random answers mixed in at rate ``noise`` (rule "noise")."""
        if self.noise > 0 and self.rng.random() < self.noise:
            return (FIRST_BETTER if self.rng.random() < 0.5 else SECOND_BETTER), "noise"
        return self.judge_rule(a, b)
