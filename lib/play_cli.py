"""``04_play.py``'s command line: the flags, grouped (core / output / speed), each taking its
default from ``PlayConfig``; and ``main``, which plays and prints. Imports no torch until it
runs: ``--help`` stays fast."""

from __future__ import annotations

import argparse

from lib.play_config import PlayConfig


def build_parser() -> argparse.ArgumentParser:
    """04_play.py's flags in groups (``--help``); every default comes from ``PlayConfig``."""
    d = PlayConfig
    p = argparse.ArgumentParser(
        prog="04_play.py",
        description="Play a saved policy for full games (all lives), print each game's score and "
        "length and their mean, std and max; optionally record MP4 videos with the reward model's view.",
    )
    g = p.add_argument_group("core")
    g.add_argument(
        "-m",
        "--model",
        required=True,
        help="policy checkpoint (.pt) saved by 01_a2c.py, or a run directory (saves/v0) for its best policy",
    )
    g.add_argument(
        "-e",
        "--env",
        default=d.env,
        help="env id; taken from the checkpoint when it has one (then -e must name the same game), "
        "else SeaquestNoFrameskip-v4",
    )
    g.add_argument("-n", "--episodes", type=int, default=d.episodes, help="games to play (default 1)")
    g.add_argument("--dev", default=d.dev, help="torch device for the policy and reward model: cpu or cuda")
    g.add_argument("--seed", type=int, default=d.seed, help="seed for the games and sampled actions")
    g.add_argument("--greedy", action="store_true", help="take the most likely action instead of sampling")
    g.add_argument(
        "--max-steps",
        type=int,
        default=d.max_steps,
        help="cut each game after this many agent steps (a quick look; default: play to game over, "
        "at most ALE's 108,000 frames = 27,000 steps)",
    )
    _add_play_output_args(p.add_argument_group("output: videos and the reward view"))
    g = p.add_argument_group("speed")
    g.add_argument(
        "--env-threads",
        type=int,
        default=d.env_threads,
        metavar="N",
        help="emulator threads (0: the cores this process may use; at most one per game)",
    )
    return p


def _add_play_output_args(g: argparse._ArgumentGroup) -> None:
    d = PlayConfig
    g.add_argument(
        "-r",
        "--record",
        metavar="VIDEO_DIR",
        default=d.record,
        help="record each game to VIDEO_DIR/<run>_<checkpoint>_epNN.mp4 (H.264, 15 fps = game speed)",
    )
    g.add_argument(
        "--reward",
        metavar="REWARD_MODEL",
        default=d.reward,
        help="reward model (.pt) from 03_reward_train.py: videos get a strip with its prediction normalised as "
        "fine-tuning sees it next to the true reward, and each game prints their correlation",
    )
    g.add_argument("--gif", action="store_true", help="also write an animated GIF next to each MP4 (needs -r)")


def main(argv: list[str] | None = None) -> int:
    """``04_play.py``: play, print one line per game and the summary."""
    cfg = PlayConfig(**vars(build_parser().parse_args(argv)))
    cfg.check()  # before torch and the emulator are imported

    from lib.play import play, summary

    results = play(cfg)
    print(summary(results, with_reward=cfg.reward is not None))
    return 0
