"""Two levers for teaching the refill that stage 1 lacks: the teacher's rule paid directly, and lives
started from saved low-gauge states.

A fine-tune on a learned reward is paid what the reward model learnt of the surface teacher's climb
rule, which is little beside what it learnt of a lost life, and it meets the situation the rule is
about (a low gauge with a diver aboard) on few of its steps. Stage 1 (``lib.a2c.train``, every flag
of ``01_a2c.py`` through ``--a2c-args``) runs here with either or both changed:

- ``--pay``: the true score plus, read from the screen (``lib.seaquest``), one point on each step of
  ``climb`` (the sub rose toward the surface with a low gauge and a diver aboard: the rows the
  surface teacher's ``diver_climb`` rule counts, ``SurfaceTracker.diver_climb_rows``), ``refill``
  (the gauge began to rise from above 0, ``OxygenTracker``) or ``both``. Stage 1 sign-clips the
  score (DeepMind's set-up), so a paid step is worth what a kill is worth, +1, however many rows it
  climbed. ``none`` pays the score alone, or with ``-r`` the learned reward (the rule's pay and a
  reward model do not mix: the model replaces the reward).
- ``--start-states DIR``: the envs are SeaQuest emulators of their own (``SavedStartsVec``, stepped
  as ``AtariVec`` steps them, one thread), and each life lost ends, with probability
  ``--start-share``, in a jump to one of the saved states of ``DIR`` (found by
  ``experiments.probe``'s finder on seeds of their own: never the probe's held-out states). The jump
  is a new game for the learner and for the training scores, which are then scores of parts of
  games.

If a policy paid the rule still does not refill, what holds the refill back is the learner (its
exploration, the KL pull, how often it meets the situation), not the reward model; if it does, the
reward model's climb signal is what to grow. The counts (paid steps, refills, jumps, games) go to
``refill_levers.json`` in the run's ``--save`` directory; the probe (``experiments.probe``) then
tells what the policy does from the held-out low-gauge states.

    python -m experiments.refill_levers --pay climb --start-states runs/probe/train3M \
        --a2c-args "-n lever -m V0.pt --finetune --kl-target 0.1 --max-steps 300000 --test-every 0 \
        --save runs/ft/lever"
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.branch import ENV_ID, BranchGame
from experiments.probe import SavedState, load_states, restore_state
from lib.a2c_cli import parse_config
from lib.envs import AtariVec, VecStep, grey84, rom_name
from lib.errors import UserError, run_cli
from lib.files import atomic_write
from lib.seaquest import OxygenTracker, SurfaceTracker, divers_aboard, oxygen_levels, shows_gauge, sub_rows
from lib.settings import build_parser as settings_parser
from lib.settings import check_fields, in_range, setting

PAYS = ("none", "climb", "refill", "both")
SUMMARY_FILE = "refill_levers.json"


class SavedStartsVec:
    """N SeaQuest emulators with ``AtariVec``'s interface (``frames``, ``reset``, ``step_async`` /
    ``step_wait`` giving a ``VecStep``), each a ``BranchGame``; a life lost ends, with probability
    ``share``, in a jump to a random one of ``states`` (a new game: ``game_over`` is set)."""

    def __init__(self, n_envs: int, seed: int, states: list[SavedState], share: float) -> None:
        if not states:
            raise UserError("--start-states holds no readable state")
        self.env_id, self.game, self.n_envs = ENV_ID, "seaquest", n_envs
        self.games = [BranchGame(seed + i) for i in range(n_envs)]
        self.action_meanings = self.games[0].meanings
        self.n_actions = len(self.action_meanings)
        self.obs_shape = self.games[0].stack.shape
        self.states, self.share = states, share
        self.rng = np.random.default_rng([seed, 1])
        self.jumps = 0
        self.frames = np.zeros((n_envs, 210, 160, 3), dtype=np.uint8)
        self.lives = np.zeros(n_envs, dtype=np.int32)

    def _jump(self, g: BranchGame) -> None:
        s = self.states[int(self.rng.integers(len(self.states)))]
        g.load((restore_state(s.ale), s.frames[-1], grey84(s.frames)))
        self.jumps += 1

    def _show(self) -> np.ndarray:
        self.frames = np.stack([g.frame for g in self.games])  # a new array each step, as AtariVec hands out
        self.lives = np.array([g.ale.lives() for g in self.games], dtype=np.int32)
        return np.stack([g.stack for g in self.games])

    def reset(self) -> np.ndarray:
        for g in self.games:
            g.reset()
            if self.rng.random() < self.share:
                self._jump(g)
        return self._show()

    def step_async(self, actions: np.ndarray) -> None:
        self._actions = np.asarray(actions).tolist()

    def step(self, actions: np.ndarray) -> VecStep:
        self.step_async(actions)
        return self.step_wait()

    def step_wait(self) -> VecStep:
        n = self.n_envs
        rewards, lost, over = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        final = np.zeros((n, *self.obs_shape), dtype=np.uint8)
        for i, (g, a) in enumerate(zip(self.games, self._actions, strict=True)):
            rewards[i], lost[i], over[i] = g.step(a)
            final[i] = g.stack
            if lost[i] and self.rng.random() < self.share:
                self._jump(g)
                over[i] = True
            elif over[i]:
                g.reset()
        obs = self._show()
        no = np.zeros(n, dtype=bool)
        return VecStep(obs, rewards, rewards.copy(), lost, no, over, final, self.lives.copy())

    def close(self) -> None:
        pass


class RuleRewardVec:
    """A vector env whose ``rewards`` are the score plus +1 on each step the rule pays (module
    docstring); ``true_rewards`` stay the score. Everything else is the wrapped env's."""

    def __init__(self, env: Any, pay: str) -> None:
        if not shows_gauge(env.game, tuple(np.shape(env.frames)[1:])):
            raise UserError(f"the rule reads SeaQuest's gauge: {env.env_id} has none")
        self.env, self.pay = env, pay
        self._fresh()
        self.paid_steps = self.climb_steps = self.games = self.steps = 0

    def _fresh(self) -> None:
        n = self.env.n_envs
        self._oxygen = [OxygenTracker() for _ in range(n)]
        self._surface = [SurfaceTracker() for _ in range(n)]

    def __getattr__(self, name: str) -> Any:
        if name == "env":  # not set yet: no recursion through __getattr__
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self) -> np.ndarray:
        obs = self.env.reset()
        self._fresh()
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        self._shown = np.asarray(self.env.frames)  # the frames these actions were chosen on
        self.env.step_async(actions)

    def step(self, actions: np.ndarray) -> Any:
        self.step_async(actions)
        return self.step_wait()

    def step_wait(self) -> Any:
        st = self.env.step_wait()
        ended = np.asarray(st.terminated | st.truncated | st.game_over, dtype=bool)
        readings = zip(
            oxygen_levels(self._shown).tolist(),
            sub_rows(self._shown).tolist(),
            divers_aboard(self._shown).tolist(),
            ended.tolist(),
            strict=True,
        )
        bonus = np.zeros(len(ended), dtype=np.float32)
        for i, (level, row, divers, lost) in enumerate(readings):
            ox, sf = self._oxygen[i], self._surface[i]
            refills, climbed = ox.counts.refills, sf.counts.diver_climb_rows
            ox.step(level, lost)
            sf.step(level, row, lost, divers)
            refilled, climb = ox.counts.refills > refills, sf.counts.diver_climb_rows > climbed
            self.climb_steps += climb
            paid = (climb and self.pay in ("climb", "both")) or (refilled and self.pay in ("refill", "both"))
            self.paid_steps += paid
            bonus[i] = float(paid)
        self.games += int(np.sum(st.game_over))
        self.steps += len(ended)
        st.rewards = (np.asarray(st.rewards, dtype=np.float32) + bonus).astype(np.float32)
        return st

    @property
    def refills(self) -> int:
        """Refills since the last reset, over all envs (the trackers' own counts)."""
        return sum(ox.counts.refills for ox in self._oxygen)

    @property
    def low_diver_steps(self) -> int:
        return sum(sf.counts.low_diver_steps for sf in self._surface)

    def summary(self) -> dict[str, Any]:
        return {
            "pay": self.pay,
            "agent_steps": self.steps,
            "games": self.games,
            "low_diver_steps": self.low_diver_steps,
            "climb_steps": self.climb_steps,
            "paid_steps": self.paid_steps,
            "refills": self.refills,
            "refills_per_game": self.refills / self.games if self.games else None,
        }


GROUPS = {"run": "the run", "levers": "the levers"}


@dataclass(frozen=True)
class LeverSettings:
    """What ``python -m experiments.refill_levers`` is told, one field per flag."""

    a2c_args: str = setting(help="01_a2c.py's flags, quoted as one string", group="run")
    pay: str = setting(
        "climb",
        "which steps earn +1 beside the score (none: the score, or -r's learned reward)",
        group="levers",
        choices=PAYS,
    )
    start_states: Path | None = setting(
        None, "a DB of saved states (experiments.probe's) lives may start from", group="levers", type=Path
    )
    start_share: float = setting(
        0.5,
        "with --start-states: the share of lives lost that jump to a saved state",
        group="levers",
        checks=in_range("--start-share", 0.0, 1.0),
    )


def build_parser() -> argparse.ArgumentParser:
    return settings_parser(
        LeverSettings,
        "python -m experiments.refill_levers",
        "Fine-tune with the surface teacher's rule paid directly and / or lives started from saved "
        "low-gauge states (module docstring)",
        GROUPS,
    )


def main(argv: list[str] | None = None) -> int:
    a = LeverSettings(**vars(build_parser().parse_args(argv)))
    check_fields(a)
    try:
        words = shlex.split(a.a2c_args)
    except ValueError as e:
        raise UserError(f"--a2c-args {a.a2c_args!r}: {e}") from None
    cfg = parse_config(words)
    if cfg.reward and a.pay != "none":
        raise UserError(f"--pay {a.pay} with -r: the reward model replaces the rule's pay (give --pay none)")
    if rom_name(cfg.env) != "seaquest":
        raise UserError(f"--a2c-args --env {cfg.env}: the levers read SeaQuest's screen")
    states = None
    if a.start_states is not None:
        if not a.start_states.is_dir():
            raise UserError(f"--start-states {a.start_states}: not a directory")
        states = load_states(a.start_states)
        print(f"{len(states)} saved states from {a.start_states}; {a.start_share:.0%} of lives lost jump to one")
    from lib.a2c import train

    wrapped: list[RuleRewardVec] = []

    def make_env(env_id: str, n_envs: int, seed: int, **kwargs: Any) -> RuleRewardVec:
        first = not wrapped  # the envs trained on (an evaluation env, made second, plays real games)
        base = SavedStartsVec(n_envs, seed, states, a.start_share) if states is not None and first else None
        env = RuleRewardVec(base or AtariVec(env_id, n_envs, seed=seed, **kwargs), a.pay if first else "none")
        wrapped.append(env)
        return env

    rc = train(cfg, make_env=make_env)
    if wrapped:
        out = wrapped[0].summary()
        if states is not None:
            out["jumps"] = wrapped[0].env.jumps
        print("levers: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in out.items()))
        atomic_write(Path(cfg.save_dir) / SUMMARY_FILE, json.dumps(out, indent=1).encode())
    return rc


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
