"""``01_a2c.py``'s command line: the flags, grouped (core / policy / labels / output / speed), built
from ``A2CConfig``'s fields (each declares its flag, default, help and checks once); and ``main``,
which trains. Imports no torch until it runs: ``--help`` stays fast."""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, fields, replace

from lib.a2c_config import A2CConfig
from lib.cli_help import DefaultsOnceFormatter
from lib.errors import EXIT_INTERRUPTED

GROUPS = {  # --help's groups, in order, and their titles
    "core": "core",
    "policy": "policy: where it starts, how it learns",
    "labels": "labels: the reward it learns from, the segments it records",
    "output": "output: checkpoints, evaluation, logs",
    "speed": "speed",
}


def build_parser() -> argparse.ArgumentParser:
    """01_a2c.py's flags in groups (``--help``), one per ``A2CConfig`` field: its flags, default,
    help and type come from the field's ``setting``."""
    p = argparse.ArgumentParser(
        prog="01_a2c.py",
        description="Train an A2C agent on an Atari game. With --db-path it records random segments of "
        "its play for labeling; with -r it learns from a reward model instead of the game score.",
        formatter_class=DefaultsOnceFormatter,
    )
    groups = {key: p.add_argument_group(title) for key, title in GROUPS.items()}
    for f in fields(A2CConfig):
        meta = f.metadata
        flags = meta["flags"] or ("--" + f.name.replace("_", "-"),)
        kw = {"dest": f.name, "help": meta["help"], **meta["arg"]}
        if f.default is MISSING:
            kw["required"] = True
        elif isinstance(f.default, bool):
            kw["action"] = "store_true"
        else:
            kw["default"] = f.default
            if f.default is not None and "type" not in kw and not isinstance(f.default, str):
                kw["type"] = type(f.default)
        groups[meta["group"]].add_argument(*flags, **kw)
    return p


def parse_config(argv: list[str] | None = None) -> A2CConfig:
    """The command line as a checked ``A2CConfig``; ``-m`` a run directory stands for its best policy."""
    cfg = A2CConfig(**vars(build_parser().parse_args(argv)))
    if cfg.model:
        from lib.model import policy_file

        cfg = replace(cfg, model=str(policy_file(cfg.model)))
    cfg.check()
    return cfg


def main(argv: list[str] | None = None) -> int:
    """``01_a2c.py``: one process, or one rank of ``torchrun --nproc-per-node K 01_a2c.py ...``."""
    cfg = parse_config(argv)
    try:
        from lib.a2c import train
        from lib.distributed import init_dist

        dist, dev = init_dist(cfg.dev)
        try:
            return train(replace(cfg, dev=dev), dist=dist)
        finally:
            dist.close()
    except KeyboardInterrupt:  # before the loop took over Ctrl-C (loading torch, building the run)
        print("interrupted before training started: nothing was trained", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED


def to_argv(cfg: A2CConfig) -> list[str]:
    """``cfg`` as ``01_a2c.py``'s documented flags (the long names), for a caller that runs the
    stage as a process (``experiments/round.py``): ``parse_config(to_argv(cfg)) == cfg``. Only what
    differs from the defaults is written, so the command reads as a person would type it."""
    argv: list[str] = []
    for action in build_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(cfg, action.dest)
        if value == action.default and not action.required:
            continue
        flag = max(action.option_strings, key=len)
        argv += [flag] if isinstance(action, argparse._StoreTrueAction) else [flag, str(value)]
    return argv
