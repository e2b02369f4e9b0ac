"""Stage 4's settings: ``PlayConfig``, the one place ``04_play.py``'s flags are declared (default,
help, group, checks; the parser is built from it in ``lib/play/cli.py``). Imports no torch, so
that ``--help`` stays fast."""

from __future__ import annotations

from dataclasses import dataclass

from lib.core.settings import SEED_CHECKS, at_least, check_between, check_fields, setting


@dataclass(frozen=True)
class PlayConfig:
    """What to play and how: each field is one flag of ``04_play.py`` (``setting``), in ``--help``
    order; ``lib.play.play.play`` takes one and runs ``check`` first."""

    # core
    model: str = setting(
        help="policy checkpoint (.pt) saved by 01_a2c.py, or a run directory (saves/v0) for its best policy",
        group="core",
        flags=("-m", "--model"),
    )
    env: str | None = setting(
        None,
        "env id; taken from the checkpoint when it has one (then -e must name the same game), "
        "else SeaquestNoFrameskip-v4",
        group="core",
        flags=("-e", "--env"),
    )
    episodes: int = setting(
        1,
        "games to play (default 1)",
        group="core",
        flags=("-n", "--episodes"),
        checks=[(lambda v: v >= 1, "-n must be at least 1, got {v}")],
    )
    dev: str = setting("cpu", "torch device for the policy and reward model: cpu or cuda", group="core")
    seed: int | None = setting(
        None,
        "seed for the games and sampled actions",
        group="core",
        type=int,
        checks=SEED_CHECKS,
    )
    greedy: bool = setting(False, "take the most likely action instead of sampling", group="core")
    max_steps: int | None = setting(
        None,
        "cut each game after this many agent steps (a quick look; default: play to game over, "
        "at most ALE's 108,000 frames = 27,000 steps)",
        group="core",
        type=int,
        checks=[(lambda v: v is None or v >= 1, "--max-steps must be at least 1, got {v}")],
    )
    # output: videos and the reward view
    record: str | None = setting(
        None,
        "record each game to VIDEO_DIR/<run>_<checkpoint>_epNN.mp4 (H.264, 15 fps = game speed)",
        group="output",
        flags=("-r", "--record"),
        metavar="VIDEO_DIR",
    )
    reward: str | None = setting(
        None,
        "reward model (.pt) from 03_reward_train.py: videos get a strip with its prediction normalised as "
        "fine-tuning sees it next to the true reward, and each game prints their correlation",
        group="output",
        metavar="REWARD_MODEL",
    )
    gif: bool = setting(False, "also write an animated GIF next to each MP4 (needs -r)", group="output")
    # speed
    env_threads: int = setting(
        0,
        "emulator threads (0: the cores this process may use; at most one per game)",
        group="speed",
        metavar="N",
        checks=at_least("--env-threads"),
    )

    def check(self) -> None:
        """UserError with one line for a value that cannot work: each flag's own checks in ``--help``
        order, then the one between flags; files are checked when read."""
        check_fields(self)
        check_between([(self.gif and self.record is None, "--gif needs -r VIDEO_DIR")])
