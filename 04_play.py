#!/usr/bin/env python3
"""Play a saved policy for full games, print the scores, record gameplay videos.

Examples:
    04_play.py -m saves/v0/best_0420.pt -n 10                     # scores of 10 games
    04_play.py -m saves/v1/last.pt -r videos/v1                   # one MP4 per game
    04_play.py -m saves/v1/last.pt -r videos/v1 --reward saves/reward/reward.pt --gif
"""

from __future__ import annotations

import argparse

from lib.errors import run_cli
from lib.play import play, summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Play a saved policy for full games (all lives), print each game's score and "
        "length and their mean, std and max; optionally record MP4 videos with the reward model's view.",
    )
    p.add_argument(
        "-m",
        "--model",
        required=True,
        help="policy checkpoint (.pt) saved by 01_a2c.py, or a run directory (saves/v0) for its best policy",
    )
    p.add_argument(
        "-e",
        "--env",
        default=None,
        help="env id; taken from the checkpoint when it has one (then -e must name the same game), "
        "else SeaquestNoFrameskip-v4",
    )
    p.add_argument(
        "-r",
        "--record",
        metavar="VIDEO_DIR",
        default=None,
        help="record each game to VIDEO_DIR/<run>_<checkpoint>_epNN.mp4 (H.264, 15 fps = game speed)",
    )
    p.add_argument("-n", "--episodes", type=int, default=1, help="games to play (default 1)")
    p.add_argument(
        "--reward",
        metavar="REWARD_MODEL",
        default=None,
        help="reward model (.pt) from 03_reward_train.py: videos get a strip with its normalised "
        "prediction next to the true reward, and each game prints their correlation",
    )
    p.add_argument("--dev", default="cpu", help="torch device for the policy and reward model: cpu or cuda")
    p.add_argument("--seed", type=int, default=None, help="seed for the games and sampled actions")
    p.add_argument("--greedy", action="store_true", help="take the most likely action instead of sampling")
    p.add_argument("--gif", action="store_true", help="also write an animated GIF next to each MP4 (needs -r)")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="cut each game after this many agent steps (a quick look; default: play to game over, "
        "at most ALE's 108,000 frames = 27,000 steps)",
    )
    p.add_argument(
        "--env-threads",
        type=int,
        default=0,
        metavar="N",
        help="emulator threads (0: the cores this process may use; at most one per game)",
    )
    return p.parse_args(argv)


def main() -> int:
    args = parse_args()
    results = play(
        args.model,
        env=args.env,
        episodes=args.episodes,
        video_dir=args.record,
        reward=args.reward,
        device=args.dev,
        seed=args.seed,
        greedy=args.greedy,
        gif=args.gif,
        max_steps=args.max_steps,
        env_threads=args.env_threads,
    )
    print(summary(results, with_reward=args.reward is not None))
    return 0


if __name__ == "__main__":
    run_cli(main)
