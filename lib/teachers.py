"""Synthetic teachers: labels without a person, and the SeaQuest oxygen reading they share with
the behaviour metrics.

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

The oxygen gauge (210x160 RGB frame, rows 170-174, columns 49-112): a bar of 63 pixels, white
(214, 214, 214) for the oxygen left, red (163, 57, 21) for the oxygen used. When oxygen is low
the white part blinks (4 agent steps shown, 4 hidden) while the red part stays, so the level is
read from the red part: ``level = 63 - red pixels`` (0 when the bar is all red, which it also is
while a sub dies). A frame without the bar (no red and no white) has no reading (-1).

Events, followed step by step (``OxygenTracker``; one implementation for segments and games):

- **refill**: the level rises after having been steady or falling, from a level above 0. The sub
  surfaced with oxygen left. After a lost life (and at a game's start) the new sub waits at the
  surface while the gauge fills from empty by itself, 2 pixels per agent step: that rise starts
  at 0 and is not a refill. A rise already under way when the record starts is not counted either.
- **oxygen death**: a life lost while the gauge is empty, where the last level seen before it
  emptied was at most ``OXYGEN_EMPTY_MAX`` (it ran out). A sub hit by an enemy shows its gauge
  jump from its level straight to empty, so that death is not an oxygen death.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lib.labels import CANT_TELL, EQUAL, FIRST_BETTER, SECOND_BETTER

GAUGE_ROWS = slice(170, 175)
GAUGE_COLS = slice(40, 120)
GAUGE_RED = (163, 57, 21)
GAUGE_WHITE = (214, 214, 214)
OXYGEN_FULL = 63
OXYGEN_EMPTY_MAX = 2  # last level seen before the gauge emptied, at most this: the oxygen ran out
TEACHERS = ("score", "oxygen")
TIE_RULES = ("equal", "skip")
OXYGEN_GAMES = ("seaquest",)  # games whose frames have the gauge this module reads
FRAME_SHAPE = (210, 160, 3)  # the full-resolution RGB frame the gauge rows and columns refer to


def shows_gauge(game: str | None, frame_shape: tuple[int, ...]) -> bool:
    """Whether frames of this shape from this game carry a gauge ``oxygen_levels`` can read
    (SeaQuest at full resolution; a DB recorded downscaled, or a test env, has none)."""
    return game in OXYGEN_GAMES and tuple(frame_shape) == FRAME_SHAPE


def oxygen_levels(frames: np.ndarray) -> np.ndarray:
    """(T, 210, 160, 3) or (210, 160, 3) uint8 frames -> (T,) or () int16 oxygen level 0-63, -1
    where the frame shows no gauge."""
    frames = np.asarray(frames)
    if frames.ndim < 3 or frames.shape[-3:] != FRAME_SHAPE:
        raise ValueError(f"oxygen_levels needs 210x160 RGB frames, got shape {frames.shape}")
    region = frames[..., GAUGE_ROWS, GAUGE_COLS, :]
    red = (region == GAUGE_RED).all(-1).sum(-1).max(-1)
    white = (region == GAUGE_WHITE).all(-1).sum(-1).max(-1)
    level = OXYGEN_FULL - np.minimum(red, OXYGEN_FULL)
    return np.where((red + white) > 0, level, -1).astype(np.int16)


@dataclass
class OxygenCounts:
    """What a stretch of play showed: voluntary refills, lives lost, lives lost to oxygen."""

    refills: int = 0
    deaths: int = 0
    oxygen_deaths: int = 0


@dataclass
class OxygenTracker:
    """Follows the gauge one agent step at a time (module docstring: the rules)."""

    counts: OxygenCounts = field(default_factory=OxygenCounts)
    _last: int | None = None  # last level read
    _phase: str = "unknown"  # "rising", "steady" (steady or falling) or "unknown" (record start)
    _before_empty: int | None = None  # last level above 0 before the gauge emptied

    def step(self, level: int, life_lost: bool) -> None:
        """``level``: the gauge in the frame the action was chosen on (-1: no reading);
        ``life_lost``: the step ended a life (or the game)."""
        last = self._last
        if level >= 0:
            if last is not None:
                if level > last:
                    if self._phase == "steady" and last > 0:
                        self.counts.refills += 1
                    self._phase = "rising"
                elif level < last or self._phase == "unknown":
                    self._phase = "steady"
                if level == 0 and last > 0:
                    self._before_empty = last
            if level > 0:
                self._before_empty = None
            self._last = last = level
        if life_lost:
            self.counts.deaths += 1
            if last == 0 and self._before_empty is not None and self._before_empty <= OXYGEN_EMPTY_MAX:
                self.counts.oxygen_deaths += 1


def oxygen_counts(frames: np.ndarray, life_lost: np.ndarray | None) -> OxygenCounts:
    """Refills and deaths in a record of consecutive steps (a segment)."""
    tracker = OxygenTracker()
    lost = np.zeros(len(frames), dtype=bool) if life_lost is None else np.asarray(life_lost, dtype=bool)
    for level, dead in zip(oxygen_levels(frames).tolist(), lost.tolist(), strict=True):
        tracker.step(level, dead)
    return tracker.counts


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
