"""EpisodeRecorderWrapper: records random segments of play into the segment DB. It sits on the whole
vector env (``AtariVec``'s interface). In each env, a step not already recorded starts a recording
with probability ``record_prob``; it and the next steps, ``segment_steps`` in all, become one
segment (frames acted on, actions, true rewards, done and game-over flags, lives before). A segment
may span a lost life: a person sees it in the clip. A ``SegmentWriter`` thread writes segments
atomically under new names; the one recorder of a DB holds ``<db>/.recorder.lock``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from lib.atari.envs import VecStep
from lib.core.errors import UserError
from lib.core.files import LockHeld, UnsafeFileError, hold_lock
from lib.store.segment_writer import SegmentWriter, check_db_game, claim_db, remove_stale_segment_temps
from lib.store.segments import MAX_ENV_STEP, MAX_SEGMENT_STEPS, Segment, list_segments, max_segment_steps

DEFAULT_SEGMENT_STEPS = 50
# About 2,500 segments over a 10M-step run: 10M * p / (1 + 50 p) ~= 2,500.
DEFAULT_RECORD_PROB = 2.5e-4
# --segment-steps must be 1..MAX_SEGMENT_STEPS (lib/store/segments.py: what every reader accepts for
# 210x160 frames; ``max_segment_steps(frame_shape)`` for other frame sizes).
__all__ = ["MAX_SEGMENT_STEPS", "EpisodeRecorderWrapper", "lock_db"]
LOCK_FILE = ".recorder.lock"


def lock_db(db_root: str | os.PathLike) -> int:
    """Take the DB's recorder lock, ``<db>/.recorder.lock`` (``lib.core.files.hold_lock``). Returns the
    open descriptor: the lock lasts until it is closed or the process ends. UserError with one line
    naming the holder when another recorder has it."""
    root = Path(db_root)
    path = root / LOCK_FILE
    try:
        root.mkdir(parents=True, exist_ok=True)
        return hold_lock(path)
    except LockHeld as e:
        raise UserError(
            f"DB {root} is being recorded into by another run ({e.holder}): record into another --db-path or wait "
            "until it ends"
        ) from None
    except UnsafeFileError as e:
        raise UserError(f"cannot lock DB {root} for recording: {e}") from None
    except OSError as e:
        raise UserError(f"cannot lock DB {root} for recording ({path}: {e.strerror or e})") from None


def existing_step_counters(db_root: str | os.PathLike, n_envs: int, index_offset: int = 0) -> np.ndarray:
    """The highest step counter already used in the directories of envs ``index_offset`` ..
    ``index_offset + n_envs - 1`` (0 when none), so a new run never overwrites a segment. A counter
    over ``MAX_ENV_STEP`` (a planted ``08/999999999999.dat``) is no recorder's and moves nothing."""
    out = np.zeros(n_envs, dtype=np.int64)
    for rel in list_segments(db_root, warn=None):
        env, step = rel.removesuffix(".dat").split("/")
        i = int(env) - index_offset
        if 0 <= i < n_envs and int(step) <= MAX_ENV_STEP:
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
        lock: bool = True,
    ):
        """``lock=False``: another process of the same run holds the DB's lock and has written
        its db.json (the ranks of a torchrun other than rank 0, each in its own env directories)."""
        if not 0.0 <= record_prob <= 1.0:
            raise ValueError(f"record_prob must be in [0, 1], got {record_prob}")
        limit = max_segment_steps(tuple(np.shape(env.frames)[1:]))
        if not 1 <= segment_steps <= limit:
            raise ValueError(f"segment_steps must be in 1..{limit} (what every reader accepts), got {segment_steps}")
        self.env = env
        self.db_path = Path(db_path)
        self._lock: int | None = lock_db(self.db_path) if lock else None  # one recorder per DB
        try:
            if lock:
                claim_db(self.db_path, env.env_id, tuple(env.action_meanings))
                remove_stale_segment_temps(self.db_path)  # a killed run's; ours hold the lock now
            else:
                check_db_game(self.db_path, env.env_id)
        except BaseException:
            self._release()
            raise
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
        # plain extra fields (str / int / float / bool / None) for each segment's ``meta`` from now
        # on: 01_a2c.py -r puts the reward model's version there
        self.meta: dict[str, Any] = {}
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

    @property
    def segments_failed(self) -> int:
        """Segments that could not be written (disk full...); ``writer.errors`` says why."""
        return self.writer.failed

    def _release(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases the flock
            self._lock = None

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
            meta=dict(self.meta),
        )
        self.writer.put(seg)
        self._buf[i] = self._empty()
        self.recording[i] = False

    def close(self) -> None:
        """Drop unfinished segments, wait until queued ones are on disk (or counted as failed, with
        one line in ``writer.errors``), release the DB's lock."""
        try:
            self.writer.close()  # then writer.errors is the one line the run's end report prints
        finally:
            self._release()
            self.env.close()
