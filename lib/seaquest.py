"""SeaQuest's screen, read: the oxygen gauge, and what a stretch of play did with it. Used by the
teachers (``lib.teachers``) and, as a ``GameObserver``-side tracker, by the games played
(``lib.games``, ``lib.play``).

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

from dataclasses import dataclass, field

import numpy as np

GAUGE_ROWS = slice(170, 175)
GAUGE_COLS = slice(40, 120)
GAUGE_RED = (163, 57, 21)
GAUGE_WHITE = (214, 214, 214)
OXYGEN_FULL = 63
OXYGEN_EMPTY_MAX = 2  # last level seen before the gauge emptied, at most this: the oxygen ran out
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
