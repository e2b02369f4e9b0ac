"""Segment DBs for the tests and benchmarks, in one place.

``make_synthetic_db``: segments whose frames are a coloured block moving over a background
(so a clip visibly animates), with random true rewards; any size, in milliseconds.
``make_atari_db``: real SeaQuest segments from random play in ``lib.atari.envs.AtariVec``, for
realistic clip sizes and encode times.
``make_square_db``: a known reward rule for the reward-model tests: a step's true reward is 1
when its frame shows a bright square, else 0. Frames are small (48x48; the smallest the book's
conv stack takes is 43) so training takes seconds. ``make_appear_db``: the reward is earned when
a point shows in the NEXT frame's score bar, which only a model that sees the step's outcome can
place on its step.
``book_pickle`` / ``write_legacy_segment``: the book's format, an uncompressed pickle of a list of
``lib.rlhf.EpisodeStep(obs, act)``.
"""

from __future__ import annotations

import pickle
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

from lib.store.segment_writer import save_segment
from lib.store.segments import Segment

SEAQUEST = "SeaquestNoFrameskip-v4"
SEAQUEST_ACTIONS = (
    "NOOP",
    "FIRE",
    "UP",
    "RIGHT",
    "LEFT",
    "DOWN",
    "UPRIGHT",
    "UPLEFT",
    "DOWNRIGHT",
    "DOWNLEFT",
    "UPFIRE",
    "RIGHTFIRE",
    "LEFTFIRE",
    "DOWNFIRE",
    "UPRIGHTFIRE",
    "UPLEFTFIRE",
    "DOWNRIGHTFIRE",
    "DOWNLEFTFIRE",
)


def square_frames(rng: np.random.Generator, n: int, size: int = 48, p: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """(n, size, size, 3) uint8 dark noisy frames, a bright 8x8 square in each with probability p;
    returns (frames, rewards (n,) float32 = 1 where the square is)."""
    frames = rng.integers(0, 60, size=(n, size, size, 3), dtype=np.uint8)
    rewards = (rng.random(n) < p).astype(np.float32)
    for i in np.flatnonzero(rewards):
        y, x = rng.integers(0, size - 8, size=2)
        frames[i, y : y + 8, x : x + 8] = 230
    return frames, rewards


def appear_frames(rng: np.random.Generator, n: int, size: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """n + 1 dark noisy frames with a score bar along the top (3 pixels wide per point) and n
    rewards: step t earns a point (probability 0.3) that shows in frame t + 1, as a game's score
    does. Frame t tells how many points there are, not whether step t earns the next one."""
    rewards = (rng.random(n) < 0.3).astype(np.float32)
    points = int(rng.integers(0, 4)) + np.concatenate([[0], np.cumsum(rewards)]).astype(int)
    frames = rng.integers(0, 60, size=(n + 1, size, size, 3), dtype=np.uint8)
    for i, k in enumerate(points):
        frames[i, 1:5, : min(3 * k, size)] = 230
    return frames, rewards


def make_appear_db(root: Path, n_segments: int = 60, steps: int = 10, seed: int = 0) -> list[str]:
    """A DB of segments following the appear rule (``appear_frames``); each segment stores its
    ``steps`` frames, not the one after its last step, as the recorder does."""
    rng = np.random.default_rng(seed)
    rels = []
    for i in range(n_segments):
        frames, rewards = appear_frames(rng, steps)
        rels.append(_save_rule_segment(root, rng, i, frames[:steps], rewards, SEAQUEST))
    return rels


def _save_rule_segment(
    root: Path, rng: np.random.Generator, i: int, frames: np.ndarray, rewards: np.ndarray, env_id: str
) -> str:
    """Segment ``i`` of a rule DB (random actions, no life lost) saved in env ``i % 4``; its relative path."""
    steps = len(frames)
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
    return f"{i % 4:02d}/{1000 + i:08d}.dat"


def make_square_db(
    root: Path, n_segments: int = 40, steps: int = 10, seed: int = 0, size: int = 48, env_id: str = SEAQUEST
) -> list[str]:
    """A DB of segments following the square rule; returns their relative paths."""
    rng = np.random.default_rng(seed)
    rels = []
    for i in range(n_segments):
        # vary the share of rewarded frames per segment so returns spread out
        frames, rewards = square_frames(rng, steps, size, p=float(rng.uniform(0.0, 0.8)))
        rels.append(_save_rule_segment(root, rng, i, frames, rewards, env_id))
    return rels


class BookStep:
    """Pickles as the book's ``lib.rlhf.EpisodeStep(obs, act)`` (a plain class: instance dict)."""

    def __init__(self, obs: Any, act: Any) -> None:
        self.obs, self.act = obs, act


BookStep.__module__, BookStep.__qualname__ = "lib.rlhf", "EpisodeStep"


def book_pickle(steps: list[tuple[Any, Any]], protocol: int = 4) -> bytes:
    """The bytes of a book segment: a pickled list of EpisodeStep(obs, act). ``obs`` may be any
    picklable object, which is how the hostile-DB tests wrap crafted arrays."""
    mod = types.ModuleType("lib.rlhf")
    mod.EpisodeStep = BookStep  # type: ignore[attr-defined]
    old = sys.modules.get("lib.rlhf")
    sys.modules["lib.rlhf"] = mod
    try:
        return pickle.dumps([BookStep(obs, act) for obs, act in steps], protocol=protocol)
    finally:
        if old is None:
            del sys.modules["lib.rlhf"]
        else:
            sys.modules["lib.rlhf"] = old


def write_legacy_segment(path: Path, frames: np.ndarray, actions: np.ndarray) -> None:
    """A segment file in the book's format (no rewards)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(book_pickle([(f, int(a)) for f, a in zip(frames, actions, strict=True)]))


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
            actions=rng.integers(0, len(SEAQUEST_ACTIONS), size=t),
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


def make_atari_db(root: str | Path, n_segments: int, t: int = 50, n_envs: int = 4, seed: int = 0) -> list[str]:
    """Record ``n_segments`` real segments of ``t`` steps of random SeaQuest play into ``root``."""
    from lib.atari.envs import AtariVec

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


# --- SeaQuest action plans whose oxygen story is known (found by a random search over plans and
# seeds; ALE is deterministic with noop_max=0 and no sticky actions). Each is (seed, [(action, n)]).
# REFILL: dive, shoot, pick up a diver, surface at step 146 with the gauge at 50: a voluntary refill.
REFILL_PLAN = (383, [("NOOP", 16), ("DOWN", 36), ("DOWNRIGHTFIRE", 23), ("LEFTFIRE", 47), ("UP", 54)])
REFILL_STEP = 146
# OXYGEN_DEATH: stay just under the surface until the gauge runs out (it blinks from ~16 down),
# the sub dies at step 565, the next one waits at the surface while its gauge fills by itself.
OXYGEN_DEATH_PLAN = (545, [("NOOP", 32), ("DOWN", 2), ("LEFTFIRE", 536), ("NOOP", 40)])
OXYGEN_DEATH_STEP = 565
# ENEMY_DEATH: dive to the bottom and wait: an enemy hits the sub at step ~123 with the gauge at 54.
ENEMY_DEATH_PLAN = (1, [("NOOP", 5), ("DOWN", 60), ("NOOP", 150)])


def play_plan(plan: tuple[int, list[tuple[str, int]]]) -> Segment:
    """Play a (seed, [(action name, repeat)]) plan in one real SeaQuest env; the whole record as a
    ``Segment`` (frame, action, true reward, life-or-game ended, game over, lives of each step)."""
    from lib.atari.envs import AtariVec

    seed, steps = plan
    env = AtariVec(n_envs=1, seed=seed, noop_max=0, num_threads=1)
    try:
        env.reset()
        index = {name: i for i, name in enumerate(env.action_meanings)}
        actions = np.array([index[a] for a, n in steps for _ in range(n)], dtype=np.int64)
        frames, rewards, dones, over, lives = [], [], [], [], []
        for a in actions:
            frames.append(env.frames[0].copy())
            lives.append(int(env.lives[0]))
            st = env.step(np.array([a]))
            rewards.append(float(st.true_rewards[0]))
            dones.append(bool(st.terminated[0] or st.truncated[0]))
            over.append(bool(st.game_over[0]))
        return Segment(
            frames=np.stack(frames),
            actions=actions,
            rewards=np.array(rewards, dtype=np.float32),
            dones=np.array(dones),
            game_over=np.array(over),
            lives=np.array(lives, dtype=np.int32),
            env_id=env.env_id,
            action_meanings=env.action_meanings,
            env_index=0,
            step=len(actions),
        )
    finally:
        env.close()


def cut(seg: Segment, start: int, stop: int, step: int | None = None) -> Segment:
    """Steps [start, stop) of a record as a segment of its own (``step``: its step counter)."""
    return Segment(
        frames=seg.frames[start:stop].copy(),
        actions=seg.actions[start:stop].copy(),
        rewards=None if seg.rewards is None else seg.rewards[start:stop].copy(),
        dones=None if seg.dones is None else seg.dones[start:stop].copy(),
        game_over=None if seg.game_over is None else seg.game_over[start:stop].copy(),
        lives=None if seg.lives is None else seg.lives[start:stop].copy(),
        env_id=seg.env_id,
        action_meanings=seg.action_meanings,
        env_index=seg.env_index,
        step=stop if step is None else step,
    )


def write_action_db(
    root: Path, specs: list[tuple[int, float]], t: int = 10, size: int = 64, lose_life: tuple[int, ...] = ()
) -> list[str]:
    """One segment per (action, true reward per step): every step takes that action, frames are
    ``size`` x ``size`` moving blocks. With ``action_model`` the predicted returns are known. The
    segments numbered in ``lose_life`` lose a life on their middle step."""
    out = []
    for k, (action, reward) in enumerate(specs):
        dones, lives = np.zeros(t, dtype=bool), np.full(t, 3, dtype=np.int32)
        if k in lose_life:
            dones[t // 2] = True
            lives[t // 2 + 1 :] = 2  # lives before each step
        seg = Segment(
            frames=synthetic_frames(t, size, size, k),
            actions=np.full(t, action, dtype=np.int64),
            rewards=np.full(t, reward, dtype=np.float32),
            dones=dones,
            game_over=np.zeros(t, dtype=bool),
            lives=lives,
            env_id=SEAQUEST,
            env_index=0,
            step=(k + 1) * t,
        )
        out.append(save_segment(root, seg, fsync=False).relative_to(root).as_posix())
    return out


def action_model(size: int | tuple[int, int], path: Path, members: list[dict[int, float]], n_actions: int = 18) -> Path:
    """A real reward-model checkpoint for ``size`` x ``size`` (or (H, W)) frames whose member k predicts
    ``members[k].get(a, 0)`` (>= 0) for every step that takes action a, whatever the frame: the
    conv features are weighted 0, the action's one-hot feeds one hidden unit."""
    import torch

    from lib.models.reward import RewardModel, reward_checkpoint, save_reward_checkpoint

    nets = []
    for values in members:
        h, w = (size, size) if isinstance(size, int) else size
        m = RewardModel(n_actions, (h, w, 3))
        with torch.no_grad():
            for p in m.parameters():
                p.zero_()
            features = m.out[0].in_features - n_actions
            for a, c in values.items():
                assert c >= 0  # passes the LeakyReLU unchanged
                m.out[0].weight[0, features + a] = c
            m.out[2].weight[0, 0] = 1.0
        nets.append(m.eval())
    save_reward_checkpoint(reward_checkpoint(nets, SEAQUEST, "seaquest", None), path)
    return path


def make_state_db(db: Path, n: int = 8, seed: int = 0, gap: int = 40) -> None:
    """A state DB for ``--start-states`` (as ``lib.store.states`` reads it): ``n`` saved SeaQuest
    states, one every ``gap`` agent steps of random play in one emulator. Where it jumps to does not
    change the speed of jumping, so the benchmarks need no finder."""
    import time

    from lib.atari.saved_states import SingleGame
    from lib.atari.seaquest import divers_aboard, oxygen_levels, sub_rows
    from lib.store.states import STATE_ENV

    game = SingleGame(seed)
    game.reset()
    frames: list[np.ndarray] = [game.frame.copy()] * 4
    for i in range(n):
        for _ in range(gap):
            _, lost, over = game.step(int(game.rng.integers(len(game.actions))))
            if over:
                game.reset()
            frames = [*frames[1:], game.frame.copy()]
        f = game.frame
        meta = {"level": int(oxygen_levels(f)), "divers": int(divers_aboard(f)), "row": int(sub_rows(f))}
        meta |= {"ale_state": game.ale.cloneState().serialize().hex(), "game": 0, "life": i}
        seg = Segment(
            frames=np.stack(frames),
            actions=np.zeros(4, dtype=np.int64),
            rewards=np.zeros(4, dtype=np.float32),
            dones=np.zeros(4, dtype=bool),
            game_over=np.zeros(4, dtype=bool),
            lives=np.zeros(4, dtype=np.int32),
            env_id=SEAQUEST,
            action_meanings=game.meanings,
            env_index=STATE_ENV,
            step=i,
            time=time.time(),
            meta=meta,
        )
        save_segment(db, seg, fsync=False)
