"""The reward-hacking watch (``reward_model/true_vs_pred_corr``, lib/a2c/train.py ``GameStats``): the
correlation over recent games of the true score and the return the learner was paid. It must sum
what the learner receives (the normalised reward), not the raw predictions, whose offset the
Bradley-Terry loss leaves free: with a negative offset a longer game sums to a lower raw return
even when the model pays for every point, which read as -0.97 on agents doing fine."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from torch.utils.tensorboard import SummaryWriter

from lib.a2c.run import GameStats, Progress
from lib.atari.envs import VecStep
from lib.core.stats import pearson
from lib.models.reward_path import RunningNorm

OFFSET, PER_POINT = -0.3, 0.025  # a raw prediction: the free offset, plus 0.5 for a 20-point kill


def _step(true: float, raw: float, paid: float, over: bool) -> VecStep:
    obs = np.zeros((1, 4, 84, 84), dtype=np.uint8)
    flag = np.array([over])
    return VecStep(
        obs=obs,
        rewards=np.array([paid], dtype=np.float32),
        true_rewards=np.array([true], dtype=np.float32),
        terminated=flag,
        truncated=np.array([False]),
        game_over=flag,
        final_obs=obs,
        lives=np.array([0 if over else 3], dtype=np.int32),
        pred_rewards=np.array([raw], dtype=np.float32),
    )


def test_the_watch_correlates_the_learners_reward_not_the_raw_sum(tmp_path: Path) -> None:
    """Four games, each longer and higher-scoring than the last (as a learning agent's are): the
    raw sums fall with length while the normalised returns rise with the score."""
    games, progress = GameStats(1), Progress()
    norm = RunningNorm(5000, prior=(OFFSET, 0.1))  # the wrapper's normaliser, its prior the model's stats
    raw_returns, true_scores = [], []
    with SummaryWriter(str(tmp_path)) as writer:
        for length, kills in ((100, 2), (300, 4), (600, 6), (900, 8)):
            true = np.zeros(length)
            true[np.linspace(10, length - 10, kills).astype(int)] = 20.0
            raw = (OFFSET + PER_POINT * true).astype(np.float32)
            for t in range(length):
                paid = float(norm.normalise(raw[t : t + 1])[0])
                games.update(_step(true[t], raw[t], paid, t == length - 1), progress, writer)
            raw_returns.append(float(raw.sum()))
            true_scores.append(true.sum())
    assert progress.games == 4
    assert pearson(true_scores, raw_returns) < -0.9  # what the watch read before: a false alarm
    corr = games.true_vs_pred_corr()
    assert corr is not None and corr > 0.9
