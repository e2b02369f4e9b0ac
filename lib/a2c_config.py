"""Stage 1's settings: the book's hyper-parameters, the bounds a run checks, and ``A2CConfig``,
the one place ``01_a2c.py``'s flags take their defaults from (``lib/a2c_cli.py``), with its checks.
Imports no torch, so that ``--help`` stays fast."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lib.envs import DEFAULT_ENV
from lib.errors import UserError
from lib.recorder import DEFAULT_RECORD_PROB, DEFAULT_SEGMENT_STEPS, MAX_SEGMENT_STEPS
from lib.seeds import MAX_SEED
from lib.segments import MAX_ENV_INDEX

# The book's hyper-parameters (Lapan, ch. 19 / ch. 12).
GAMMA = 0.99
LEARNING_RATE = 7e-4
FINETUNE_LEARNING_RATE = 7e-5
ENTROPY_BETA = 0.01
BATCH_SIZE = 128
REWARD_STEPS = 5
CLIP_GRAD = 0.1
ADAM_EPS = 1e-5
LR_DECAY_STEPS = 10_000_000
MAX_STEP_COUNT = 10**13  # agent steps a flag or a last.pt may name (a 10M-step run is 10**7)
TERMINALS = ("life", "game", "none")  # --terminal: what ends the learner's episode
REWARD_NORMS = ("running", "labels")  # --reward-norm: where the learned reward's statistics come from
MAX_RECORD_ENVS = MAX_ENV_INDEX + 1  # segment DB env directories are two digits (NN/SSSSSSSS.dat)


@dataclass(frozen=True)
class A2CConfig:
    """Everything a run is told (the command line's flags, checked). Defaults are the CLI's."""

    name: str
    env: str = DEFAULT_ENV
    dev: str = "cpu"
    model: str | None = None
    finetune: bool = False
    reward: str | None = None
    reward_penalty: float = 0.0
    reward_reload: bool = False
    reward_scale: float = 1.0
    reward_norm: str = "running"
    reward_oracle: bool = False
    terminal: str = "life"
    kl: float = 0.0
    gamma: float = GAMMA
    entropy: float = ENTROPY_BETA
    n_steps: int = REWARD_STEPS
    clip_grad: float = CLIP_GRAD
    save: str | None = None
    db_path: str | None = None
    envs: int = 16
    max_steps: int = 0
    seed: int = 0
    record_prob: float = DEFAULT_RECORD_PROB
    segment_steps: int = DEFAULT_SEGMENT_STEPS
    test_every: int = 100_000
    test_episodes: int = 10
    force: bool = False
    resume: bool = False
    lr: float | None = None
    lr_decay_steps: int = 0
    runs_dir: str = "runs"
    bf16: bool = False
    threads: int = 0
    env_threads: int = 0

    @property
    def save_dir(self) -> Path:
        return Path(self.save or Path("saves") / self.name)

    def check(self) -> None:
        """UserError with one line for every flag value that cannot work."""
        wrong = [
            (self.envs < 1, f"--envs must be at least 1, got {self.envs}"),
            (not 0.0 <= self.record_prob <= 1.0, f"--record-prob must be in [0, 1], got {self.record_prob}"),
            (not 1 <= self.segment_steps <= MAX_SEGMENT_STEPS, f"--segment-steps must be in 1..{MAX_SEGMENT_STEPS}"),
            (self.envs > 4096, f"--envs must be at most 4096, got {self.envs}"),
            (self.max_steps > MAX_STEP_COUNT, f"--max-steps must be at most 1e13, got {self.max_steps}"),
            (self.max_steps < 0, f"--max-steps must be >= 0, got {self.max_steps}"),
            (self.test_every < 0, f"--test-every must be >= 0, got {self.test_every}"),
            (self.test_episodes < 1, f"--test-episodes must be at least 1, got {self.test_episodes}"),
            (self.lr is not None and not 0 < self.lr < 1, f"--lr must be a number in (0, 1), got {self.lr}"),
            (not 0 <= self.seed <= MAX_SEED, f"--seed must be in 0..{MAX_SEED}, got {self.seed}"),
            (self.threads < 0, f"--threads must be >= 0, got {self.threads}"),
            (self.env_threads < 0, f"--env-threads must be >= 0, got {self.env_threads}"),
            (self.lr_decay_steps < 0, f"--lr-decay-steps must be >= 0, got {self.lr_decay_steps}"),
            (self.finetune and not (self.model or self.resume), "--finetune needs a policy: give -m MODEL"),
            (not 0 <= self.reward_penalty < math.inf, f"--reward-penalty must be >= 0, got {self.reward_penalty}"),
            (self.reward_penalty > 0 and not self.reward, "--reward-penalty needs a reward model: give -r MODEL"),
            (self.reward_reload and not self.reward, "--reward-reload watches the reward model: give -r MODEL"),
            (self.terminal not in TERMINALS, f"--terminal must be life, game or none, got {self.terminal!r}"),
            (not 0 < self.reward_scale < 1e6, f"--reward-scale must be in (0, 1e6), got {self.reward_scale}"),
            (self.reward_norm not in REWARD_NORMS, f"--reward-norm is running or labels, not {self.reward_norm!r}"),
            (self.reward_oracle and not self.reward, "--reward-oracle takes its stats from a reward model: give -r"),
            (self.reward_oracle and self.reward_penalty > 0, "--reward-oracle has no ensemble: drop --reward-penalty"),
            (not 0 <= self.kl < 1e6, f"--kl must be a number in [0, 1e6), got {self.kl}"),
            (not 0 < self.gamma <= 1, f"--gamma must be in (0, 1], got {self.gamma}"),
            (not 0 <= self.entropy < 1e3, f"--entropy must be in [0, 1000), got {self.entropy}"),
            (not 1 <= self.n_steps <= 1000, f"--n-steps must be in 1..1000, got {self.n_steps}"),
            (not 0 < self.clip_grad < 1e9, f"--clip-grad must be a positive number, got {self.clip_grad}"),
            (self.kl > 0 and not (self.model or self.resume), "--kl pulls toward the policy -m starts from: give -m"),
            (self.resume and self.force, "--resume continues the run, --force starts it over: give one of them"),
            (self.resume and bool(self.model), "--resume continues saves/<name>/last.pt; do not also give -m"),
            (not self.name or "/" in self.name or self.name in (".", ".."), f"--name must be plain, got {self.name!r}"),
        ]  # fmt: skip
        for bad, message in wrong:
            if bad:
                raise UserError(message)
