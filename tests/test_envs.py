"""The policy input made in one batched call, on real SeaQuest frames, and the env thread default."""

from __future__ import annotations

import os

import cv2
import numpy as np
import pytest

from lib.atari.envs import AtariVec, TorchGrey84, area_matrix, default_env_threads, grey84


def per_frame(frames: np.ndarray) -> np.ndarray:
    """The DeepMind preprocessing one frame at a time, as the project did it before (and as
    ptan/SB3's WarpFrame do): cvtColor to grey, then INTER_AREA to 84x84."""
    return np.stack(
        [cv2.resize(cv2.cvtColor(f, cv2.COLOR_RGB2GRAY), (84, 84), interpolation=cv2.INTER_AREA) for f in frames]
    )


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    """64 real SeaQuest frames from 4 envs of random play (the sub, sharks, the gauge, the score)."""
    env = AtariVec(n_envs=4, seed=11, num_threads=1)
    env.reset()
    rng = np.random.default_rng(0)
    out = []
    for t in range(160):
        env.step(rng.integers(0, env.n_actions, env.n_envs))
        if t % 10 == 0:
            out.append(env.frames.copy())
    env.close()
    return np.concatenate(out)


def test_batched_grey84_is_byte_identical_to_one_resize_per_frame(frames):
    assert frames.shape == (64, 210, 160, 3)
    want = per_frame(frames)
    assert want.std() > 10  # real pictures, not blank frames
    np.testing.assert_array_equal(grey84(frames), want)
    np.testing.assert_array_equal(grey84(frames[:1]), want[:1])
    assert grey84(frames[:0]).shape == (0, 84, 84)


def test_torch_grey84_is_within_one_grey_level(frames):
    want = per_frame(frames).astype(int)
    got = TorchGrey84(210, 160, "cpu")(frames).astype(int)
    diff = np.abs(got - want)
    assert diff.max() <= 1
    assert (diff == 0).mean() > 0.95  # OpenCV's rounding of the grey image is the only difference


def test_area_matrix_rows_average_the_covered_pixels():
    m = area_matrix(210, 84)
    np.testing.assert_allclose(m.sum(1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(m[0, :3], [0.4, 0.4, 0.2], rtol=1e-6)  # rows 0, 1 and half of 2
    assert area_matrix(168, 84)[0, :3].tolist() == [0.5, 0.5, 0.0]


def test_env_threads_default_to_the_cores_this_process_may_use():
    cores = len(os.sched_getaffinity(0))
    assert default_env_threads() == cores
    env = AtariVec(n_envs=64, seed=0)
    assert env.num_threads == cores
    env.close()
    env = AtariVec(n_envs=1, seed=0, num_threads=8)
    assert env.num_threads == 1  # never more threads than envs
    env.close()


def test_close_collects_a_step_in_flight():
    env = AtariVec(n_envs=2, seed=0, num_threads=1)
    env.reset()
    env.step_async(np.zeros(2, dtype=np.int64))
    env.close()  # must neither hang nor crash with the step never collected
