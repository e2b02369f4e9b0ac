"""Stage 1 as the lab runs it: every flag of ``01_a2c.py`` (``--a2c-args``), with the lab's hooks
(``lib.a2c.run.Hooks``) that the product leaves out:

- a fine-tune on SeaQuest logs its KL to the start policy on the low-gauge steps alone
  (``finetune/kl_low_gauge``: the steps where the refill is decided; ``experiments.ladder`` reads it);
- ``--reward-oracle`` sends the game's true per-step score through ``-r``'s path (its
  ``--reward-norm``, ``--reward-scale``, clip and ``--terminal``) in place of the model's prediction;
  with ``--reward-norm labels`` the centre and std are the score's over the same labelled clips,
  which stage 3 stores beside the model's (``score_mean`` / ``score_std``). What the path costs
  apart from the model's errors: ``experiments.round --oracle-arm`` runs it.

    python -m experiments.lab_a2c --reward-oracle \
        --a2c-args "-n oracle -m V0.pt -r reward.pt --finetune --reward-norm labels --max-steps 300000"

``experiments.refill_levers`` builds on the same hooks with an env of its own.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from lib.a2c.cli import main as a2c_main
from lib.a2c.cli import parse_config
from lib.a2c.config import A2CConfig
from lib.a2c.run import ORACLE_SOURCE, Hooks
from lib.atari.envs import VecStep
from lib.atari.seaquest import low_gauge, shows_gauge
from lib.core.errors import UserError, run_cli
from lib.core.settings import build_parser as settings_parser
from lib.core.settings import check_fields, setting


class TrueScore:
    """The oracle's reward source: each step's true score (what the env reports as it), with the
    score's stats over the reward model's labelled clips for ``--reward-norm labels``."""

    name = ORACLE_SOURCE  # what a last.pt of --reward-oracle from before it moved here was paid

    def __call__(self, st: VecStep) -> np.ndarray:
        return np.asarray(st.true_rewards, dtype=np.float32)

    def stats(self, model: Any) -> tuple[float, float] | None:
        stats = getattr(model, "score_stats", None)
        if stats is None or not all(math.isfinite(v) for v in stats) or stats[1] < 0:
            return None
        return stats


class LowGauge:
    """Marks the steps whose frame shows a low oxygen gauge (``lib.atari.seaquest.low_gauge``); none
    where the game shows no SeaQuest gauge."""

    name = "low_gauge"

    def __init__(self) -> None:
        self.shows: bool | None = None

    def __call__(self, frames: np.ndarray) -> np.ndarray:
        if self.shows is None:
            self.shows = shows_gauge("seaquest", tuple(np.shape(frames)[1:]))
        return low_gauge(frames) if self.shows else np.zeros(len(frames), dtype=bool)


def lab_hooks(cfg: A2CConfig, reward_oracle: bool = False) -> Hooks:
    """The lab's hooks for a run of ``cfg``: the low-gauge KL on SeaQuest, and the true score through
    -r's path with ``reward_oracle`` (one line where there is no -r)."""
    from lib.atari.envs import rom_name

    if reward_oracle and not cfg.reward:
        raise UserError("--reward-oracle sends the score through a learned reward's path: give -r in --a2c-args")
    marks = LowGauge() if rom_name(cfg.env) == "seaquest" else None
    return Hooks(reward_source=TrueScore() if reward_oracle else None, marks=marks)


@dataclass(frozen=True)
class LabSettings:
    """What ``python -m experiments.lab_a2c`` is told, one field per flag."""

    a2c_args: str = setting(help="01_a2c.py's flags, quoted as one string", group="run")
    reward_oracle: bool = setting(
        False,
        "learn from the game's true per-step score sent through -r's path (its --reward-norm, --reward-scale, "
        "clip and --terminal) instead of the model's prediction; with --reward-norm labels the score's "
        "statistics over the same labelled clips, stored in -r's checkpoint",
        group="run",
    )


def build_parser() -> argparse.ArgumentParser:
    return settings_parser(
        LabSettings, "python -m experiments.lab_a2c", "Stage 1 with the lab's hooks (module docstring)", {"run": "run"}
    )


def a2c_words(a2c_args: str) -> list[str]:
    """``--a2c-args`` split as a shell splits it; one line where it cannot be."""
    try:
        return shlex.split(a2c_args)
    except ValueError as e:
        raise UserError(f"--a2c-args {a2c_args!r}: {e}") from None


def a2c_config(a2c_args: str) -> A2CConfig:
    """``--a2c-args`` read by stage 1's own parser and checks."""
    return parse_config(a2c_words(a2c_args))


def main(argv: list[str] | None = None) -> int:
    a = LabSettings(**vars(build_parser().parse_args(argv)))
    check_fields(a)
    hooks = lab_hooks(a2c_config(a.a2c_args), a.reward_oracle)
    return a2c_main(a2c_words(a.a2c_args), hooks=hooks)  # as 01_a2c.py runs: torchrun, Ctrl-C


if __name__ == "__main__":
    sys.exit(run_cli(main))
