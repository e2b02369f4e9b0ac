"""The teacher's rule paid directly: an upper bound for what a fine-tune can learn of the refill.

A fine-tune on a learned reward is paid what the reward model learnt of the surface teacher's
climb rule, which is little beside what it learnt of a lost life. This pays the rule itself: stage 1
(``lib.a2c.train``, every flag of ``01_a2c.py`` through ``--a2c-args``) learns from the true score
plus, read from the screen (``lib.seaquest``), one point on each step of ``--pay``:

- ``climb``: the sub rose toward the surface with a low gauge and a diver aboard (the rows the
  surface teacher's ``diver_climb`` rule counts, ``SurfaceTracker.diver_climb_rows``);
- ``refill``: the gauge began to rise from above 0 (a voluntary refill, ``OxygenTracker``);
- ``both``: either.

Stage 1 sign-clips the score (DeepMind's set-up), so a paid step is worth what a kill is worth, +1,
however many rows it climbed. If a policy so paid still does not refill, what holds the refill back
is the learner (its exploration, the KL pull, the steps it is given), not the reward model; if it
does, the reward model's climb signal is what to grow. The counts (paid steps, refills, games) go
to ``rule_reward.json`` in the run's ``--save`` directory; the probe (``experiments.probe``) then
tells what the policy does from the held-out low-gauge states.

    python -m experiments.rule_reward --pay climb --a2c-args "-n rule -m V0.pt --finetune \\
        --kl-target 0.1 --max-steps 300000 --test-every 0 --save runs/ft/rule"
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

from lib.a2c_cli import parse_config
from lib.envs import AtariVec
from lib.errors import UserError, run_cli
from lib.files import atomic_write
from lib.seaquest import OxygenTracker, SurfaceTracker, divers_aboard, oxygen_levels, shows_gauge, sub_rows
from lib.settings import build_parser as settings_parser
from lib.settings import check_fields, setting

PAYS = ("climb", "refill", "both")
SUMMARY_FILE = "rule_reward.json"


class RuleRewardVec:
    """A vector env whose ``rewards`` are the score plus +1 on each step the rule pays (module
    docstring); ``true_rewards`` stay the score. Everything else is the wrapped env's."""

    def __init__(self, env: Any, pay: str) -> None:
        if not shows_gauge(env.game, tuple(np.shape(env.frames)[1:])):
            raise UserError(f"the rule reads SeaQuest's gauge: {env.env_id} has none")
        self.env, self.pay = env, pay
        self._fresh()
        self.paid_steps = self.climb_steps = self.refills = self.games = self.steps = 0

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
            self.refills += refilled
            self.climb_steps += climb
            paid = (climb and self.pay != "refill") or (refilled and self.pay != "climb")
            self.paid_steps += paid
            bonus[i] = float(paid)
        self.games += int(np.sum(st.game_over))
        self.steps += len(ended)
        st.rewards = (np.asarray(st.rewards, dtype=np.float32) + bonus).astype(np.float32)
        return st

    def summary(self) -> dict[str, Any]:
        return {
            "pay": self.pay,
            "agent_steps": self.steps,
            "games": self.games,
            "paid_steps": self.paid_steps,
            "climb_steps": self.climb_steps,
            "refills": self.refills,
            "refills_per_game": self.refills / self.games if self.games else None,
        }


@dataclass(frozen=True)
class RuleRewardSettings:
    """What ``python -m experiments.rule_reward`` is told, one field per flag."""

    a2c_args: str = setting(
        help="01_a2c.py's flags, quoted as one string (no -r: the rule replaces the reward model)", group="rule"
    )
    pay: str = setting("climb", "which steps earn +1 beside the score", group="rule", choices=PAYS)


def build_parser() -> argparse.ArgumentParser:
    return settings_parser(
        RuleRewardSettings,
        "python -m experiments.rule_reward",
        "Fine-tune on the surface teacher's rule paid directly, read from the screen: the upper bound "
        "of what a learned reward could teach (module docstring)",
        {"rule": "the rule and the run"},
    )


def main(argv: list[str] | None = None) -> int:
    a = RuleRewardSettings(**vars(build_parser().parse_args(argv)))
    check_fields(a)
    try:
        words = shlex.split(a.a2c_args)
    except ValueError as e:
        raise UserError(f"--a2c-args {a.a2c_args!r}: {e}") from None
    cfg = parse_config(words)
    if cfg.reward:
        raise UserError("--a2c-args: no -r here: the rule's pay replaces the reward model")
    from lib.a2c import train

    wrapped: list[RuleRewardVec] = []

    def make_env(*args: Any, **kwargs: Any) -> RuleRewardVec:
        env = RuleRewardVec(AtariVec(*args, **kwargs), a.pay)
        wrapped.append(env)
        return env

    rc = train(cfg, make_env=make_env)
    if wrapped:  # the first is the one trained on (an evaluation env comes second)
        out = wrapped[0].summary()
        print(
            "rule reward: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in out.items())
        )
        atomic_write(Path(cfg.save_dir) / SUMMARY_FILE, json.dumps(out, indent=1).encode())
    return rc


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
