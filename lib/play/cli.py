"""``04_play.py``'s command line: the flags, grouped (core / output / speed), built from
``PlayConfig``'s fields (each declares its flag, default, help and checks once); and ``main``,
which plays and prints. Imports no torch until it runs: ``--help`` stays fast."""

from __future__ import annotations

import argparse

from lib.core import settings
from lib.play.config import PlayConfig

GROUPS = {"core": "core", "output": "output: videos and the reward view", "speed": "speed"}  # --help's, in order


def build_parser() -> argparse.ArgumentParser:
    """04_play.py's flags in groups (``--help``), one per ``PlayConfig`` field."""
    return settings.build_parser(
        PlayConfig,
        "04_play.py",
        "Play a saved policy for full games (all lives), print each game's score and "
        "length and their mean, std and max; optionally record MP4 videos with the reward model's view.",
        GROUPS,
    )


def main(argv: list[str] | None = None) -> int:
    """``04_play.py``: play, print one line per game and the summary."""
    cfg = PlayConfig(**vars(build_parser().parse_args(argv)))
    cfg.check()  # before torch and the emulator are imported

    from lib.play.play import play, summary

    results = play(cfg)
    print(summary(results, with_reward=cfg.reward is not None))
    return 0
