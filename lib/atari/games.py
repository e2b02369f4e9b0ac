"""Full games side by side in a vector env: the one loop behind 01_a2c.py's evaluation and
04_play.py. A full game is every life until game over (how Atari scores are reported), or ALE's cut
at 108,000 frames. ``play_games`` steps all envs with one batched policy call a step and tells its
``GameObserver``s what each game shows, which is how videos, the reward view and behaviour counts
(``lib.atari.behaviour``) are made without a loop of their own."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

if TYPE_CHECKING:
    from lib.atari.seaquest import OxygenCounts, SurfaceCounts

PROGRESS_EVERY = 5000  # vector steps between progress lines: a good policy's game runs for minutes


@dataclass
class EpisodeResult:
    """One played game.

    index:       1-based episode number (also in the video file name)
    score:       sum of the true game rewards
    steps:       agent steps played (4 emulator frames each)
    end:         "game over", "frame limit" (ALE's 108,000 frames) or "max steps" (a cut)
    video, gif:  recorded files (04_play.py -r), or None
    reward_corr: Pearson correlation of the per-step prediction with the true reward; None without
                 a model or when either is constant
    oxygen:      SeaQuest's ``OxygenCounts``, filled in by ``lib.atari.behaviour``'s observer; else None
    surface:     SeaQuest's ``SurfaceCounts``, filled in by the same observer; else None
    lives:       (score, agent steps) of each life in order, summing to ``score`` and ``steps``; a
                 life ends on the step that loses it or ends the game
    """

    index: int
    score: float
    steps: int
    end: str
    video: Path | None = None
    gif: Path | None = None
    reward_corr: float | None = None
    oxygen: OxygenCounts | None = None
    surface: SurfaceCounts | None = None
    lives: list[tuple[float, int]] = field(default_factory=list)


def best_life(results: Sequence[EpisodeResult]) -> tuple[float, int] | None:
    """The (score, agent steps) of the best single life over all the games: the book's figure, as
    its test env ends an episode at each lost life."""
    return best_of_lives([life for r in results for life in r.lives])


def best_of_lives(lives: Sequence[Sequence[float]]) -> tuple[float, int] | None:
    """The best of (score, agent steps) lives: the highest score, the longer of two that score the
    same; None when there are none."""
    return max(((float(s), int(n)) for s, n in lives), default=None)


class GameObserver(Protocol):
    """What a caller may want to see of each game. ``stepped`` gets the frame the action was chosen
    on, the true reward, the model's prediction (None without one) and whether the step ended a
    life; ``finished`` may fill in fields of the result, which later observers and the caller then
    see."""

    def started(self, slot: int, index: int) -> None: ...

    def stepped(self, slot: int, frame: np.ndarray, reward: float, pred: float | None, life_lost: bool) -> None: ...

    def finished(self, slot: int, result: EpisodeResult) -> None: ...

    def aborted(self) -> None: ...


def select_actions(logits: torch.Tensor, greedy: bool, rng: np.random.Generator) -> np.ndarray:
    """(B, n_actions) logits -> (B,) int64 actions: argmax, or a sample from the softmax drawn
    with ``rng`` (reproducible with a seed on any device)."""
    if greedy:
        return logits.argmax(dim=1).cpu().numpy()
    probs = torch.softmax(logits.float(), dim=1).cpu().numpy()
    u = rng.random((len(probs), 1))
    return np.minimum((probs.cumsum(axis=1) < u).sum(axis=1), probs.shape[1] - 1).astype(np.int64)


@dataclass
class _Slot:
    """The game in progress in one env slot."""

    index: int
    score: float = 0.0
    steps: int = 0
    life_score: float = 0.0  # the life in progress
    life_steps: int = 0
    lives: list[tuple[float, int]] = field(default_factory=list)  # the lives that ended

    def end_life(self) -> None:
        self.lives.append((self.life_score, self.life_steps))
        self.life_score, self.life_steps = 0.0, 0


class _Games:
    """The bookkeeping of ``play_games``: which game runs in which slot, the results so far."""

    def __init__(self, n_slots: int, episodes: int, observers: Sequence[GameObserver]) -> None:
        self.slots: list[_Slot | None] = [None] * n_slots
        self.episodes, self.observers = episodes, observers
        self.started = 0
        self.results: list[EpisodeResult] = []

    def start(self, i: int) -> None:
        self.started += 1
        self.slots[i] = _Slot(self.started)
        for ob in self.observers:
            ob.started(i, self.started)

    def start_all(self, n_envs: int) -> None:
        for i in range(min(n_envs, self.episodes - self.started)):
            self.start(i)

    def finish(self, i: int, end: str) -> None:
        game, self.slots[i] = self.slots[i], None
        assert game is not None
        if game.life_steps:  # cut mid-life (max steps), or a frame limit: the life ends with the game
            game.end_life()
        res = EpisodeResult(game.index, game.score, game.steps, end, lives=game.lives)
        for ob in self.observers:
            ob.finished(i, res)
        self.results.append(res)

    def abort(self) -> None:
        for ob in self.observers:
            ob.aborted()

    def running(self) -> np.ndarray:
        return np.flatnonzero([s is not None for s in self.slots])

    def stepped(self, active: np.ndarray, frames: np.ndarray, step: Any, preds: np.ndarray | None, max_steps) -> None:
        """Each running game's step: score, observers, and the end of games that ended or were cut."""
        for k, i in enumerate(active):
            game = self.slots[i]
            assert game is not None
            r = float(step.true_rewards[i])
            game.score += r
            game.steps += 1
            game.life_score += r
            game.life_steps += 1
            pred = None if preds is None else float(preds[k])
            for ob in self.observers:
                ob.stepped(i, frames[k], r, pred, bool(step.terminated[i]))
            if step.terminated[i]:  # a life lost, or the last one: the game is over
                game.end_life()
            if step.game_over[i]:
                # The env has already started a new game in this slot (same-step autoreset).
                self.finish(i, "frame limit" if step.truncated[i] else "game over")
                if self.started < self.episodes:
                    self.start(i)
            elif max_steps is not None and game.steps >= max_steps:
                self.finish(i, "max steps")  # cut mid-game: this env cannot start a fresh game alone


def play_games(
    venv: Any,
    policy: Callable[[np.ndarray], np.ndarray],
    episodes: int,
    *,
    observers: Sequence[GameObserver] = (),
    predict: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], np.ndarray] | None = None,
    max_steps: int | None = None,
    stop: Callable[[], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> list[EpisodeResult] | None:
    """Play ``episodes`` full games in ``venv`` (``AtariVec``-like); results in episode order.

    policy:    (N, 4, 84, 84) uint8 obs -> (N,) actions, one call per step for all envs
    predict:   (frames, actions, shown, game_over) of the running games -> (K,) per-step predictions
               for the observers (inputs as ``reward_input`` takes them); None: no predictions
    max_steps: cut a game after this many agent steps; when every slot is cut, all envs restart
               with new seeds
    stop:      polled every step; True abandons the games and returns None
    observers: told of every game's start, steps and end (``GameObserver``)
    """
    games = _Games(venv.n_envs, episodes, observers)
    resets, vec_steps, t0 = 0, 0, time.monotonic()
    base_seed = getattr(venv, "seed", None)
    obs = venv.reset()
    try:
        games.start_all(venv.n_envs)
        while len(active := games.running()):
            if stop is not None and stop():
                games.abort()
                return None
            frames = venv.frames[active].copy()  # the frames the actions are chosen on
            actions = policy(obs)
            step = venv.step(actions)
            obs = step.obs
            preds = None
            if predict is not None:
                preds = predict(frames, actions[active], venv.frames[active], step.game_over[active])
            vec_steps += 1
            if log is not None and vec_steps % PROGRESS_EVERY == 0:
                done = len(games.results)
                log(f"... {vec_steps} steps, {done}/{episodes} games done, {time.monotonic() - t0:.0f} s")
            games.stepped(active, frames, step, preds, max_steps)
            if not len(games.running()) and games.started < episodes:
                # Every slot was cut by max_steps: fresh games in all, with new seeds.
                resets += 1
                if base_seed is not None:
                    venv.seed = base_seed + 1000 * resets
                obs = venv.reset()
                games.start_all(venv.n_envs)
    except BaseException:
        games.abort()
        raise
    if log is not None:
        log(f"played {sum(r.steps for r in games.results)} steps in {time.monotonic() - t0:.1f} s")
    return sorted(games.results, key=lambda r: r.index)


def score_stats(results: list[EpisodeResult]) -> dict[str, float]:
    """Mean, std (population) and max of the scores, mean and max length, and the best single life's
    score and length: the ``eval/*`` figures."""
    scores = np.array([r.score for r in results], dtype=np.float64)
    lengths = np.array([r.steps for r in results], dtype=np.float64)
    stats = {
        "score_mean": float(scores.mean()),
        "score_std": float(scores.std()),
        "score_max": float(scores.max()),
        "length_mean": float(lengths.mean()),
        "length_max": float(lengths.max()),
    }
    if (best := best_life(results)) is not None:
        stats["best_life_score"], stats["best_life_length"] = float(best[0]), float(best[1])
    return stats
