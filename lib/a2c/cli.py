"""``01_a2c.py``'s command line: the flags, grouped (core / policy / labels / output / speed), built
from ``A2CConfig``'s fields (each declares its flag, default, help and checks once); and ``main``,
which trains. Imports no torch until it runs: ``--help`` stays fast."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from lib.a2c.config import A2CConfig
from lib.core import settings
from lib.core.errors import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from lib.a2c.run import Hooks

GROUPS = {  # --help's groups, in order, and their titles
    "core": "core",
    "policy": "policy: where it starts, how it learns",
    "labels": "labels: the reward it learns from, the segments it records",
    "output": "output: checkpoints, evaluation, logs",
    "speed": "speed",
}


# where a lab flag went: given to stage 1, one line that names the experiment that has it now
MOVED = {
    "--reward-oracle": "moved to the lab: python -m experiments.lab_a2c --reward-oracle --a2c-args \"<01_a2c.py's "
    "flags>\" sends the true score through -r's path",
}
RETIRED = {  # flags the measurements closed: given, one line that says why and where the figures are
    "--bf16": "was retired after commit 3dfcf7a: give --precision bf16 (or --precision auto: bf16 where the "
    "CPU or GPU has it natively; speeds in docs/benchmarks.md)",
    "--reward-alive": "was retired after commit 546964c: it did not stop the agent dying sooner "
    "(0.88x, 0.62x, 0.64x the control, docs/results.md)",
    "--reward-penalty": "was retired after commit 546964c: the ensemble pessimism never helped in a round, and "
    "the ensemble it needs agreed less with the teacher (85.1% against 89.0%, docs/results.md)",
    "--reward-deadzone": "was retired after commit 55bcbf4: a learned reward paid only in its tails did not "
    "refill and lost the score (0.29x, 0.37x v0; 0% on the probe, docs/results.md)",
}


def build_parser() -> argparse.ArgumentParser:
    """01_a2c.py's flags in groups (``--help``), one per ``A2CConfig`` field; the retired ones refused."""
    return settings.retire(
        settings.build_parser(
            A2CConfig,
            "01_a2c.py",
            "Train an A2C agent on an Atari game. With --db-path it records random segments of "
            "its play for labeling; with -r it learns from a reward model instead of the game score.",
            GROUPS,
        ),
        RETIRED | MOVED,
    )


def parse_config(argv: list[str] | None = None) -> A2CConfig:
    """The command line as a checked ``A2CConfig``; ``-m`` a run directory stands for its best policy."""
    cfg = A2CConfig(**vars(build_parser().parse_args(argv)))
    if cfg.model:
        from lib.models.policy import policy_file

        cfg = replace(cfg, model=str(policy_file(cfg.model)))
    cfg.check()
    return cfg


def main(argv: list[str] | None = None, hooks: Hooks | None = None, make_env: Callable[..., Any] | None = None) -> int:
    """``01_a2c.py``: one process, or one rank of ``torchrun --nproc-per-node K 01_a2c.py ...``.
    ``hooks`` and ``make_env``: an experiment's (``lib.a2c.run.Hooks``; the vector env), which then
    runs as 01_a2c.py does, torchrun and Ctrl-C included."""
    cfg = parse_config(argv)
    try:
        from lib.a2c.distributed import init_dist
        from lib.a2c.train import train
        from lib.atari.saved_states import vec_env

        dist, dev = init_dist(cfg.dev)
        try:
            return train(replace(cfg, dev=dev), make_env=make_env or vec_env, dist=dist, hooks=hooks)
        finally:
            dist.close()
    except KeyboardInterrupt:  # before the loop took over Ctrl-C (loading torch, building the run)
        print("interrupted before training started: nothing was trained", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
