"""Synthetic teachers: labels without a person.

A teacher looks at two segments and answers as a person would: 1 (#1 better), 2 (#2 better),
0 (equally good) or -1 (can't tell). Two teachers:

- ``score``: the higher true return wins; equal returns are a tie (the oracle of earlier versions).
- ``oxygen`` (SeaQuest): what the book's person taught and the score does not pay for: surface to
  refill the oxygen before it runs out. Rule, in order:
  1. fewer lives lost with an empty gauge (an oxygen death) wins;
  2. else more voluntary refills wins;
  3. else the score decides (higher true return; equal is a tie).

Options shared by both: ``noise`` P, the paper's share of uniformly random answers (with
probability P the answer is #1 or #2 at random, whatever the segments show), and ``ties``: what
the teacher answers when it sees no difference, ``equal`` (0) or ``skip`` (-1, can't tell: kept
in labels.jsonl, never trained on).

The gauge and the events it shows are read by ``lib.seaquest``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lib.labels import CANT_TELL, EQUAL, FIRST_BETTER, SECOND_BETTER
from lib.seaquest import OxygenCounts, oxygen_counts, shows_gauge

TEACHERS = ("score", "oxygen")
TIE_RULES = ("equal", "skip")


# --- teachers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentFacts:
    """What a teacher knows of a segment: its true return (None: the DB has no true rewards) and,
    for SeaQuest, what its oxygen gauge showed (None for other games)."""

    ret: float | None
    oxygen: OxygenCounts | None = None


def segment_facts(
    frames: np.ndarray, rewards: np.ndarray | None, life_lost: np.ndarray | None, game: str | None
) -> SegmentFacts:
    """Facts of one segment (``life_lost``: the segment's ``dones``, a life or the game ended)."""
    ret = None if rewards is None else float(np.sum(rewards, dtype=np.float64))
    oxygen = oxygen_counts(frames, life_lost) if shows_gauge(game, frames.shape[1:]) else None
    return SegmentFacts(ret, oxygen)


def _by_score(a: SegmentFacts, b: SegmentFacts) -> int | None:
    if a.ret is None or b.ret is None:
        return None
    return FIRST_BETTER if a.ret > b.ret else SECOND_BETTER if b.ret > a.ret else EQUAL


def _by_oxygen(a: SegmentFacts, b: SegmentFacts) -> int | None:
    ca, cb = a.oxygen, b.oxygen
    if ca is None or cb is None:
        return None
    if ca.oxygen_deaths != cb.oxygen_deaths:
        return FIRST_BETTER if ca.oxygen_deaths < cb.oxygen_deaths else SECOND_BETTER
    if ca.refills != cb.refills:
        return FIRST_BETTER if ca.refills > cb.refills else SECOND_BETTER
    return _by_score(a, b)


_RULES: dict[str, Callable[[SegmentFacts, SegmentFacts], int | None]] = {"score": _by_score, "oxygen": _by_oxygen}
# The facts each rule compares, first to last (the first that differs decides), by the names an
# oracle label records them under (lib/oracle.py): how a recorded label was decided.
RULE_FACTS: dict[str, tuple[str, ...]] = {"score": ("returns",), "oxygen": ("oxygen_deaths", "refills", "returns")}


@dataclass
class Teacher:
    """A synthetic labeler: ``answer(a, b)`` -> 1 / 2 / 0 / -1 (labels.py's values)."""

    name: str = "score"
    noise: float = 0.0
    ties: str = "equal"
    rng: np.random.Generator = field(default_factory=np.random.default_rng)

    def __post_init__(self) -> None:
        if self.name not in _RULES:
            raise ValueError(f"unknown teacher {self.name!r}: choose from {', '.join(TEACHERS)}")
        if self.ties not in TIE_RULES:
            raise ValueError(f"unknown tie rule {self.ties!r}: choose from {', '.join(TIE_RULES)}")
        if not 0.0 <= self.noise <= 1.0:
            raise ValueError(f"teacher noise must be in [0, 1], got {self.noise}")

    def judge(self, a: SegmentFacts, b: SegmentFacts) -> int:
        """The teacher's own answer, without noise (-1 where it cannot judge the pair)."""
        verdict = _RULES[self.name](a, b)
        if verdict is None:
            return CANT_TELL
        if verdict == EQUAL and self.ties == "skip":
            return CANT_TELL
        return verdict

    def answer(self, a: SegmentFacts, b: SegmentFacts) -> int:
        """``judge`` with the paper's random answers mixed in at rate ``noise``."""
        if self.noise > 0 and self.rng.random() < self.noise:
            return FIRST_BETTER if self.rng.random() < 0.5 else SECOND_BETTER
        return self.judge(a, b)
