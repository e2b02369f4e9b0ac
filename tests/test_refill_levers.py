"""experiments/refill_levers.py: the surface teacher's rule paid as reward, read from a real emulator's
screen."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments import refill_levers as levers
from experiments.branch import ENV_ID
from lib.atari.envs import VecStep
from lib.atari.saved_states import SingleGame
from lib.atari.seaquest import step_pay
from lib.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


class OneGame:
    """One real SeaQuest emulator behind the vector env's interface (``lib.atari.envs.AtariVec``'s
    ``frames``, ``step_async`` / ``step_wait``), so its RAM can be set: divers aboard, oxygen."""

    game, env_id, n_envs = "seaquest", ENV_ID, 1

    def __init__(self, divers: int, oxygen: int) -> None:
        self.g = SingleGame(3)
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


def test_the_pays_owner_gives_the_levers_counts_on_the_recorded_clip() -> None:
    """lib.atari.seaquest.step_pay on the frames the levers' env showed (the ones each action was chosen
    on), its true rewards and life ends: the same climb steps, refills and paid steps, step by step."""
    both = levers.RuleRewardVec(OneGame(divers=1, oxygen=12), "both")
    up = np.array([both.env.g.meanings.index("UP")])
    shown, steps = [], []
    for action in (up,) * 40:
        shown.append(both.env.frames[0].copy())
        steps.append(both.step(action))
    bonus = np.array([float(s.rewards[0] - s.true_rewards[0]) for s in steps])
    rewards = np.array([s.true_rewards[0] for s in steps], dtype=np.float32)
    lost = np.array([bool(s.terminated[0] or s.game_over[0]) for s in steps])
    pay = step_pay(np.stack(shown), rewards, lost)
    assert int(pay.climb.sum()) == both.climb_steps > 0
    assert int(pay.refill.sum()) == both.refills == 1
    assert int((pay.climb | pay.refill).sum()) == both.paid_steps
    # The same moves paid: the levers' env reads the frame an action was chosen on, so it pays a
    # move on the step after it; the clip's pay goes to the step whose action made the move.
    assert np.array_equal((pay.climb | pay.refill)[:-1].astype(float), bonus[1:]) and bonus[0] == 0
    assert np.array_equal(pay.pay, np.sign(rewards) + pay.climb + pay.refill)
    assert int(pay.low_diver.sum()) == both.low_diver_steps > 0


def test_through_the_path_the_pay_is_what_the_env_reports_as_its_true_reward() -> None:
    """--through-path: the oracle source through -r's path (experiments.lab_a2c) normalises the env's true
    reward, so the pay goes there (the score's sign plus the paid steps) and the rewards stay the score."""
    plain = levers.RuleRewardVec(OneGame(divers=1, oxygen=12), "both")
    path = levers.RuleRewardVec(OneGame(divers=1, oxygen=12), "both", through_path=True)
    paid = [float(s.rewards[0] - s.true_rewards[0]) for s in play(plain, "UP", 40)]
    steps = play(path, "UP", 40)
    assert [float(s.true_rewards[0]) for s in steps] == paid  # no points on this climb: the pay alone
    assert sum(paid) == path.paid_steps > 0
    assert all(float(s.rewards[0]) == 0.0 for s in steps)  # the score, for the wrapper to replace


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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--a2c-args", "-n x -r some.pt"], "give --pay none"),
        (["--a2c-args", "-n x", "--pay", "both", "--through-path"], "give -r MODEL in --a2c-args"),
        (["--a2c-args", "-n x", "--pay", "none", "--through-path"], "--through-path sends a --pay other than none"),
        (["--a2c-args", "-n x --start-states nowhere"], "--start-states nowhere"),
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
