"""Stage 4's settings: ``PlayConfig``, the one place ``04_play.py``'s flags take their defaults
from (``lib/play_cli.py``), and its checks. Imports no torch, so that ``--help`` stays fast."""

from __future__ import annotations

from dataclasses import dataclass

from lib.errors import UserError
from lib.seeds import check_seed


@dataclass(frozen=True)
class PlayConfig:
    """What to play and how. Each field is the flag of the same name (``record`` is ``-r``,
    ``episodes`` is ``-n``); ``lib.play.play`` takes one."""

    model: str = ""  # a policy checkpoint, or a run directory for its best policy
    env: str | None = None  # None: the checkpoint's own env id
    episodes: int = 1
    record: str | None = None  # the video directory
    reward: str | None = None  # a reward model for the strip under the game
    dev: str = "cpu"
    seed: int | None = None
    greedy: bool = False
    gif: bool = False
    max_steps: int | None = None  # None: play to game over
    env_threads: int = 0  # 0: the cores this process may use

    def check(self) -> None:
        """UserError with one line for a value that cannot work; files are checked when read."""
        if self.episodes < 1:
            raise UserError(f"-n must be at least 1, got {self.episodes}")
        if self.max_steps is not None and self.max_steps < 1:
            raise UserError(f"--max-steps must be at least 1, got {self.max_steps}")
        if self.gif and self.record is None:
            raise UserError("--gif needs -r VIDEO_DIR")
        if self.seed is not None:
            check_seed(self.seed)
        if self.env_threads < 0:
            raise UserError(f"--env-threads must be >= 0, got {self.env_threads}")
