"""experiments/refill_levers.py: the surface teacher's rule paid as reward, read from a real emulator's
screen, and lives started from saved states."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments import refill_levers as levers
from experiments.branch import ENV_ID, BranchGame
from experiments.probe import SavedState
from lib.envs import VecStep
from lib.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


class OneGame:
    """One real SeaQuest emulator behind the vector env's interface (``lib.envs.AtariVec``'s
    ``frames``, ``step_async`` / ``step_wait``), so its RAM can be set: divers aboard, oxygen."""

    game, env_id, n_envs = "seaquest", ENV_ID, 1

    def __init__(self, divers: int, oxygen: int) -> None:
        self.g = BranchGame(3)
        self.g.reset()
        down = self.g.meanings.index("DOWN")
        for _ in range(70):  # the new sub waits at the surface until its gauge is full, then dives
            self.g.step(down)
        self.g.ale.setRAM(62, divers)
        self.g.ale.setRAM(102, oxygen)
        self.g.step(self.g.meanings.index("NOOP"))
        self.frames = self.g.frame[None].copy()

    def step_async(self, actions: np.ndarray) -> None:
        self._action = int(actions[0])

    def step_wait(self) -> VecStep:
        reward, lost, over = self.g.step(self._action)
        self.frames = self.g.frame[None].copy()
        r = np.array([reward], dtype=np.float32)
        obs = self.g.stack[None].copy()
        flag = np.array([lost])
        return VecStep(obs, r, r.copy(), flag, np.array([False]), np.array([over]), obs, np.array([3]))


def saved_state(divers: int, oxygen: int) -> SavedState:
    """The state ``OneGame`` makes, saved as experiments.probe saves one (4 frames and the emulator)."""
    g = OneGame(divers, oxygen).g
    frames = []
    for _ in range(4):
        g.step(g.meanings.index("NOOP"))
        frames.append(g.frame.copy())
    return SavedState("00/00000000.dat", np.stack(frames), g.ale.cloneState().serialize(), oxygen, divers, 141, 0)


def play(env: levers.RuleRewardVec, action: str, steps: int) -> list[VecStep]:
    a = np.array([env.env.g.meanings.index(action)])
    return [env.step(a) for _ in range(steps)]


def test_a_climb_with_a_diver_and_a_low_gauge_is_paid_each_step_and_the_refill_once() -> None:
    climb = levers.RuleRewardVec(OneGame(divers=1, oxygen=12), "climb")
    steps = play(climb, "UP", 40)
    paid = [float(s.rewards[0] - s.true_rewards[0]) for s in steps]
    assert climb.refills == 1  # it reached the surface and refilled
    assert 15 <= climb.climb_steps <= 30  # ~24 steps of 4 rows from the sea bed
    assert sum(paid) == climb.paid_steps == climb.climb_steps
    assert set(paid) <= {0.0, 1.0}

    refill = levers.RuleRewardVec(OneGame(divers=1, oxygen=12), "refill")
    steps = play(refill, "UP", 40)
    assert refill.paid_steps == refill.refills == 1
    assert sum(float(s.rewards[0] - s.true_rewards[0]) for s in steps) == 1.0

    both = levers.RuleRewardVec(OneGame(divers=1, oxygen=12), "both")
    play(both, "UP", 40)
    assert both.paid_steps == climb.climb_steps + 1  # the refill step is no climb step

    none = levers.RuleRewardVec(OneGame(divers=1, oxygen=12), "none")  # counts, pays nothing
    steps = play(none, "UP", 40)
    assert (none.climb_steps, none.refills, none.paid_steps) == (climb.climb_steps, 1, 0)
    assert all(s.rewards[0] == s.true_rewards[0] for s in steps)


def test_no_diver_aboard_or_staying_down_earns_nothing() -> None:
    empty = levers.RuleRewardVec(OneGame(divers=0, oxygen=12), "both")  # surfaces to its death
    down = levers.RuleRewardVec(OneGame(divers=1, oxygen=12), "both")
    for env, action in ((empty, "UP"), (down, "DOWN")):
        steps = play(env, action, 40)
        assert env.paid_steps == 0 and env.refills == 0
        assert all(s.rewards[0] == s.true_rewards[0] for s in steps)


def test_a_game_without_the_gauge_is_refused() -> None:
    other = OneGame(1, 12)
    other.frames = np.zeros((1, 84, 84, 3), dtype=np.uint8)
    with pytest.raises(UserError, match="gauge"):
        levers.RuleRewardVec(other, "climb")


def test_every_start_and_every_life_lost_jumps_to_a_saved_state_at_share_one() -> None:
    state = saved_state(divers=1, oxygen=3)  # 3 of 63 left: it drowns within ~30 steps
    env = levers.SavedStartsVec(2, seed=5, states=[state], share=1.0)
    obs = env.reset()
    assert env.jumps == 2
    assert (env.frames == state.frames[-1]).all() and obs.shape == (2, 4, 84, 84)
    noop = np.zeros(2, dtype=np.int64)
    for _ in range(60):
        st = env.step(noop)
        if st.terminated.any():
            break
    assert st.terminated.all() and st.game_over.all() and env.jumps == 4  # both drowned, both jumped
    assert (env.frames == state.frames[-1]).all()
    assert st.true_rewards.tolist() == st.rewards.tolist()


def test_at_share_zero_the_games_are_the_games_own() -> None:
    state = saved_state(divers=1, oxygen=3)
    env = levers.SavedStartsVec(1, seed=5, states=[state], share=0.0)
    env.reset()
    assert env.jumps == 0 and not (env.frames == state.frames[-1]).all()
    st = env.step(np.zeros(1, dtype=np.int64))
    assert not st.game_over.any() and st.lives.tolist() == [4]  # a new game's subs


def test_an_empty_state_db_is_one_line() -> None:
    with pytest.raises(UserError, match="no readable state"):
        levers.SavedStartsVec(1, seed=0, states=[], share=0.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--a2c-args", "-n x -r some.pt"], "give --pay none"),
        (["--a2c-args", "-n x", "--start-states", "nowhere"], "--start-states nowhere"),
        (["--a2c-args", "-n x", "--start-share", "1.5"], "--start-share"),
        (["--a2c-args", "-n x --env PongNoFrameskip-v4", "--pay", "none"], "SeaQuest"),
        (["--a2c-args", "-n 'x"], "--a2c-args"),
        (["--a2c-args", "-n x", "--pay", "dive"], "--pay"),
    ],
)
def test_the_command_refuses_bad_values_in_one_line(args: list[str], message: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "experiments.refill_levers", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    assert message in p.stderr.strip().splitlines()[-1] and "Traceback" not in p.stderr  # one line says why
