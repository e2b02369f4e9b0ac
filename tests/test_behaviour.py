"""lib/atari/behaviour.py: what real SeaQuest games show beyond the score, counted by the observer that
play_games is given, the same as the segment functions count on the same frames."""

import numpy as np

from lib.atari.behaviour import OxygenObserver, behaviour_observers, behaviour_stats
from lib.atari.envs import AtariVec
from lib.atari.games import EpisodeResult, play_games
from lib.atari.seaquest import oxygen_counts, surface_counts

NOOP, DOWN, UP = 0, 5, 2  # SeaQuest's action indices (full action set)


class Frames:
    """Keeps every frame and life loss a game showed (another observer, after the counting one)."""

    def __init__(self) -> None:
        self.frames: list[np.ndarray] = []
        self.lost: list[bool] = []

    def started(self, slot: int, index: int) -> None: ...

    def stepped(self, slot, frame, reward, pred, life_lost) -> None:
        self.frames.append(frame.copy())
        self.lost.append(life_lost)

    def finished(self, slot: int, res: EpisodeResult) -> None:
        self.seen = (res.oxygen, res.surface)  # filled in by the observer before this one

    def aborted(self) -> None: ...


def test_the_observer_counts_a_real_game_as_the_segment_functions_do() -> None:
    venv = AtariVec(n_envs=1, seed=3, noop_max=0, num_threads=1)
    plan = iter([DOWN] * 90 + [UP] * 90)
    try:
        observers = behaviour_observers(venv)
        assert [type(o) for o in observers] == [OxygenObserver]
        keep = Frames()
        results = play_games(venv, lambda obs: np.array([next(plan)]), 1, observers=[*observers, keep], max_steps=180)
    finally:
        venv.close()
    assert results is not None and len(keep.frames) == 180
    res = results[0]
    frames, lost = np.stack(keep.frames), np.array(keep.lost)
    assert res.oxygen == oxygen_counts(frames, lost) and res.surface == surface_counts(frames, lost)
    assert keep.seen == (res.oxygen, res.surface)  # later observers see the counts
    assert res.surface.steps == 180 and 0 < res.surface.surface_steps < 180  # starts at the surface, dives
    stats = behaviour_stats(results)
    assert stats["surface_share"] == res.surface.surface_steps / 180
    assert stats["low_climbs_per_game"] == res.surface.low_climbs


def test_games_without_a_gauge_get_no_observer() -> None:
    class Venv:
        game, n_envs = "breakout", 2
        frames = np.zeros((2, 210, 160, 3), dtype=np.uint8)

    assert behaviour_observers(Venv()) == []
    Venv.game = "seaquest"
    assert len(behaviour_observers(Venv())) == 1
    Venv.frames = np.zeros((2, 105, 80, 3), dtype=np.uint8)  # downscaled: no gauge to read
    assert behaviour_observers(Venv()) == []


def test_the_observer_counts_a_rescued_diver() -> None:
    """REFILL_PLAN picks up a diver at step 102 and surfaces with it (a refill at 146, the diver
    given up at 153): one rescue, the steps with a diver aboard, in the game's figures."""
    from bench.dbs import REFILL_PLAN

    seed, steps = REFILL_PLAN
    venv = AtariVec(n_envs=1, seed=seed, noop_max=0, num_threads=1)
    try:
        index = {name: i for i, name in enumerate(venv.action_meanings)}
        plan = iter([index[a] for a, n in steps for _ in range(n)])
        length = sum(n for _, n in steps)
        act = lambda obs: np.array([next(plan)])  # noqa: E731
        results = play_games(venv, act, 1, observers=behaviour_observers(venv), max_steps=length)
    finally:
        venv.close()
    assert results is not None
    res = results[0]
    assert (res.surface.rescues, res.surface.diver_steps, res.oxygen.refills) == (1, 153 - 102, 1)
    assert res.oxygen.deaths == 0 and res.surface.surfacing_deaths == 0  # up with a diver: a refill, no death
    stats = behaviour_stats(results)
    assert stats["rescues_per_game"] == 1 and stats["diver_share"] == (153 - 102) / length


def _scripted_game(seed: int, plan: list[int]) -> EpisodeResult:
    venv = AtariVec(n_envs=1, seed=seed, noop_max=0, num_threads=1)
    try:
        actions = iter(plan)
        results = play_games(
            venv, lambda obs: np.array([next(actions)]), 1, observers=behaviour_observers(venv), max_steps=len(plan)
        )
    finally:
        venv.close()
    assert results is not None
    return results[0]


def test_a_sub_that_comes_up_with_no_diver_is_a_surfacing_death_and_one_hit_deep_is_not() -> None:
    """Real games: a sub that dives (its gauge full after the first ~31 steps' wait) and comes
    straight back up with no diver aboard loses its life at the surface (step 70); one that
    dives to row 100 and waits there, no diver aboard either, is hit by an enemy (step 142)."""
    up = _scripted_game(3, [DOWN] * 40 + [UP] * 40)
    assert (up.oxygen.deaths, up.oxygen.oxygen_deaths, up.surface.surfacing_deaths) == (1, 0, 1)
    deep = _scripted_game(1, [DOWN] * 45 + [NOOP] * 100)
    assert (deep.oxygen.deaths, deep.oxygen.oxygen_deaths, deep.surface.surfacing_deaths) == (1, 0, 0)
    stats = behaviour_stats([up, deep])
    assert stats["deaths_per_game"] == 1 and stats["surfacing_death_share"] == 0.5
