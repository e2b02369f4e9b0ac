"""A lever for teaching the refill that stage 1 lacks: the teacher's rule paid directly, with or
without lives started from saved low-gauge states.

A fine-tune on a learned reward is paid what the reward model learnt of the surface teacher's climb
rule, which is little beside what it learnt of a lost life, and it meets the situation the rule is
about (a low gauge with a diver aboard) on few of its steps. Stage 1 (``lib.a2c.train.train``, every flag
of ``01_a2c.py`` through ``--a2c-args``) runs here with its reward changed:

- ``--pay``: the true score plus, read from the screen (``lib.atari.seaquest``), one point on each step of
  ``climb`` (the sub rose toward the surface with a low gauge and a diver aboard: the rows the
  surface teacher's ``diver_climb`` rule counts, ``SurfaceTracker.diver_climb_rows``), ``refill``
  (the gauge began to rise from above 0, ``OxygenTracker``) or ``both``. Stage 1 sign-clips the
  score (DeepMind's set-up), so a paid step is worth what a kill is worth, +1, however many rows it
  climbed. ``none`` pays the score alone, or with ``-r`` the learned reward (the rule's pay and a
  reward model do not mix: the model replaces the reward).
- ``01_a2c.py --start-states DIR`` in ``--a2c-args`` (``lib.atari.saved_states``): lives start from saved
  low-gauge states (found by ``experiments.probe``'s finder on seeds of their own: never the probe's
  held-out states); the counts then give the jumps too.

``--through-path`` sends the pay through the learned reward's own path instead (the ladder's rung
between the rule and a model): with ``-r MODEL`` in ``--a2c-args``, stage 1 normalises, clips and
scales what the env reports as its true reward (``experiments.lab_a2c``'s oracle source), and here that is the pay (the
score's sign plus the paid steps), so the learner gets the pay as ``-r`` shapes a model's
prediction; the run's logged game scores are then sums of pay, not points (the probe and
``04_play.py`` measure the policy).

If a policy paid the rule still does not refill, what holds the refill back is the learner (its
exploration, the KL pull, how often it meets the situation), not the reward model; if it does, the
reward model's climb signal is what to grow. The counts (paid steps, refills, jumps, games) go to
``refill_levers.json`` in the run's ``--save`` directory; the probe (``experiments.probe``) then
tells what the policy does from the held-out low-gauge states.

    python -m experiments.refill_levers --pay climb \
        --a2c-args "-n lever -m V0.pt --finetune --kl-target 0.1 --start-states runs/probe/train3M \
        --max-steps 300000 --test-every 0 --save runs/ft/lever"
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.lab_a2c import a2c_config, a2c_words, lab_hooks
from lib.a2c.cli import main as a2c_main
from lib.atari.envs import rom_name
from lib.atari.saved_states import vec_env
from lib.atari.seaquest import PayTracker, divers_aboard, oxygen_levels, shows_gauge, sub_rows
from lib.core.errors import UserError, run_cli
from lib.core.files import atomic_write
from lib.core.settings import build_parser as settings_parser
from lib.core.settings import check_fields, setting

PAYS = ("none", "climb", "refill", "both")
SUMMARY_FILE = "refill_levers.json"


class RuleRewardVec:
    """A vector env whose ``rewards`` are the score plus +1 on each step the rule pays (module
    docstring); ``true_rewards`` stay the score. Everything else is the wrapped env's."""

    def __init__(self, env: Any, pay: str, through_path: bool = False) -> None:
        if not shows_gauge(env.game, tuple(np.shape(env.frames)[1:])):
            raise UserError(f"the rule reads SeaQuest's gauge: {env.env_id} has none")
        self.env, self.pay, self.through_path = env, pay, through_path
        self._fresh()
        self.paid_steps = self.climb_steps = self.games = self.steps = 0

    def _fresh(self) -> None:
        self._pay = [PayTracker() for _ in range(self.env.n_envs)]

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
            climb, refilled, _ = self._pay[i].step(level, row, divers, lost)
            self.climb_steps += climb
            paid = (climb and self.pay in ("climb", "both")) or (refilled and self.pay in ("refill", "both"))
            self.paid_steps += paid
            bonus[i] = float(paid)
        self.games += int(np.sum(st.game_over))
        self.steps += len(ended)
        if self.through_path:  # the oracle source (experiments.lab_a2c) reads the pay as the true reward
            st.true_rewards = (np.sign(np.asarray(st.true_rewards, dtype=np.float32)) + bonus).astype(np.float32)
        else:
            st.rewards = (np.asarray(st.rewards, dtype=np.float32) + bonus).astype(np.float32)
        return st

    @property
    def refills(self) -> int:
        """Refills since the last reset, over all envs (the trackers' own counts)."""
        return sum(p.oxygen.counts.refills for p in self._pay)

    @property
    def low_diver_steps(self) -> int:
        return sum(p.surface.counts.low_diver_steps for p in self._pay)

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
    through_path: bool = setting(
        False,
        "send the pay through the learned reward's path (normalise, clip, scale) instead of beside the "
        "sign-clipped score: needs -r MODEL in --a2c-args (its path, not its predictions)",
        group="levers",
    )


def build_parser() -> argparse.ArgumentParser:
    return settings_parser(
        LeverSettings,
        "python -m experiments.refill_levers",
        "Fine-tune with the surface teacher's rule paid directly (module docstring)",
        GROUPS,
    )


def main(argv: list[str] | None = None) -> int:
    a = LeverSettings(**vars(build_parser().parse_args(argv)))
    check_fields(a)
    cfg = a2c_config(a.a2c_args)
    if a.through_path and (a.pay == "none" or not cfg.reward):
        raise UserError("--through-path sends a --pay other than none through -r's path: give -r MODEL in --a2c-args")
    if cfg.reward and a.pay != "none" and not a.through_path:
        raise UserError(f"--pay {a.pay} with -r: the reward model replaces the rule's pay (give --pay none)")
    if rom_name(cfg.env) != "seaquest":
        raise UserError(f"--a2c-args --env {cfg.env}: the levers read SeaQuest's screen")

    wrapped: list[RuleRewardVec] = []

    def make_env(env_id: str, n_envs: int, seed: int, **kwargs: Any) -> RuleRewardVec:
        first = not wrapped  # the envs trained on (an evaluation env, made second, plays real games)
        pay = a.pay if first else "none"
        env = RuleRewardVec(vec_env(env_id, n_envs, seed=seed, **kwargs), pay, a.through_path and first)
        wrapped.append(env)
        return env

    hooks = lab_hooks(cfg, reward_oracle=a.through_path)
    rc = a2c_main(a2c_words(a.a2c_args), hooks=hooks, make_env=make_env)  # as 01_a2c.py runs: Ctrl-C too
    if wrapped:
        out = wrapped[0].summary()
        if cfg.start_states:
            out["jumps"] = wrapped[0].env.jumps
        print("levers: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in out.items()))
        atomic_write(Path(cfg.save_dir) / SUMMARY_FILE, json.dumps(out, indent=1).encode())
    return rc


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
