"""Atari environments: ale-py's threaded C++ vector env (faster than gymnasium's Python wrappers,
and it scales with cores; figures in docs/results.md) and the DeepMind policy input. One env step is
4 emulator frames (max over the last two). The env returns the full RGB frame, which the recorder
keeps and people watch; ``AtariVec`` makes the policy input from it (grey 84x84 INTER_AREA, a stack
of 4). Settings follow DeepMind, not ale-py's defaults: 30 random no-ops, a lost life ``terminated``
while the game goes on, the true score unclipped, SameStep autoreset (no bogus step per game), games
cut at 108,000 frames."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from lib.core.errors import UserError

POLICY_FRAME = 84
STACK = 4
MAX_GAME_FRAMES = 108_000

DEFAULT_ENV = "SeaquestNoFrameskip-v4"


def _all_roms() -> list[str]:
    from ale_py import roms

    return sorted(roms.get_all_rom_ids())


def game_of(env_id: str) -> str:
    """The game of an env id read from a file: its ALE ROM id, or for a name ALE does not know
    (a test's synthetic env, a hostile file) the name itself, lower case. Never raises."""
    try:
        return rom_name(env_id)
    except UserError:
        return env_id.strip().lower()


def rom_name(env: str) -> str:
    """ALE ROM id for a user's ``--env``: 'SeaquestNoFrameskip-v4', 'ALE/Seaquest-v5',
    'Seaquest' and 'seaquest' all give 'seaquest'. Unknown games raise UserError."""
    name = env.strip()
    name = name.split("/")[-1]
    name = re.sub(r"-v\d+$", "", name)
    name = re.sub(r"(NoFrameskip|Deterministic)$", "", name)
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()
    roms = _all_roms()
    for cand in (snake, name.lower(), snake.replace("_", "")):
        if cand in roms:
            return cand
    raise UserError(f"unknown --env {env!r}: no such ALE game (e.g. SeaquestNoFrameskip-v4, BreakoutNoFrameskip-v4)")


def default_env_threads() -> int:
    """The cores this process may run on (``os.sched_getaffinity``: a container's or taskset's
    share, not the machine's), the default number of emulator threads of every vector env."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return max(1, os.cpu_count() or 1)


def grey84(frames: np.ndarray) -> np.ndarray:
    """(N, H, W, 3) uint8 RGB -> (N, 84, 84) uint8 grey (grey, then INTER_AREA), in two OpenCV calls
    for the whole batch. The frames are stacked into one (N*H, W) image and resized to (N*84, 84):
    each 84-row band of the output comes from exactly one frame, and for ALE's 210 rows the result
    is byte-identical to one resize per frame."""
    n, h, w = frames.shape[:3]
    if n == 0:
        return np.empty((0, POLICY_FRAME, POLICY_FRAME), dtype=np.uint8)
    g = cv2.cvtColor(np.ascontiguousarray(frames).reshape(n * h, w, 3), cv2.COLOR_RGB2GRAY)
    out = cv2.resize(g, (POLICY_FRAME, POLICY_FRAME * n), interpolation=cv2.INTER_AREA)
    return out.reshape(n, POLICY_FRAME, POLICY_FRAME)


def area_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) float32 weights of INTER_AREA down-sampling along one axis: output pixel i
    averages input [i * s, (i + 1) * s), s = n_in / n_out, each input pixel weighted by its overlap."""
    s = n_in / n_out
    m = np.zeros((n_out, n_in), dtype=np.float64)
    for i in range(n_out):
        a, b = i * s, (i + 1) * s
        for j in range(int(np.floor(a)), min(n_in, int(np.ceil(b)))):
            m[i, j] = max(0.0, min(b, j + 1) - max(a, j)) / s
    return m.astype(np.float32)


class TorchGrey84:
    """``grey84`` as two matrix products on a torch device (frames go up once, no per-env host
    work). Within 1 grey level of ``grey84``: OpenCV rounds the grey image before resizing, this
    keeps float."""

    def __init__(self, height: int, width: int, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.rows = torch.from_numpy(area_matrix(height, POLICY_FRAME)).to(self.device)  # (84, H)
        self.cols = torch.from_numpy(area_matrix(width, POLICY_FRAME)).T.contiguous().to(self.device)  # (W, 84)
        self.rgb = torch.tensor([0.299, 0.587, 0.114], device=self.device)  # ITU-R BT.601, as OpenCV

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        import torch

        x = torch.from_numpy(np.ascontiguousarray(frames)).to(self.device, non_blocking=True).float()
        grey = self.rows @ (x @ self.rgb) @ self.cols  # (N, 84, 84)
        return grey.round_().clamp_(0, 255).to(torch.uint8).cpu().numpy()


@dataclass
class VecStep:
    """What one step of a vector env gives back (N envs).

    obs:          (N, 4, 84, 84) uint8  policy input after the step (a new game's where one ended)
    rewards:      (N,) float32          reward to learn from, unclipped: the score unless a wrapper
                                        (RewardModelWrapper) replaced it
    true_rewards: (N,) float32          the game's own score change, unclipped
    terminated:   (N,) bool             life lost or game over: no bootstrap past this step
    truncated:    (N,) bool             game cut at the frame limit: bootstrap from final_obs
    game_over:    (N,) bool             the whole game ended here and the env was reset
    final_obs:    (N, 4, 84, 84) uint8  last obs of the episode where terminated|truncated, else obs
    lives:        (N,) int32            lives after the step
    pred_rewards: (N,) float32 | None   raw reward-model prediction, when a reward model is used
    pending:      work a wrapper deferred until ``complete()``
    """

    obs: np.ndarray
    rewards: np.ndarray
    true_rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    game_over: np.ndarray
    final_obs: np.ndarray
    lives: np.ndarray
    pred_rewards: np.ndarray | None = None
    pending: Callable[[], None] | None = None

    def complete(self) -> VecStep:
        """Run the work a wrapper left for later (a reward model's forward that needs the frames
        this step led to: ``rewards`` and ``pred_rewards`` are final only after it)."""
        if self.pending is not None:
            work, self.pending = self.pending, None
            work()
        return self


class AtariVec:
    """N Atari games stepped together in ale-py's C++ threads. ``frames``: the RGB frame (N, 210,
    160, 3) each env shows now, which the next action is chosen on; ``reset()`` returns the policy
    obs (N, 4, 84, 84). ``num_threads``: emulator threads (None: ``default_env_threads()``; at most
    ``n_envs``; ``--env-threads``). ``device``: a CUDA device makes the policy input there
    (``TorchGrey84``), anything else on the host (``grey84``)."""

    def __init__(
        self,
        env: str = DEFAULT_ENV,
        n_envs: int = 16,
        seed: int | None = None,
        num_threads: int | None = None,
        noop_max: int = 30,
        max_game_frames: int = MAX_GAME_FRAMES,
        device: Any = None,
    ):
        from ale_py.vector_env import AtariVectorEnv

        if n_envs < 1:
            raise UserError(f"--envs must be at least 1, got {n_envs}")
        self.env_id = env
        self.game = rom_name(env)
        self.n_envs = n_envs
        self.seed = seed
        self.num_threads = max(1, min(num_threads or default_env_threads(), n_envs))
        self._env = AtariVectorEnv(
            self.game,
            n_envs,
            num_threads=self.num_threads,
            autoreset_mode="SameStep",
            img_height=210,
            img_width=160,
            grayscale=False,
            stack_num=1,
            frameskip=4,
            maxpool=True,
            noop_max=noop_max,
            use_fire_reset=True,
            episodic_life=False,
            life_loss_info=True,
            reward_clipping=False,
            max_num_frames_per_episode=max_game_frames,
            repeat_action_probability=0.0,
        )
        self.n_actions = int(self._env.single_action_space.n)
        self.action_meanings = tuple(a.name for a in self._env.ale.get_action_set())
        self.obs_shape = (STACK, POLICY_FRAME, POLICY_FRAME)
        self.frames = np.zeros((n_envs, 210, 160, 3), dtype=np.uint8)
        self.lives = np.zeros(n_envs, dtype=np.int32)
        self._stack = np.zeros((n_envs, *self.obs_shape), dtype=np.uint8)
        self._efn = np.zeros(n_envs, dtype=np.int64)
        self._seeded = False
        self._in_flight = False
        on_gpu = device is not None and str(device).startswith("cuda")
        self._grey = TorchGrey84(210, 160, device) if on_gpu else grey84

    def reset(self) -> np.ndarray:
        """Reset all games; the seed is used on the first reset only, later resets go on from
        the seeded generator (so evaluation rounds do not replay the same no-op starts)."""
        obs, info = self._env.reset(seed=None if self._seeded else self.seed)
        self._seeded = True
        self.frames = obs[:, 0]
        self.lives = info["lives"].astype(np.int32)
        self._efn = info["episode_frame_number"].astype(np.int64)
        g = self._grey(self.frames)
        self._stack[:] = g[:, None]
        return self._stack.copy()

    def step(self, actions: np.ndarray) -> VecStep:
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: np.ndarray) -> None:
        """Start stepping in the C++ threads and return at once (overlap work with it)."""
        self._env.send(np.asarray(actions, dtype=np.int64))
        self._in_flight = True

    def step_wait(self) -> VecStep:
        """Finish the step started by ``step_async``."""
        obs, rew, term, trunc, info = self._env.recv()
        self._in_flight = False
        frames = obs[:, 0]
        efn = info["episode_frame_number"].astype(np.int64)
        # With SameStep autoreset a finished game comes back already reset: its episode frame
        # counter restarts. That, not the lives count (SeaQuest awards extra lives), tells
        # a game over from a life loss.
        game_over = (efn < self._efn) | trunc
        self._efn = efn
        done = term | trunc
        final_obs = None
        g = self._grey(frames)
        if game_over.any() and "final_obs" in info:
            gf = self._grey(info["final_obs"][game_over][:, 0])
            final_obs = self._stack.copy()
            final_obs[game_over] = np.concatenate([final_obs[game_over][:, 1:], gf[:, None]], axis=1)
        self._stack[:, :-1] = self._stack[:, 1:]
        self._stack[:, -1] = g
        if final_obs is None:
            final_obs = self._stack.copy()
        else:
            final_obs[~game_over] = self._stack[~game_over]
        # A new game (or a new life) starts from a stack of its first frame only, so the
        # policy never sees frames of two episodes at once.
        if done.any():
            self._stack[done] = g[done][:, None]
        self.frames = frames
        self.lives = info["lives"].astype(np.int32)
        rewards = rew.astype(np.float32)
        return VecStep(
            obs=self._stack.copy(),
            rewards=rewards,
            true_rewards=rewards.copy(),
            terminated=term & ~trunc,
            truncated=trunc.copy(),
            game_over=game_over,
            final_obs=final_obs,
            lives=self.lives.copy(),
        )

    def close(self) -> None:
        if self._in_flight:  # a step was sent and never collected (the loop stopped on an error)
            self._env.recv()
            self._in_flight = False
        self._env.close()
