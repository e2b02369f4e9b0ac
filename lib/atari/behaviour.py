"""What a game showed beyond its score, counted by observers ``lib.atari.games.play_games`` is given: for
SeaQuest, refills, lives lost (to oxygen, surfacing), low-gauge climbs, rescues and time with a
diver aboard, read by the trackers the teachers use (``lib.atari.seaquest``). ``behaviour_observers`` goes
first in a caller's list, so later observers see the counts."""

from __future__ import annotations

from typing import Any

import numpy as np

from lib.atari.games import EpisodeResult, GameObserver
from lib.atari.seaquest import OxygenTracker, SurfaceTracker, divers_aboard, oxygen_levels, shows_gauge, sub_rows


class OxygenObserver:
    """One ``OxygenTracker`` and one ``SurfaceTracker`` per running game; the counts go to
    ``EpisodeResult.oxygen`` and ``EpisodeResult.surface``."""

    def __init__(self, n_slots: int) -> None:
        self.trackers: list[tuple[OxygenTracker, SurfaceTracker] | None] = [None] * n_slots

    def started(self, slot: int, index: int) -> None:
        self.trackers[slot] = (OxygenTracker(), SurfaceTracker())

    def stepped(self, slot: int, frame: np.ndarray, reward: float, pred: float | None, life_lost: bool) -> None:
        trackers = self.trackers[slot]
        if trackers is not None:
            level = int(oxygen_levels(frame))
            trackers[0].step(level, life_lost)
            trackers[1].step(level, int(sub_rows(frame)), life_lost, int(divers_aboard(frame)))

    def finished(self, slot: int, res: EpisodeResult) -> None:
        trackers, self.trackers[slot] = self.trackers[slot], None
        if trackers is not None:
            res.oxygen, res.surface = trackers[0].counts, trackers[1].counts

    def aborted(self) -> None:
        self.trackers = [None] * len(self.trackers)


def behaviour_observers(venv: Any) -> list[GameObserver]:
    """The observers that count what ``venv``'s game shows beyond the score ([] when none)."""
    if shows_gauge(getattr(venv, "game", None), tuple(venv.frames.shape[1:])):
        return [OxygenObserver(venv.n_envs)]
    return []


def behaviour_stats(results: list[EpisodeResult]) -> dict[str, float]:
    """Refills and lives lost per game, the shares of lost lives lost to oxygen and surfacing with
    no diver, low-gauge climbs and rescues per game, the shares of steps at the surface and with a
    diver aboard; empty unless every game was tracked (SeaQuest)."""
    counts = [r.oxygen for r in results]
    if not counts or any(c is None for c in counts):
        return {}
    deaths = sum(c.deaths for c in counts if c is not None)
    oxygen_deaths = sum(c.oxygen_deaths for c in counts if c is not None)
    stats = {
        "refills_per_game": sum(c.refills for c in counts if c is not None) / len(counts),
        "deaths_per_game": deaths / len(counts),
        "oxygen_death_share": oxygen_deaths / deaths if deaths else 0.0,
    }
    surface = [r.surface for r in results]
    if all(c is not None for c in surface):
        steps = sum(c.steps for c in surface if c is not None)
        stats["low_climbs_per_game"] = sum(c.low_climbs for c in surface if c is not None) / len(surface)
        stats["surface_share"] = sum(c.surface_steps for c in surface if c is not None) / steps if steps else 0.0
        stats["rescues_per_game"] = sum(c.rescues for c in surface if c is not None) / len(surface)
        stats["diver_share"] = sum(c.diver_steps for c in surface if c is not None) / steps if steps else 0.0
        surfacing = sum(c.surfacing_deaths for c in surface if c is not None)
        stats["surfacing_death_share"] = surfacing / deaths if deaths else 0.0
    return stats


def format_behaviour(stats: dict[str, float]) -> str:
    """``behaviour_stats`` as a log fragment ('' when there are none)."""
    if "refills_per_game" not in stats:
        return ""

    def of_lives_lost(key: str) -> str:
        # No life lost: the share is undefined (the stats hold 0.0 for the logs), not "0%".
        return f"{stats[key]:.0%}" if stats["deaths_per_game"] > 0 else "n/a"

    text = (
        f"refills {stats['refills_per_game']:.2f}/game, lives lost {stats['deaths_per_game']:.2f}/game "
        f"({of_lives_lost('oxygen_death_share')} to oxygen)"
    )
    if "low_climbs_per_game" in stats:
        text += (
            f", low-gauge climbs {stats['low_climbs_per_game']:.2f}/game, {stats['surface_share']:.0%} at the surface"
            f", divers rescued {stats['rescues_per_game']:.2f}/game, {stats['diver_share']:.0%} with a diver aboard"
            f", {of_lives_lost('surfacing_death_share')} of lives lost surfacing with no diver"
        )
    return text
