"""EpisodeRecorderWrapper: segments pair frame t with action t and reward t."""

import numpy as np

from lib.envs import AtariVec, VecStep
from lib.recorder import EpisodeRecorderWrapper
from lib.segments import list_segments, load_segment


class CountingEnv:
    """Toy vector env: frame pixel = step number, reward of step t = 10 t + env."""

    def __init__(self, n_envs=2):
        self.n_envs, self.env_id, self.action_meanings = n_envs, "Toy-v0", ("A", "B", "C")
        self.t = 0
        self.frames = np.zeros((n_envs, 210, 160, 3), np.uint8)
        self.lives = np.full(n_envs, 3, np.int32)

    def reset(self):
        return np.zeros((self.n_envs, 1), np.uint8)

    def step_async(self, actions):
        self._a = actions

    def step_wait(self):
        r = (10 * self.t + np.arange(self.n_envs)).astype(np.float32)
        self.t += 1
        self.frames = np.full((self.n_envs, 210, 160, 3), self.t % 256, np.uint8)
        z = np.zeros(self.n_envs, bool)
        obs = np.zeros((self.n_envs, 1), np.uint8)
        return VecStep(obs, r, r.copy(), z, z, z, obs, self.lives.copy())

    def step(self, actions):
        self.step_async(actions)
        return self.step_wait()

    def close(self):
        pass


def test_toy_env_alignment(tmp_path):
    env = EpisodeRecorderWrapper(
        CountingEnv(2), tmp_path, record_prob=1.0, segment_steps=5, rng=np.random.default_rng(0)
    )
    env.reset()
    for t in range(12):
        env.step(np.array([t % 3, (t + 1) % 3]))
    env.close()
    segs = list_segments(tmp_path)
    assert segs == ["00/00000005.dat", "00/00000010.dat", "01/00000005.dat", "01/00000010.dat"]
    seg = load_segment(tmp_path / "01/00000010.dat")
    # steps 5..9 of env 1: frame shown before step t has pixel t, action (t+1)%3, reward 10t+1
    assert list(seg.frames[:, 0, 0, 0]) == [5, 6, 7, 8, 9]
    assert list(seg.actions) == [(t + 1) % 3 for t in range(5, 10)]
    assert list(seg.rewards) == [10 * t + 1 for t in range(5, 10)]
    assert seg.env_index == 1 and seg.step == 10 and seg.env_id == "Toy-v0"


def test_never_overwrites_an_existing_db(tmp_path):
    for _ in range(2):
        env = EpisodeRecorderWrapper(CountingEnv(1), tmp_path, record_prob=1.0, segment_steps=4)
        env.reset()
        for _t in range(4):
            env.step(np.array([0]))
        env.close()
    assert list_segments(tmp_path) == ["00/00000004.dat", "00/00000008.dat"]


def test_real_ale_frames_actions_rewards(tmp_path):
    """On the real emulator: the recorded frame is the one the action was chosen on."""
    base = AtariVec("SeaquestNoFrameskip-v4", 2, seed=1)
    env = EpisodeRecorderWrapper(base, tmp_path, record_prob=1.0, segment_steps=30, rng=np.random.default_rng(0))
    env.reset()
    rng = np.random.default_rng(0)
    seen_frames, seen_actions, seen_rewards = [], [], []
    for _ in range(30):
        a = rng.integers(0, base.n_actions, 2)
        seen_frames.append(base.frames[0].copy())
        st = env.step(a)
        seen_actions.append(a[0])
        seen_rewards.append(st.true_rewards[0])
    env.close()
    seg = load_segment(tmp_path / "00/00000030.dat")
    np.testing.assert_array_equal(seg.frames, np.stack(seen_frames))
    np.testing.assert_array_equal(seg.actions, seen_actions)
    np.testing.assert_array_equal(seg.rewards, seen_rewards)
    assert seg.frames.shape == (30, 210, 160, 3)
    assert seg.action_meanings[:2] == ("NOOP", "FIRE")
    # the frames move: it is a real game, not a frozen screen
    assert len({f.tobytes() for f in seg.frames}) > 10
