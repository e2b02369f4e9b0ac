"""SeaQuest's screen read by lib/atari/seaquest.py: the player's sub height (``sub_rows``), the divers
aboard (``divers_aboard``) and what the sub does with a low gauge, with divers and at the surface
(``SurfaceTracker``), on real ALE frames whose story is known, and every pixel reader against the
emulator's RAM. The gauge and ``OxygenTracker`` are tested in tests/test_teachers.py too."""

from __future__ import annotations

import numpy as np
import pytest

from bench.dbs import OXYGEN_DEATH_PLAN, OXYGEN_DEATH_STEP, cut, play_plan
from lib.atari.seaquest import (
    BOTTOM_ROW,
    CLIMB_EVENT_ROWS,
    LOW_OXYGEN,
    OXYGEN_FULL,
    SUB_YELLOW,
    SURFACE_ROW,
    SurfaceCounts,
    SurfaceTracker,
    divers_aboard,
    oxygen_levels,
    sub_rows,
    surface_counts,
)
from lib.store.segments import Segment

# SeaQuest action plans (seed, [(action, repeat)]) as in bench/dbs.py; ALE is deterministic there.
# DIVE: wait at the surface while the gauge fills, dive to the sea bed, rise 12 steps.
DIVE_PLAN = (1, [("NOOP", 32), ("DOWN", 28), ("UP", 12)])
# CLIMB: dive to row 134 and dodge there (firing left and right in turn) until the gauge is low
# (16 at step 416), then rise from step 486: the sub climbs 4 rows a step, reaches row 47 at step
# 508 with the gauge at 5, and refills from step 509 (it caught a diver on the way).
_DODGE = [("LEFTFIRE", 8), ("RIGHTFIRE", 8)] * 27
CLIMB_PLAN = (545, [("NOOP", 32), ("DOWN", 22), *_DODGE, ("UP", 40)])
CLIMB_START, CLIMB_TOP, CLIMB_REFILL = 486, 508, 509
# STAY: CLIMB's first 486 steps, then it goes on dodging at row 134 while the gauge runs out.
STAY_PLAN = (545, [("NOOP", 32), ("DOWN", 22), *_DODGE, *[("LEFTFIRE", 8), ("RIGHTFIRE", 8)] * 3])
# PARKED: pressing nothing, the sub floats at the surface for good, its gauge full from step 31.
PARKED_PLAN = (1, [("NOOP", 150)])
# DOOMED: CLIMB's seed, but the sub stays just under the surface firing left (no diver caught)
# until the gauge is low (16 at step 418, row 57), dives to row 110 and climbs back from step 448
# with no diver aboard: it reaches the surface and loses a life there (step 486), the gauge at 11.
DOOMED_PLAN = (545, [("NOOP", 32), ("DOWN", 2), ("LEFTFIRE", 400), ("DOWN", 14), ("UP", 60)])
DOOMED_DEATH = 486
# RAM indices (the AtariARI annotations): divers collected, the player's y, oxygen.
RAM_DIVERS, RAM_PLAYER_Y, RAM_OXYGEN = 62, 97, 102


@pytest.fixture(scope="module")
def dive() -> Segment:
    return play_plan(DIVE_PLAN)


@pytest.fixture(scope="module")
def climb() -> Segment:
    return play_plan(CLIMB_PLAN)


@pytest.fixture(scope="module")
def oxygen_death() -> Segment:
    return play_plan(OXYGEN_DEATH_PLAN)


@pytest.fixture(scope="module")
def parked() -> Segment:
    return play_plan(PARKED_PLAN)


def test_sub_rows_follow_a_dive_and_a_rise(dive: Segment) -> None:
    rows = sub_rows(dive.frames)
    assert rows.shape == (len(dive),) and rows.dtype == np.int16
    # At the surface while the gauge fills (33 steps), then down 4 rows a step to the sea bed ...
    assert rows[:33].tolist() == [SURFACE_ROW] * 33
    down = rows[33:56]
    assert (np.diff(down) > 0).all() and rows[34] == 57 and (np.diff(down[3:]) == 4).all()
    assert rows[56:61].tolist() == [BOTTOM_ROW] * 5  # it cannot go deeper
    # ... and up 4 rows a step from step 61, when UP has been pressed for one step.
    assert rows[60:].tolist() == [BOTTOM_ROW, *range(138, 97, -4)]
    # One frame gives one row; a frame without the sub gives -1; other shapes are refused.
    assert sub_rows(dive.frames[40]) == rows[40] and sub_rows(dive.frames[40]).shape == ()
    assert sub_rows(np.zeros((210, 160, 3), np.uint8)) == -1
    with pytest.raises(ValueError, match="210x160"):
        sub_rows(np.zeros((5, 84, 84, 3), np.uint8))


def test_nothing_else_has_the_subs_colour(climb: Segment) -> None:
    """530 frames with enemies, divers, torpedoes, a refill and the score: every pixel of the
    sub's yellow lies in the sub's own rows (at most 11 from the top row read)."""
    yellow = (climb.frames == SUB_YELLOW).all(-1).any(-1)  # (T, 210): rows holding the colour
    rows = sub_rows(climb.frames)
    assert (rows >= SURFACE_ROW).all()
    for t in range(len(climb)):
        held = np.flatnonzero(yellow[t])
        assert held.min() == rows[t] and held.max() <= rows[t] + 10, t


def test_a_low_gauge_climb_is_counted(climb: Segment) -> None:
    levels, rows = oxygen_levels(climb.frames), sub_rows(climb.frames)
    first_low = int(np.flatnonzero((levels <= LOW_OXYGEN) & (np.arange(len(levels)) > 100))[0])
    assert first_low == 416 and rows[first_low : CLIMB_START + 1].tolist() == [134] * (CLIMB_START + 1 - first_low)
    assert rows[CLIMB_TOP] == 47 and levels[CLIMB_TOP] == 5 and levels[CLIMB_REFILL] > levels[CLIMB_TOP]
    counts = surface_counts(climb.frames, climb.dones)
    # The whole game: one low-gauge stretch (steps 416-508), climbed from row 134 to row 47.
    assert counts.low_steps == CLIMB_TOP + 1 - first_low
    assert counts.climb_rows == 134 - 47 and counts.low_climbs == 1
    # The start of the game (the gauge filling at the surface) is not low, and no climb.
    assert surface_counts(climb.frames[:60], None) == SurfaceCounts(steps=60, surface_steps=33, idle_steps=2)
    # Part way (rows 131, 127, ... after step 486): a climb of 23 rows is not yet a low-gauge
    # climb event; 27 is (CLIMB_EVENT_ROWS, 24).
    part = [surface_counts(climb.frames[400 : CLIMB_START + 1 + k], None) for k in (6, 7)]
    assert [(p.climb_rows, p.low_climbs) for p in part] == [(23, 0), (27, 1)] and CLIMB_EVENT_ROWS == 24
    tracker = SurfaceTracker()
    for level, row in ((12, 100), (12, 100), (11, 76)):
        tracker.step(level, row, False, 0)
    assert (tracker.counts.climb_rows, tracker.counts.low_climbs) == (24, 1)  # 24 rows: an event
    for level, row in ((11, 70), (10, 100), (10, 60)):
        tracker.step(level, row, False, 0)
    assert (tracker.counts.climb_rows, tracker.counts.low_climbs) == (40, 1)  # the same stretch: no other


def test_diving_and_coming_back_is_no_climb(climb: Segment) -> None:
    """Progress toward the surface counts from where the gauge was first seen low: a record whose
    low stretch starts during the climb counts the climb from there."""
    tracker = SurfaceTracker()
    # The first reading is not judged (filling or draining?); then down 20 rows and back up 20.
    for level, row in ((11, 100), (10, 100), (10, 120), (9, 110), (9, 100)):
        tracker.step(level, row, False, 0)
    assert tracker.counts.climb_rows == 0 and tracker.counts.low_steps == 4
    tracker.step(9, 90, False, 0)
    assert tracker.counts.climb_rows == 10
    tracker.step(-1, -1, False, 0)  # no reading (a frame between lives) changes nothing
    assert tracker.counts.low_steps == 5
    tracker.step(9, 95, True, 0)  # a life lost ends the stretch: the next row starts a new one
    tracker.step(9, 60, False, 0)
    assert tracker.counts.climb_rows == 10 and tracker.counts.low_steps == 7
    late = surface_counts(climb.frames[CLIMB_START + 10 : CLIMB_REFILL], None)
    assert late.climb_rows == sub_rows(climb.frames[CLIMB_START + 11]) - 47  # the first reading is not judged


def test_a_new_life_is_a_new_stretch(oxygen_death: Segment) -> None:
    """The sub runs out of oxygen just under the surface (row 57); the next sub waits at the surface
    (row 46) while its gauge fills from empty: that is neither low nor a climb of 11 rows."""
    t = OXYGEN_DEATH_STEP
    rows, levels = sub_rows(oxygen_death.frames), oxygen_levels(oxygen_death.frames)
    assert rows[t - 30] == 57 and 0 < levels[t - 30] <= LOW_OXYGEN and rows[-1] == SURFACE_ROW
    counts = surface_counts(oxygen_death.frames, oxygen_death.dones)
    assert counts.climb_rows == 0 and counts.low_climbs == 0
    # Read from the new sub's first frames on: the filling gauge is low by its level, not by its trend.
    after = cut(oxygen_death, t + 1, len(oxygen_death))
    assert (levels[t + 1 :] <= LOW_OXYGEN).sum() > 3
    assert surface_counts(after.frames, after.dones).low_steps == 0


def test_a_sub_parked_at_the_surface_is_idle(parked: Segment) -> None:
    levels = oxygen_levels(parked.frames)
    full = int(np.flatnonzero(levels == OXYGEN_FULL)[0])
    assert full == 31 and (levels[full:] == OXYGEN_FULL).all()  # at the surface the gauge stays full
    counts = surface_counts(parked.frames, parked.dones)
    assert counts == SurfaceCounts(steps=150, surface_steps=150, idle_steps=150 - full)
    # The tracker one step at a time is what the games played use: the same counts.
    tracker = SurfaceTracker()
    for level, row in zip(levels.tolist(), sub_rows(parked.frames).tolist(), strict=True):
        tracker.step(level, row, False, 0)
    assert tracker.counts == counts


def test_pixel_readers_match_the_emulators_ram() -> None:
    """3,000 steps of seeded random play (an action held 8 steps) in a real SeaQuest env: the
    divers aboard, the gauge and the sub's row read from the screen against the RAM."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    env = gym.make("SeaquestNoFrameskip-v4", frameskip=4, repeat_action_probability=0.0)
    rng = np.random.default_rng(0)
    seen: dict[str, list[tuple[int, int]]] = {"divers": [], "oxygen": [], "row": []}
    try:
        frame, _ = env.reset(seed=3)
        ale, action = env.unwrapped.ale, 0
        for t in range(3000):
            ram = ale.getRAM()
            seen["divers"].append((int(ram[RAM_DIVERS]), int(divers_aboard(frame))))
            seen["oxygen"].append((min(int(ram[RAM_OXYGEN]), OXYGEN_FULL), int(oxygen_levels(frame))))
            seen["row"].append((int(ram[RAM_PLAYER_Y]) + 33, int(sub_rows(frame))))
            if t % 8 == 0:
                action = int(rng.integers(18))
            frame, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                frame, _ = env.reset()
    finally:
        env.close()
    divers = np.array(seen["divers"])
    assert (divers[:, 0] == divers[:, 1]).all()
    assert set(divers[:, 0].tolist()) == {0, 1, 2}  # random play picks up two divers at most here
    oxygen = np.array(seen["oxygen"])
    assert (oxygen[:, 0] == oxygen[:, 1]).all()  # RAM holds 64 for a full tank: the bar's 63 pixels
    rows = np.array(seen["row"])
    drawn = rows[:, 1] >= 0
    assert drawn.sum() > 2000
    ram_row, row = rows[drawn].T
    # Just under the surface (RAM y 20-23) the water line hides the sub's top: it reads row 57.
    hidden = (row == 57) & (ram_row > SURFACE_ROW) & (ram_row < 57)
    assert ((row == ram_row) | hidden).all() and 0 < hidden.sum() < 100


def test_divers_aboard_a_climb_and_a_rescue(climb: Segment) -> None:
    """CLIMB picks up a diver at step 182 and keeps it: the low-gauge climb from row 134 to row 47
    is made with a diver aboard, and the diver is one rescue."""
    divers = divers_aboard(climb.frames)
    assert divers[:182].max() == 0 and (divers[182:] == 1).all()
    assert divers_aboard(climb.frames[200]) == 1  # one frame -> a number
    counts = surface_counts(climb.frames, climb.dones)
    assert counts.rescues == 1 and counts.diver_steps == len(climb) - 182
    assert counts.diver_climb_rows == counts.climb_rows == 134 - 47
    assert counts.low_diver_steps == counts.low_steps
    # The same climb read without the diver (a frame cut before step 182 has none): no diver climb.
    tracker = SurfaceTracker()
    for level, row, d in ((12, 100, 0), (12, 100, 0), (11, 76, 0), (11, 70, 1), (10, 60, 1)):
        tracker.step(level, row, False, d)
    c = tracker.counts
    assert (c.climb_rows, c.diver_climb_rows, c.rescues, c.diver_steps, c.low_diver_steps) == (40, 16, 1, 2, 2)
    tracker.step(10, 58, False, 0)  # a refill takes a diver off: not a rescue, and no diver climb
    tracker.step(10, 56, False, 1)  # picked up again: a second rescue
    assert (c.climb_rows, c.diver_climb_rows, c.rescues) == (44, 18, 2)


def test_climbing_with_no_diver_ends_in_a_death() -> None:
    """The game's surfacing rule on real frames: a low-gauge sub with no diver aboard that climbs
    to the surface loses a life there, with oxygen left (not an oxygen death)."""
    doomed = play_plan(DOOMED_PLAN)
    levels, rows = oxygen_levels(doomed.frames), sub_rows(doomed.frames)
    assert divers_aboard(doomed.frames).max() == 0
    assert np.flatnonzero(doomed.dones).tolist() == [DOOMED_DEATH]
    assert rows[448] == 110 and rows[463] <= 51 and 0 < levels[463] <= LOW_OXYGEN
    counts = surface_counts(doomed.frames, doomed.dones)
    # The low stretch began at row 57: the climb counts from there to the surface's 47, with no diver.
    assert rows[418] == 57 and counts.climb_rows == 57 - 47 and counts.diver_climb_rows == 0
