"""SeaQuest's screen, read: the oxygen gauge, and what a stretch of play did with it. Used by the
teachers (``lib.teachers``) and, as a ``GameObserver``-side tracker, by the games played
(``lib.behaviour``).

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

The player's sub (``sub_rows``): drawn in yellow (187, 187, 53), the only thing in the water that
colour besides its own torpedo, which flies in the sub's rows (the score and the reserve subs at
the top are a paler yellow, (210, 210, 64); checked on 16,600 agent frames and 10,000 random-play
frames: every yellow pixel lies in rows 46-151, at most 11 rows from the topmost). Its top row is
``SURFACE_ROW`` (46) when it floats at the surface, 57 just under it, ``BOTTOM_ROW`` (141) at the
sea bed; it moves 4 rows per agent step (frameskip 4). At the surface the gauge stays full.

What the sub does with a low gauge and at the surface, followed step by step (``SurfaceTracker``):

- **low gauge**: 0 < level <= ``LOW_OXYGEN`` (16 of 63) and not above the reading before. 16 is
  where the game itself warns (the white part starts to blink): what a person watching the clip
  notices, and still 128 agent steps of air, five times the 24 steps a sub needs to rise from the
  sea bed. A gauge filling after a respawn or during a refill rises, so it is not low; the first
  reading of a record (none before it to tell filling from draining) is not judged.
- **climb**: over a stretch of low-gauge steps (it ends when the gauge rises or a life is lost),
  the rows between the sub's row at the stretch's first step and the highest point it reaches
  later in the stretch, ``max(0, first row - min row)``: progress toward the surface. Diving and
  coming back to the same depth is no progress; the new sub of the next life starts a new stretch.
  A **low-gauge climb** (an event, once per stretch) is a climb of at least ``CLIMB_EVENT_ROWS``
  (24 rows: 6 steps up, a quarter of the water's depth, not jitter or a dodge).
- **idle at the surface**: the sub's top row at ``SURFACE_ROW`` with a full gauge
  (``IDLE_LEVEL`` = 63). Neither a new sub nor a refilling one can leave the surface before its
  gauge is full (pressing DOWN throughout, it dives the step after), so the forced waits count at
  most one step: what is counted is a sub that could dive and does not (the book's third round
  ended with one parked there; pressing nothing, a sub stays at the surface, its gauge full, for
  good).

Divers aboard (``divers_aboard``): drawn under the gauge, rows 178-186, in blue (24, 26, 167), 8
columns per diver from column 58 (one diver: columns 58-65, two: 58-73, up to six). Checked
against the emulator's RAM (index 62, divers collected) on every step of 6,000 random-play steps:
the count read from the screen equals the RAM's on each. They matter because of the game's
surfacing rule (its routine ``CheckForSeaquestSubSurfacing``): a sub that reaches the surface with
oxygen below full loses a life with no diver aboard, refills its oxygen and gives up one diver
(for no points) with 1-5 aboard, and turns the oxygen into points with 6. So heading up with a low
gauge is progress only with a diver aboard, and the ``SurfaceTracker`` also counts:

- **diver climb**: the rows of a low-gauge climb made while at least one diver is aboard (the
  climb that ends in a refill rather than a death);
- **rescue**: the divers aboard going up (one per diver picked up; a refill or a lost life takes
  them down, which is no rescue);
- **diver steps**: steps with a diver aboard, and **low diver steps**: those with a low gauge too
  (the clips a person wants the sub to climb in);
- **surfacing death**: a life lost where the sub was last drawn above ``SURFACED_ROW`` (at the
  surface or on its last step up) with no diver aboard and a gauge that had not run out: the
  surfacing rule took it. While it dies the sub is not drawn (about 20 agent steps, the gauge
  showing empty for the last 13), so its last drawn row is where the life ended: 49 for a sub
  that came up with no diver, the row it was hit in for a sub an enemy hit (checked on scripted
  real games, tests/test_behaviour.py).
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
SUB_YELLOW = (187, 187, 53)  # the player's sub and its torpedo
SUB_SEARCH_ROWS = slice(40, 160)  # the water, from above the surface to the sea bed
SURFACE_ROW = 46  # the sub's top row when it floats at the surface
SURFACED_ROW = 57  # last drawn above this row (57: just under the surface) when a life ends: it ended at the surface
BOTTOM_ROW = 141  # its top row at the sea bed
LOW_OXYGEN = 16  # a gauge at or below this (and above 0) is low: where the game starts to blink it
CLIMB_EVENT_ROWS = 24  # a low-gauge stretch whose climb reaches this many rows is a low-gauge climb
IDLE_LEVEL = OXYGEN_FULL  # at the surface with the gauge at least this full: idle
DIVERS_ROWS = slice(178, 187)  # the divers-aboard row under the gauge
DIVERS_COL0 = 58  # the first diver's first column
DIVER_COLS = 8  # columns per diver drawn
MAX_DIVERS = 6
DIVER_BLUE = (24, 26, 167)


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


def low_gauge(frames: np.ndarray) -> np.ndarray:
    """(N, 210, 160, 3) frames -> (N,) bool: the gauge shows 0 < level <= LOW_OXYGEN (draining or
    filling alike: one frame cannot tell)."""
    level = oxygen_levels(frames)
    return (level > 0) & (level <= LOW_OXYGEN)


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


def sub_rows(frames: np.ndarray) -> np.ndarray:
    """(T, 210, 160, 3) or (210, 160, 3) uint8 frames -> (T,) or () int16: the top row of the
    player's sub (``SURFACE_ROW`` at the surface, ``BOTTOM_ROW`` at the sea bed), -1 where it is
    not drawn (dead, between lives)."""
    frames = np.asarray(frames)
    if frames.ndim < 3 or frames.shape[-3:] != FRAME_SHAPE:
        raise ValueError(f"sub_rows needs 210x160 RGB frames, got shape {frames.shape}")
    water = frames[..., SUB_SEARCH_ROWS, :, :]
    yellow = water[..., 2] == SUB_YELLOW[2]  # channel by channel: 5x faster than .all(-1) on RGB
    yellow &= water[..., 0] == SUB_YELLOW[0]
    yellow &= water[..., 1] == SUB_YELLOW[1]
    yellow = yellow.any(-1)  # (..., rows): the rows holding the colour
    return np.where(yellow.any(-1), yellow.argmax(-1) + SUB_SEARCH_ROWS.start, -1).astype(np.int16)


def divers_aboard(frames: np.ndarray) -> np.ndarray:
    """(T, 210, 160, 3) or (210, 160, 3) uint8 frames -> (T,) or () int16: divers aboard, 0-6
    (the slots under the gauge that hold a diver's colour)."""
    frames = np.asarray(frames)
    if frames.ndim < 3 or frames.shape[-3:] != FRAME_SHAPE:
        raise ValueError(f"divers_aboard needs 210x160 RGB frames, got shape {frames.shape}")
    cols = slice(DIVERS_COL0, DIVERS_COL0 + MAX_DIVERS * DIVER_COLS)
    region = frames[..., DIVERS_ROWS, cols, :]
    blue = region[..., 2] == DIVER_BLUE[2]
    blue &= region[..., 0] == DIVER_BLUE[0]
    blue &= region[..., 1] == DIVER_BLUE[1]
    slots = blue.any(-2).reshape(*blue.shape[:-2], MAX_DIVERS, DIVER_COLS).any(-1)
    return slots.sum(-1).astype(np.int16)


@dataclass
class SurfaceCounts:
    """What the sub did with a low gauge and at the surface (module docstring: the definitions)."""

    steps: int = 0  # steps seen
    surface_steps: int = 0  # the sub at the surface, whatever its gauge
    idle_steps: int = 0  # at the surface with a full gauge
    low_steps: int = 0  # steps with a low gauge
    climb_rows: int = 0  # rows climbed toward the surface with a low gauge, summed over the stretches
    low_climbs: int = 0  # stretches whose climb reached CLIMB_EVENT_ROWS
    diver_steps: int = 0  # steps with at least one diver aboard
    low_diver_steps: int = 0  # steps with a low gauge and a diver aboard
    diver_climb_rows: int = 0  # the part of climb_rows climbed with a diver aboard
    rescues: int = 0  # divers picked up (the count aboard going up)
    surfacing_deaths: int = 0  # lives lost by coming up with no diver aboard (the surfacing rule)


@dataclass
class SurfaceTracker:
    """Follows the sub's row and the gauge one agent step at a time (module docstring: the rules)."""

    counts: SurfaceCounts = field(default_factory=SurfaceCounts)
    _last: int | None = None  # last level read
    _start: int | None = None  # the sub's row at the current low-gauge stretch's first step
    _top: int = 0  # the highest point (smallest row) reached in the stretch
    _counted: bool = False  # the stretch's low-gauge climb is counted
    _divers: int | None = None  # divers aboard at the last step
    _seen: tuple[int, int, int] | None = None  # (row, divers, level) where the sub was last drawn this life

    def step(self, level: int, row: int, life_lost: bool, divers: int) -> None:
        """``level``: the gauge (``oxygen_levels``, -1: no reading), ``row``: the sub's top row
        (``sub_rows``, -1: not drawn) and ``divers``: divers aboard (``divers_aboard``), all in the
        frame the action was chosen on; ``life_lost``: the step ended a life (or the game)."""
        c = self.counts
        c.steps += 1
        c.diver_steps += divers > 0
        if self._divers is not None and divers > self._divers:
            c.rescues += divers - self._divers
        self._divers = divers
        if row == SURFACE_ROW:
            c.surface_steps += 1
            c.idle_steps += level >= IDLE_LEVEL
        if level >= 0:
            judged = self._last is not None and level <= self._last  # not filling
            self._last = level
            if not judged or not 0 < level <= LOW_OXYGEN:
                self._start = None
            else:
                c.low_steps += 1
                c.low_diver_steps += divers > 0
                if row >= 0:
                    self._climb(row, divers > 0)
        if row >= 0:
            self._seen = (row, divers, level)
        if life_lost:
            self._start = None
            if self._seen is not None:
                seen_row, seen_divers, seen_level = self._seen
                c.surfacing_deaths += seen_row < SURFACED_ROW and seen_divers == 0 and seen_level > OXYGEN_EMPTY_MAX
            self._seen = None

    def _climb(self, row: int, diver: bool) -> None:
        if self._start is None:
            self._start, self._top, self._counted = row, row, False
        elif row < self._top:
            self.counts.climb_rows += self._top - row
            self.counts.diver_climb_rows += (self._top - row) * diver
            self._top = row
        if not self._counted and self._start - self._top >= CLIMB_EVENT_ROWS:
            self.counts.low_climbs += 1
            self._counted = True


def surface_counts(frames: np.ndarray, life_lost: np.ndarray | None) -> SurfaceCounts:
    """Low-gauge climbs, surface steps and divers in a record of consecutive steps (a segment)."""
    tracker = SurfaceTracker()
    lost = np.zeros(len(frames), dtype=bool) if life_lost is None else np.asarray(life_lost, dtype=bool)
    readings = (oxygen_levels(frames).tolist(), sub_rows(frames).tolist(), divers_aboard(frames).tolist())
    for level, row, divers, dead in zip(*readings, lost.tolist(), strict=True):
        tracker.step(level, row, dead, divers)
    return tracker.counts
