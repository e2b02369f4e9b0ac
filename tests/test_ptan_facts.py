"""The ptan 0.8.1 behaviour that made us write lib/experience.py (DESIGN: dependency facts).

If one of these starts failing, ptan changed: re-read lib/experience.py's docstring and decide
whether its vector experience source can be used again.
"""

import gymnasium as gym
import numpy as np
import pytest

ptan = pytest.importorskip("ptan")


class CountingEnv(gym.Env):
    """Reward of step t is t + 1; never ends (or is truncated at ``trunc_at``)."""

    observation_space = gym.spaces.Box(0, 1000, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, trunc_at: int = 10_000):
        self.t, self.trunc_at = 0, trunc_at

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), float(self.t), False, self.t >= self.trunc_at, {}


class FirstAction(ptan.agent.BaseAgent):
    def __call__(self, states, agent_states):
        return np.zeros(len(states), np.int64), agent_states


def first_transitions(steps_count: int, trunc_at: int = 10_000, n: int = 3):
    env = gym.vector.SyncVectorEnv([lambda: CountingEnv(trunc_at)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    src = ptan.experience.VectorExperienceSourceFirstLast(env, FirstAction(), gamma=0.5, steps_count=steps_count)
    out = []
    for exp in src:
        out.append(exp)
        if len(out) >= n:
            return out
    return out


def test_vector_source_sums_n_plus_one_rewards():
    exp = first_transitions(steps_count=2)[0]
    assert exp.state[0] == 0
    # n = 2 would be 1 + 0.5*2 = 2.0; ptan 0.8.1 sums three rewards: 1 + 1 + 0.75
    assert exp.reward == pytest.approx(1 + 0.5 * 2 + 0.25 * 3)
    assert exp.last_state[0] == 3


def test_vector_source_does_not_bootstrap_truncation():
    exps = first_transitions(steps_count=3, trunc_at=2, n=2)
    # the episode is cut by a time limit at step 2: ptan marks it like a game over
    assert exps[0].last_state is None
