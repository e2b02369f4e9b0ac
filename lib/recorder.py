"""EpisodeRecorderWrapper: records random segments of play into the segment DB.

The book wraps each gym env; here the wrapper sits on the whole vector env (same interface as
``AtariVec``: ``frames``, ``reset``, ``step``, ``step_async``/``step_wait``). In each env, on
every agent step that is not already being recorded, recording starts with probability
``record_prob``; the step it starts on and the following ones, ``segment_steps`` in all, become
one segment: frame t (the full-resolution RGB frame the agent acted on), action t, the true
game reward of step t, whether step t ended an episode / the game, and the lives before it.
A segment may span a life loss or a game over: a person sees that happen in the clip.

Segments are handed to a ``SegmentWriter`` thread that compresses and writes them atomically.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from lib.envs import VecStep
from lib.segments import Segment, SegmentWriter, claim_db, list_segments

DEFAULT_SEGMENT_STEPS = 50
# About 2,500 segments over a 10M-step run: 10M * p / (1 + 50 p) ~= 2,500.
DEFAULT_RECORD_PROB = 2.5e-4


def existing_step_counters(db_root: str | os.PathLike, n_envs: int, index_offset: int = 0) -> np.ndarray:
    """The highest step counter already used in the directories of envs ``index_offset`` ..
    ``index_offset + n_envs - 1`` (0 when none): a new run into the same DB continues from there,
    so it never overwrites a segment."""
    out = np.zeros(n_envs, dtype=np.int64)
    for rel in list_segments(db_root, warn=None):
        env, step = rel.removesuffix(".dat").split("/")
        i = int(env) - index_offset
        if 0 <= i < n_envs:
            out[i] = max(out[i], int(step))
    return out


class EpisodeRecorderWrapper:
    """Wraps a vector env and records random ``segment_steps``-long segments into ``db_path``."""

    def __init__(
        self,
        env: Any,
        db_path: str | os.PathLike,
        record_prob: float = DEFAULT_RECORD_PROB,
        segment_steps: int = DEFAULT_SEGMENT_STEPS,
        rng: np.random.Generator | None = None,
        step_counters: np.ndarray | None = None,
        checkpoint: str | None = None,
        index_offset: int = 0,
    ):
        if not 0.0 <= record_prob <= 1.0:
            raise ValueError(f"record_prob must be in [0, 1], got {record_prob}")
        if segment_steps < 1:
            raise ValueError(f"segment_steps must be >= 1, got {segment_steps}")
        self.env = env
        self.db_path = Path(db_path)
        claim_db(self.db_path, env.env_id, tuple(env.action_meanings))
        self.record_prob = record_prob
        self.segment_steps = segment_steps
        self.rng = rng or np.random.default_rng()
        n = env.n_envs
        # env i of this wrapper writes into directory index_offset + i: the ranks of a torchrun
        # share one DB, each with its own env directories
        self.index_offset = index_offset
        self.env_steps = existing_step_counters(self.db_path, n, index_offset)
        if step_counters is not None:
            self.env_steps = np.maximum(self.env_steps, np.asarray(step_counters, dtype=np.int64))
        self.checkpoint = checkpoint
        self.writer = SegmentWriter(self.db_path)
        self.recording = np.zeros(n, dtype=bool)
        self._buf: list[dict[str, list]] = [self._empty() for _ in range(n)]
        self._pending: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @staticmethod
    def _empty() -> dict[str, list]:
        return {"frames": [], "actions": [], "rewards": [], "dones": [], "game_over": [], "lives": []}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    @property
    def segments_written(self) -> int:
        return self.writer.written

    def reset(self) -> np.ndarray:
        self.recording[:] = False
        self._buf = [self._empty() for _ in range(self.env.n_envs)]
        return self.env.reset()

    def step(self, actions: np.ndarray) -> VecStep:
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: np.ndarray) -> None:
        start = ~self.recording & (self.rng.random(self.env.n_envs) < self.record_prob)
        self.recording |= start
        idx = np.flatnonzero(self.recording)
        # Copy the frames before the env overwrites them.
        self._pending = (idx, self.env.frames[idx].copy(), self.env.lives[idx].copy())
        self._actions = np.asarray(actions).copy()
        self.env.step_async(actions)

    def step_wait(self) -> VecStep:
        st = self.env.step_wait()
        self.env_steps += 1
        assert self._pending is not None
        idx, frames, lives = self._pending
        self._pending = None
        done = st.terminated | st.truncated
        for k, i in enumerate(idx):
            b = self._buf[i]
            b["frames"].append(frames[k])
            b["actions"].append(int(self._actions[i]))
            b["rewards"].append(float(st.true_rewards[i]))
            b["dones"].append(bool(done[i]))
            b["game_over"].append(bool(st.game_over[i]))
            b["lives"].append(int(lives[k]))
            if len(b["frames"]) >= self.segment_steps:
                self._emit(i)
        return st

    def _emit(self, i: int) -> None:
        b = self._buf[i]
        seg = Segment(
            frames=np.stack(b["frames"]),
            actions=np.array(b["actions"], dtype=np.int64),
            rewards=np.array(b["rewards"], dtype=np.float32),
            dones=np.array(b["dones"], dtype=bool),
            game_over=np.array(b["game_over"], dtype=bool),
            lives=np.array(b["lives"], dtype=np.int32),
            env_id=self.env.env_id,
            action_meanings=tuple(self.env.action_meanings),
            env_index=self.index_offset + int(i),
            step=int(self.env_steps[i]),
            checkpoint=self.checkpoint,
            time=time.time(),
        )
        self.writer.put(seg)
        self._buf[i] = self._empty()
        self.recording[i] = False

    def close(self) -> None:
        """Drop unfinished segments (never half-written) and wait until queued ones are on disk."""
        self.writer.close()
        self.env.close()
