"""What a game showed beyond its score, counted by observers that ``lib.games.play_games`` is given.

SeaQuest: voluntary refills, lives lost and lives lost to oxygen per game, read from the oxygen
gauge of the frames the actions were chosen on (``lib.seaquest``: the same tracker the teachers
use on segments). ``behaviour_observers(venv)`` gives the observers a venv's game has (none for
games this module does not know, or frames not at full resolution), first in the list a caller
hands to ``play_games``, so that later observers (04_play.py's console line) see the counts.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lib.games import EpisodeResult, GameObserver
from lib.seaquest import OxygenTracker, oxygen_levels, shows_gauge


class OxygenObserver:
    """One ``OxygenTracker`` per running game; the counts go to ``EpisodeResult.oxygen``."""

    def __init__(self, n_slots: int) -> None:
        self.trackers: list[OxygenTracker | None] = [None] * n_slots

    def started(self, slot: int, index: int) -> None:
        self.trackers[slot] = OxygenTracker()

    def stepped(self, slot: int, frame: np.ndarray, reward: float, pred: float | None, life_lost: bool) -> None:
        tracker = self.trackers[slot]
        if tracker is not None:
            tracker.step(int(oxygen_levels(frame)), life_lost)

    def finished(self, slot: int, res: EpisodeResult) -> None:
        tracker, self.trackers[slot] = self.trackers[slot], None
        if tracker is not None:
            res.oxygen = tracker.counts

    def aborted(self) -> None:
        self.trackers = [None] * len(self.trackers)


def behaviour_observers(venv: Any) -> list[GameObserver]:
    """The observers that count what ``venv``'s game shows beyond the score ([] when none)."""
    if shows_gauge(getattr(venv, "game", None), tuple(venv.frames.shape[1:])):
        return [OxygenObserver(venv.n_envs)]
    return []


def behaviour_stats(results: list[EpisodeResult]) -> dict[str, float]:
    """Voluntary refills and lives lost per game, and the share of lost lives lost to oxygen
    (0 when no life was lost); empty unless every game was tracked (SeaQuest)."""
    counts = [r.oxygen for r in results]
    if not counts or any(c is None for c in counts):
        return {}
    deaths = sum(c.deaths for c in counts if c is not None)
    oxygen_deaths = sum(c.oxygen_deaths for c in counts if c is not None)
    return {
        "refills_per_game": sum(c.refills for c in counts if c is not None) / len(counts),
        "deaths_per_game": deaths / len(counts),
        "oxygen_death_share": oxygen_deaths / deaths if deaths else 0.0,
    }


def format_behaviour(stats: dict[str, float]) -> str:
    """``behaviour_stats`` as a log fragment ('' when there are none)."""
    if "refills_per_game" not in stats:
        return ""
    return (
        f"refills {stats['refills_per_game']:.2f}/game, lives lost {stats['deaths_per_game']:.2f}/game "
        f"({100 * stats['oxygen_death_share']:.0f}% to oxygen)"
    )
