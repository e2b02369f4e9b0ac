"""n-step transitions on a toy vector env whose answers are worked out by hand."""

import numpy as np
import pytest

from lib.a2c.experience import BOOT_FINAL, BOOT_NEXT, BOOT_NONE, NStepCollector, Transitions

GAMMA = 0.5  # powers of 0.5 keep the hand-computed sums exact


def run(rewards, terminated, truncated, n, n_envs=1):
    """Feed a scripted episode: obs at step t is t (so a transition names its start step)."""
    col = NStepCollector(n_envs, (1,), n, GAMMA)
    out = []
    for t in range(len(rewards)):
        obs = np.full((n_envs, 1), t, dtype=np.uint8)
        nxt = np.full((n_envs, 1), t + 1, dtype=np.uint8)
        final = np.full((n_envs, 1), 200 + t, dtype=np.uint8)  # distinct "last obs" marker
        out.append(
            col.add(
                obs,
                np.zeros(n_envs, np.int64),
                np.full(n_envs, rewards[t], np.float32),
                np.full(n_envs, terminated[t]),
                np.full(n_envs, truncated[t]),
                nxt,
                final,
            )
        )
    return Transitions.concat(out)


def test_full_window_sums_n_rewards_and_bootstraps_with_gamma_power_n():
    tr = run([1, 2, 3, 4, 5, 6], [False] * 6, [False] * 6, n=3)
    # Transitions start at 0..3 (t=4,5 are still pending): 4 emitted.
    assert list(tr.obs[:, 0]) == [0, 1, 2, 3]
    assert list(tr.steps) == [3, 3, 3, 3]
    np.testing.assert_allclose(tr.returns, [1 + 0.5 * 2 + 0.25 * 3, 2 + 1.5 + 1.0, 3 + 2 + 1.25, 4 + 2.5 + 1.5])
    np.testing.assert_allclose(tr.discount, [GAMMA**3] * 4)
    assert list(tr.boot_mode) == [BOOT_NEXT] * 4
    # Bootstrap state is the one after the last summed reward: start + 3.
    assert list(tr.boot_obs[:, 0]) == [3, 4, 5, 6]


def test_termination_cuts_returns_and_never_mixes_episodes():
    # Episode ends (terminated) at step 2; a new one starts at step 3.
    tr = run([1, 1, 1, 8, 8], [False, False, True, False, False], [False] * 5, n=4)
    by_start = {int(o): i for i, o in enumerate(tr.obs[:, 0])}
    assert sorted(by_start) == [0, 1, 2]  # 3 and 4 are pending: no 4 rewards yet
    i0 = by_start[0]
    assert tr.steps[i0] == 3 and tr.boot_mode[i0] == BOOT_NONE
    np.testing.assert_allclose(tr.returns[i0], 1 + 0.5 + 0.25)  # the 8s of the next episode never enter
    assert tr.steps[by_start[2]] == 1
    np.testing.assert_allclose(tr.discount, GAMMA**tr.steps)
    assert (tr.boot_obs[tr.boot_mode == BOOT_NONE] == 0).all()


def test_truncation_bootstraps_from_the_final_obs():
    tr = run([1, 1, 1], [False, False, False], [False, True, False], n=5)
    assert list(tr.obs[:, 0]) == [0, 1]
    assert list(tr.boot_mode) == [BOOT_FINAL, BOOT_FINAL]
    assert list(tr.boot_obs[:, 0]) == [201, 201]  # final obs of step 1, not the reset obs
    assert list(tr.steps) == [2, 1]
    np.testing.assert_allclose(tr.discount, [0.25, 0.5])


@pytest.mark.parametrize("n", [1, 2, 5])
def test_every_transition_discount_matches_rewards_summed(n):
    rng = np.random.default_rng(n)
    T = 50
    term = rng.random(T) < 0.1
    trunc = (rng.random(T) < 0.05) & ~term
    rew = rng.integers(-1, 2, T).astype(np.float32)
    tr = run(rew, term, trunc, n=n)
    np.testing.assert_allclose(tr.discount, GAMMA ** tr.steps.astype(float), rtol=1e-6)
    assert (tr.steps >= 1).all() and (tr.steps <= n).all()
    # Recompute every return by hand from the scripted stream.
    for o, k, g, mode in zip(tr.obs[:, 0], tr.steps, tr.returns, tr.boot_mode, strict=True):
        t = int(o)
        expect = sum(GAMMA**i * rew[t + i] for i in range(k))
        assert g == pytest.approx(expect, abs=1e-5)
        end = t + k - 1
        # A transition stops exactly at its episode's end, or after n rewards inside it.
        assert not (term[t:end] | trunc[t:end]).any()
        if mode == BOOT_NONE:
            assert term[end]
        elif mode == BOOT_FINAL:
            assert trunc[end]
        else:
            assert k == n and not term[end] and not trunc[end]
    # Each start step is emitted once unless still pending at the end.
    starts = sorted(int(o) for o in tr.obs[:, 0])
    assert len(starts) == len(set(starts))
    assert starts == list(range(len(starts)))


def test_envs_are_independent():
    col = NStepCollector(2, (1,), 2, GAMMA)
    obs = np.array([[0], [100]], np.uint8)
    out = col.add(
        obs, np.array([0, 1]), np.array([1.0, 5.0]), np.array([True, False]), np.array([False, False]), obs + 1
    )
    assert list(out.env) == [0] and out.returns[0] == 1.0 and out.boot_mode[0] == BOOT_NONE
    out = col.add(
        obs + 1, np.array([0, 1]), np.array([2.0, 7.0]), np.array([False, False]), np.array([False, False]), obs + 2
    )
    assert list(out.env) == [1] and out.returns[0] == pytest.approx(5 + 0.5 * 7) and out.obs[0, 0] == 100
    assert out.boot_obs[0, 0] == 102


def test_marks_travel_with_the_transition_they_started():
    """``marked`` given per step and env comes out on the transition that started at that step (the
    KL on marked steps, such as the lab's low-gauge ones, is taken over exactly those); not given,
    the transitions carry none."""
    col = NStepCollector(2, (1,), 3, GAMMA)
    flags = [np.array([t % 3 == 0, t % 2 == 0]) for t in range(8)]
    out = []
    for t in range(8):
        obs = np.array([[t], [100 + t]], dtype=np.uint8)
        z = np.zeros(2, bool)
        out.append(col.add(obs, np.zeros(2, np.int64), np.ones(2, np.float32), z, z, obs + 1, None, flags[t]))
    tr = Transitions.concat(out)
    for o, e, marked in zip(tr.obs[:, 0], tr.env, tr.marked, strict=True):
        t = int(o) - 100 * int(e)
        assert marked == flags[t][e]
    assert tr.marked.any() and not tr.marked.all()
    assert run([1, 2, 3, 4], [False] * 4, [False] * 4, n=2).marked is None
