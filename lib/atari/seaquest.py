"""SeaQuest's screen, read: the oxygen gauge, the player's sub, the divers aboard, and what a
stretch of play did with them (``OxygenTracker``, ``SurfaceTracker``). One reader for recorded clips
(``lib.models.teachers``) and games being played (``lib.atari.behaviour``). The gauge's white part blinks when
oxygen runs low, so the level is read from the red part: ``63 - red pixels``. Every pixel position,
colour and event rule, and how each was checked: docs/reference.md."""

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
HIGH_OXYGEN = 42  # a gauge at least this (two thirds full) is high: a climb there is not for air
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


def in_gauge_band(levels: np.ndarray | int, gauge: str) -> np.ndarray | bool:
    """Gauge levels (``oxygen_levels``) in the ``gauge`` band: "low" (0 < level <= LOW_OXYGEN) or
    "high" (at least HIGH_OXYGEN)."""
    levels = np.asarray(levels)
    return levels >= HIGH_OXYGEN if gauge == "high" else (levels > 0) & (levels <= LOW_OXYGEN)


def low_gauge(frames: np.ndarray) -> np.ndarray:
    """(N, 210, 160, 3) frames -> (N,) bool: the gauge shows 0 < level <= LOW_OXYGEN (draining or
    filling alike: one frame cannot tell)."""
    return in_gauge_band(oxygen_levels(frames), "low")


@dataclass
class OxygenCounts:
    """What a stretch of play showed: voluntary refills, lives lost, lives lost to oxygen."""

    refills: int = 0
    deaths: int = 0
    oxygen_deaths: int = 0


@dataclass
class OxygenTracker:
    """Follows the gauge one agent step at a time (the rules: docs/reference.md)."""

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
    """What the sub did with a low gauge and at the surface (the definitions: docs/reference.md)."""

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
    """Follows the sub's row and the gauge one agent step at a time (the rules: docs/reference.md)."""

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


# --- the surface rule's pay, per step ---------------------------------------------------------------


@dataclass(frozen=True)
class StepPay:
    """What the surface rule pays each step of a record of consecutive steps, (T,) arrays, each step
    paid for what its action led to (the move from its frame to the next): ``pay`` float32, the
    score's sign + 1 on a climb step + 1 on a refill step; ``climb`` bool, the sub rose with a low
    gauge and a diver aboard (``SurfaceCounts.diver_climb_rows`` grew on the next frame); ``refill``
    bool, the gauge began to rise from above 0 (``OxygenCounts.refills`` grew on the next frame);
    ``low_diver`` bool, the step's own frame shows a low gauge, not filling, with a diver aboard
    (``SurfaceCounts.low_diver_steps``): where the climb's pay lives; ``moves`` int8, on those
    steps +1 where the sub rose from the step's frame to the next and -1 where it sank (0 elsewhere):
    a climb as a function of the step alone, where ``climb`` pays a rise above the stretch's highest
    point so far (history a reward model of one step does not see). A clip's last step shows no next
    frame: its climb, refill and move are nothing (the reward model's input shows no change there)."""

    pay: np.ndarray
    climb: np.ndarray
    refill: np.ndarray
    low_diver: np.ndarray
    moves: np.ndarray

    @property
    def total(self) -> float:
        return float(np.sum(self.pay, dtype=np.float64))

    @property
    def moves_pay(self) -> np.ndarray:
        """The pay with ``moves`` in place of ``climb``: (T,) float32."""
        return (self.pay - self.climb + self.moves).astype(np.float32)


@dataclass
class PayTracker:
    """The one owner of the surface rule's per-step pay (``StepPay``): an ``OxygenTracker`` and a
    ``SurfaceTracker`` followed together, one agent step at a time, for a recorded clip
    (``step_pay``) and for games being played (``experiments.refill_levers``, which reads the frame
    each action was chosen on, so it pays a climb on the step after the move: n-step returns carry
    it back one step)."""

    oxygen: OxygenTracker = field(default_factory=OxygenTracker)
    surface: SurfaceTracker = field(default_factory=SurfaceTracker)

    def step(self, level: int, row: int, divers: int, life_lost: bool) -> tuple[bool, bool, bool]:
        """The readings of the frame the action was chosen on (``oxygen_levels``, ``sub_rows``,
        ``divers_aboard``) and whether the step ended a life -> (climb, refill, low_diver) of the step."""
        ox, sf = self.oxygen.counts, self.surface.counts
        refills, climbed, low_divers = ox.refills, sf.diver_climb_rows, sf.low_diver_steps
        self.oxygen.step(level, life_lost)
        self.surface.step(level, row, life_lost, divers)
        return sf.diver_climb_rows > climbed, ox.refills > refills, sf.low_diver_steps > low_divers


def step_pay(frames: np.ndarray, rewards: np.ndarray | None, life_lost: np.ndarray | None) -> StepPay:
    """The surface rule's pay of each step of a clip (``StepPay``): (T, 210, 160, 3) frames, the true
    rewards (None: the score adds nothing) and the steps that ended a life or the game."""
    t = len(frames)
    lost = np.zeros(t, dtype=bool) if life_lost is None else np.asarray(life_lost, dtype=bool)
    tracker = PayTracker()
    seen = np.zeros((3, t), dtype=bool)  # what the trackers saw on reading each frame
    readings = (oxygen_levels(frames).tolist(), sub_rows(frames).tolist(), divers_aboard(frames).tolist())
    for i, (level, row, divers, dead) in enumerate(zip(*readings, lost.tolist(), strict=True)):
        seen[:, i] = tracker.step(level, row, divers, dead)
    # A climb or a refill is seen on the frame after the move that made it: paid to the step before.
    # (The trackers never see one on a clip's first frame, so a clip's sums are the trackers' counts.)
    climb = np.append(seen[0, 1:], False)
    refill = np.append(seen[1, 1:], False)
    rows = np.asarray(readings[1], dtype=np.int64)
    drawn = (rows[1:] >= 0) & (rows[:-1] >= 0)
    moves = np.append(np.sign(rows[:-1] - rows[1:]) * drawn * seen[2, :-1], 0).astype(np.int8)
    score = np.zeros(t, dtype=np.float32) if rewards is None else np.sign(np.asarray(rewards, dtype=np.float32))
    return StepPay(score + climb + refill, climb, refill, seen[2], moves)
