"""n-step transitions from a vector env, with episode boundaries handled exactly (ptan's experience
source sums n+1 rewards and does not bootstrap a truncation), in numpy over all envs at once. A
transition started at step t is emitted once it has n rewards, or when its episode ends:

    G = r_t + gamma r_{t+1} + ... + gamma^(k-1) r_{t+k-1}      (k <= n rewards)
    target = G + gamma^k V(s_boot)   where s_boot = s_{t+k}       (k == n, episode goes on)
                                     where s_boot = final obs     (episode truncated)
                                     and no bootstrap             (episode terminated)

``discount`` is gamma**k. No transition reaches past the step that ended its episode (with life-loss
termination, its life).

With a frozen trunk (``--finetune``) the collector also keeps each state's features from the acting
forward, so that the learner runs the heads only; they stay torch tensors on the device that made
them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BOOT_NONE = 0  # terminated: the return ends here
BOOT_NEXT = 1  # n rewards summed, episode goes on: bootstrap from the obs after the last step
BOOT_FINAL = 2  # truncated (time limit): bootstrap from the episode's final obs


@dataclass
class Transitions:
    """A batch of n-step transitions (B of them).

    obs:       (B, *obs_shape) uint8  state the action was taken in
    actions:   (B,) int64
    returns:   (B,) float32           discounted sum of the k rewards
    discount:  (B,) float32           gamma**k, the factor for the bootstrap value
    steps:     (B,) int64             k, number of rewards summed (1..n)
    boot_mode: (B,) int8              BOOT_NONE / BOOT_NEXT / BOOT_FINAL
    boot_obs:  (B, *obs_shape) uint8  state to bootstrap from (zeros where BOOT_NONE)
    env:       (B,) int64             index of the env the transition came from
    marked:    (B,) bool or None      a readout marked the state (``StepMarks``: the KL logged on those alone)
    features:  (B, F) tensor or None  the frozen trunk's features of ``obs`` from the acting forward (float32,
                                      or bfloat16 under --precision bf16), on the policy's device
    """

    obs: np.ndarray
    actions: np.ndarray
    returns: np.ndarray
    discount: np.ndarray
    steps: np.ndarray
    boot_mode: np.ndarray
    boot_obs: np.ndarray
    env: np.ndarray
    marked: np.ndarray | None = None
    features: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.actions)

    @staticmethod
    def concat(parts: list[Transitions]) -> Transitions:
        def joined(name: str) -> np.ndarray | torch.Tensor | None:
            arrays = [getattr(p, name) for p in parts]
            if any(a is None for a in arrays):
                return None
            return torch.cat(arrays) if isinstance(arrays[0], torch.Tensor) else np.concatenate(arrays)

        return Transitions(*(joined(f) for f in Transitions.__dataclass_fields__))


class NStepCollector:
    """Turns a stream of vector steps into n-step transitions (see the module docstring). Call
    ``add`` once per vector step, ``obs`` being the states the actions were taken in; it returns the
    transitions complete after this step."""

    def __init__(self, n_envs: int, obs_shape: tuple[int, ...], n_steps: int, gamma: float):
        if n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")
        self.n, self.gamma, self.n_envs = n_steps, gamma, n_envs
        self.obs = np.zeros((n_steps, n_envs, *obs_shape), dtype=np.uint8)
        self.actions = np.zeros((n_steps, n_envs), dtype=np.int64)
        self.ret = np.zeros((n_steps, n_envs), dtype=np.float64)
        self.disc = np.ones((n_steps, n_envs), dtype=np.float64)
        self.k = np.zeros((n_steps, n_envs), dtype=np.int64)
        self.valid = np.zeros((n_steps, n_envs), dtype=bool)
        self.marked = np.zeros((n_steps, n_envs), dtype=bool)
        self.features: torch.Tensor | None = None  # (n_steps, n_envs, F), made by the first ``features`` given
        self.t = 0

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        next_obs: np.ndarray,
        final_obs: np.ndarray | None = None,
        marked: np.ndarray | None = None,
        features: torch.Tensor | None = None,
    ) -> Transitions:
        """``marked`` (N,) bool: a readout marked the states ``obs`` (None: no readout; the
        transitions' ``marked`` is then None). ``features`` (N, F): the frozen trunk's features of
        ``obs`` (None: the learner computes them; the transitions' ``features`` is then None)."""
        j = self.t % self.n
        self.t += 1
        # The slot is free: its previous transition had n rewards by the last step.
        self.obs[j] = obs
        if features is not None:
            if self.features is None:
                self.features = features.new_zeros((self.n, *features.shape))
            self.features[j] = features
        self.marked[j] = False if marked is None else marked
        self.actions[j] = actions
        self.ret[j] = 0.0
        self.disc[j] = 1.0
        self.k[j] = 0
        self.valid[j] = True

        r = np.asarray(rewards, dtype=np.float64)[None, :]
        self.ret += np.where(self.valid, self.disc * r, 0.0)
        self.disc = np.where(self.valid, self.disc * self.gamma, self.disc)
        self.k += self.valid

        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool) & ~terminated
        done = terminated | truncated
        emit = self.valid & ((self.k >= self.n) | done[None, :])
        slot, env = np.nonzero(emit)
        mode = np.where(terminated[env], BOOT_NONE, np.where(truncated[env], BOOT_FINAL, BOOT_NEXT)).astype(np.int8)
        next_obs = np.asarray(next_obs)
        if final_obs is None:
            boot_src = next_obs
        else:
            shape = (len(truncated),) + (1,) * (next_obs.ndim - 1)
            boot_src = np.where(truncated.reshape(shape), final_obs, next_obs)
        boot_obs = boot_src[env].copy()
        boot_obs[mode == BOOT_NONE] = 0
        out = Transitions(
            obs=self.obs[slot, env].copy(),
            actions=self.actions[slot, env].copy(),
            returns=self.ret[slot, env].astype(np.float32),
            discount=self.disc[slot, env].astype(np.float32),
            steps=self.k[slot, env].copy(),
            boot_mode=mode,
            boot_obs=boot_obs,
            env=env.astype(np.int64),
            marked=None if marked is None else self.marked[slot, env].copy(),
            # a transition learns the action taken in its first state: that state's features
            features=None if features is None else self._features_at(slot, env),
        )
        self.valid[emit] = False
        return out

    def _features_at(self, slot: np.ndarray, env: np.ndarray) -> torch.Tensor:
        """(B, F) a copy of the kept features of the states in ``slot``, ``env`` (the ring is reused)."""
        assert self.features is not None
        dev = self.features.device
        return self.features[torch.from_numpy(slot).to(dev), torch.from_numpy(env).to(dev)]
