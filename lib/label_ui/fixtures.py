"""Small segment DBs for the label page's tests and benchmark.

``make_synthetic_db``: segments whose frames are a coloured block moving over a background
(so a clip visibly animates), with random true rewards; any size, in milliseconds.
``make_atari_db``: real SeaQuest segments from random play in ``lib.envs.AtariVec``, for
realistic clip sizes and encode times.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lib.segments import Segment, save_segment


def synthetic_frames(t: int, h: int, w: int, seed: int) -> np.ndarray:
    """(t, h, w, 3) uint8: a block moving diagonally over a background coloured by ``seed``."""
    rng = np.random.default_rng(seed)
    frames = np.empty((t, h, w, 3), dtype=np.uint8)
    frames[:] = rng.integers(0, 160, size=3, dtype=np.uint8)
    bs = max(2, min(h, w) // 5)
    colour = rng.integers(160, 256, size=3, dtype=np.uint8)
    for i in range(t):
        y = (i * 3) % max(1, h - bs)
        x = (i * 2) % max(1, w - bs)
        frames[i, y : y + bs, x : x + bs] = colour
    return frames


def make_synthetic_db(
    root: str | Path,
    n_segments: int,
    t: int = 12,
    h: int = 42,
    w: int = 32,
    seed: int = 0,
    with_rewards: bool = True,
    fsync: bool = False,
) -> list[str]:
    """Write ``n_segments`` synthetic segments into ``root``; returns their relative paths."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n_segments):
        seg = Segment(
            frames=synthetic_frames(t, h, w, seed * 100_003 + k),
            actions=rng.integers(0, 18, size=t),
            rewards=rng.choice([0.0, 0.0, 20.0], size=t).astype(np.float32) if with_rewards else None,
            dones=np.zeros(t, dtype=bool),
            game_over=np.zeros(t, dtype=bool),
            lives=np.full(t, 3, dtype=np.int32),
            env_id="Synthetic-v0",
            env_index=k % 4,
            step=(k // 4 + 1) * t,
        )
        path = save_segment(root, seg, fsync=fsync)
        out.append(path.relative_to(root).as_posix())
    return sorted(out)


def make_atari_db(
    root: str | Path, n_segments: int, t: int = 50, n_envs: int = 4, seed: int = 0
) -> list[str]:
    """Record ``n_segments`` real segments of ``t`` steps of random SeaQuest play into ``root``."""
    from lib.envs import AtariVec

    env = AtariVec(n_envs=n_envs, seed=seed, num_threads=1)
    rng = np.random.default_rng(seed)
    env.reset()
    out: list[str] = []
    step = 0
    try:
        while len(out) < n_segments:
            frames = np.empty((t, n_envs, *env.frames.shape[1:]), dtype=np.uint8)
            actions = rng.integers(0, env.n_actions, size=(t, n_envs))
            rewards = np.zeros((t, n_envs), dtype=np.float32)
            dones = np.zeros((t, n_envs), dtype=bool)
            over = np.zeros((t, n_envs), dtype=bool)
            lives = np.zeros((t, n_envs), dtype=np.int32)
            for i in range(t):
                frames[i] = env.frames
                lives[i] = env.lives
                r = env.step(actions[i])
                rewards[i], dones[i], over[i] = r.true_rewards, r.terminated | r.truncated, r.game_over
            step += t
            for e in range(n_envs):
                if len(out) == n_segments:
                    break
                seg = Segment(
                    frames=frames[:, e].copy(),
                    actions=actions[:, e].astype(np.int64),
                    rewards=rewards[:, e].copy(),
                    dones=dones[:, e].copy(),
                    game_over=over[:, e].copy(),
                    lives=lives[:, e].copy(),
                    env_id=env.env_id,
                    action_meanings=env.action_meanings,
                    env_index=e,
                    step=step,
                )
                out.append(save_segment(root, seg, fsync=False).relative_to(root).as_posix())
    finally:
        env.close()
    return sorted(out)
