"""Synthetic segment DBs with a known reward rule, for the reward-model tests.

Rule: a step's true reward is 1 when its frame shows a bright square, else 0. Frames are small
(48x48, the smallest the book's conv stack takes is 43) so training takes seconds.
"""

from __future__ import annotations

import pickle
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lib.segments import Segment, save_segment

SEAQUEST = "SeaquestNoFrameskip-v4"
SEAQUEST_ACTIONS = (
    "NOOP", "FIRE", "UP", "RIGHT", "LEFT", "DOWN", "UPRIGHT", "UPLEFT", "DOWNRIGHT", "DOWNLEFT",
    "UPFIRE", "RIGHTFIRE", "LEFTFIRE", "DOWNFIRE", "UPRIGHTFIRE", "UPLEFTFIRE", "DOWNRIGHTFIRE", "DOWNLEFTFIRE",
)  # fmt: skip


def square_frames(
    rng: np.random.Generator, n: int, size: int = 48, p: float = 0.3
) -> tuple[np.ndarray, np.ndarray]:
    """(n, size, size, 3) uint8 dark noisy frames, a bright 8x8 square in each with probability p;
    returns (frames, rewards (n,) float32 = 1 where the square is)."""
    frames = rng.integers(0, 60, size=(n, size, size, 3), dtype=np.uint8)
    rewards = (rng.random(n) < p).astype(np.float32)
    for i in np.flatnonzero(rewards):
        y, x = rng.integers(0, size - 8, size=2)
        frames[i, y : y + 8, x : x + 8] = 230
    return frames, rewards


def make_square_db(
    root: Path, n_segments: int = 40, steps: int = 10, seed: int = 0, size: int = 48, env_id: str = SEAQUEST
) -> list[str]:
    """A DB of segments following the square rule; returns their relative paths."""
    rng = np.random.default_rng(seed)
    rels = []
    for i in range(n_segments):
        # vary the share of rewarded frames per segment so returns spread out
        frames, rewards = square_frames(rng, steps, size, p=float(rng.uniform(0.0, 0.8)))
        seg = Segment(
            frames=frames,
            actions=rng.integers(0, len(SEAQUEST_ACTIONS), size=steps),
            rewards=rewards,
            dones=np.zeros(steps, bool),
            game_over=np.zeros(steps, bool),
            lives=np.full(steps, 3, np.int32),
            env_id=env_id,
            action_meanings=SEAQUEST_ACTIONS,
            env_index=i % 4,
            step=1000 + i,
        )
        save_segment(root, seg, fsync=False)
        rels.append(f"{i % 4:02d}/{1000 + i:08d}.dat")
    return rels


@dataclass(frozen=True)
class _BookStep:
    obs: np.ndarray
    act: int


def write_legacy_segment(path: Path, frames: np.ndarray, actions: np.ndarray) -> None:
    """A segment in the book's format: an uncompressed pickle of ``lib.rlhf.EpisodeStep`` objects."""
    mod = types.ModuleType("lib.rlhf")
    cls = type("EpisodeStep", (_BookStep,), {"__module__": "lib.rlhf", "__qualname__": "EpisodeStep"})
    cls = dataclass(frozen=True)(cls)
    mod.EpisodeStep = cls  # type: ignore[attr-defined]
    old = sys.modules.get("lib.rlhf")
    sys.modules["lib.rlhf"] = mod
    try:
        data = pickle.dumps([cls(f, int(a)) for f, a in zip(frames, actions, strict=True)])
    finally:
        if old is None:
            del sys.modules["lib.rlhf"]
        else:
            sys.modules["lib.rlhf"] = old
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
