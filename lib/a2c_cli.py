"""``01_a2c.py``'s command line: the flags, grouped (core / policy / labels / output / speed), each
taking its default from ``A2CConfig``; and ``main``, which trains. Imports no torch until it
runs: ``--help`` stays fast."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from lib.a2c_config import (
    FINETUNE_LEARNING_RATE,
    LEARNING_RATE,
    LR_DECAY_STEPS,
    REWARD_NORMS,
    TERMINALS,
    A2CConfig,
)
from lib.errors import EXIT_INTERRUPTED


def build_parser() -> argparse.ArgumentParser:
    """01_a2c.py's flags in groups (``--help``); every default comes from ``A2CConfig``."""
    p = argparse.ArgumentParser(
        prog="01_a2c.py",
        description="Train an A2C agent on an Atari game. With --db-path it records random segments of "
        "its play for labeling; with -r it learns from a reward model instead of the game score.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _add_core_args(p.add_argument_group("core"))
    _add_policy_args(p.add_argument_group("policy: where it starts, how it learns"))
    _add_record_args(p.add_argument_group("labels: the reward it learns from, the segments it records"))
    _add_output_args(p.add_argument_group("output: checkpoints, evaluation, logs"))
    _add_speed_args(p.add_argument_group("speed"))
    return p


def _add_core_args(g: argparse._ArgumentGroup) -> None:
    d = A2CConfig  # the defaults live in one place
    g.add_argument("-n", "--name", required=True, help="run name: checkpoints go to saves/<name>, logs to runs/")
    g.add_argument("--env", default=d.env, help="ALE game, e.g. SeaquestNoFrameskip-v4 or BreakoutNoFrameskip-v4")
    g.add_argument("--dev", default=d.dev, help="torch device for the networks: cpu, cuda or cuda:N")
    g.add_argument(
        "--max-steps",
        type=int,
        default=d.max_steps,
        help="stop cleanly after this many agent steps, summed over all envs (0: run until Ctrl-C)",
    )
    g.add_argument("--seed", type=int, default=d.seed, help="random seed for envs, network init and recording")
    g.add_argument("--envs", type=int, default=d.envs, help="number of games played side by side")


def _add_policy_args(g: argparse._ArgumentGroup) -> None:
    d = A2CConfig
    g.add_argument(
        "-m",
        "--model",
        help="start from this saved policy (.pt) instead of from scratch; a run directory (saves/v0) means its best",
    )
    g.add_argument(
        "--finetune",
        action="store_true",
        help=f"freeze the conv layers of -m and train the heads with lr {FINETUNE_LEARNING_RATE}",
    )
    g.add_argument(
        "--lr",
        type=float,
        help=f"learning rate (default {LEARNING_RATE}, {FINETUNE_LEARNING_RATE} with --finetune); "
        "decays linearly to 0 over --lr-decay-steps",
    )
    g.add_argument(
        "--lr-decay-steps",
        type=int,
        default=d.lr_decay_steps,
        help=f"agent steps over which the lr decays to 0 (0: --max-steps if given, else {LR_DECAY_STEPS:,})",
    )
    g.add_argument(
        "--terminal",
        choices=TERMINALS,
        default=d.terminal,
        help="what ends the learner's episode (the game resets as always): life = every lost life (DeepMind's), "
        "game = a game over, none = nothing (the papers' one continuous episode under a learned reward: the "
        "n-step return bootstraps across a reset; the time limit stays a truncation)",
    )
    g.add_argument(
        "--kl",
        type=float,
        default=d.kl,
        metavar="B",
        help="add B * KL(pi || pi_start) to the loss, a pull toward the policy -m starts from "
        "(finetune/kl_to_start in TensorBoard is logged for every run from -m)",
    )
    g.add_argument("--gamma", type=float, default=d.gamma, help="discount of the n-step returns (the book's 0.99)")
    g.add_argument("--entropy", type=float, default=d.entropy, metavar="BETA", help="entropy bonus of the loss")
    g.add_argument("--n-steps", type=int, default=d.n_steps, help="rewards summed before bootstrapping")
    g.add_argument("--clip-grad", type=float, default=d.clip_grad, help="gradient-norm clip of each update")
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue the run <name> from saves/<name>/last.pt (optimizer, step counter, LR schedule)",
    )
    g.add_argument(
        "--force",
        action="store_true",
        help="start the run <name> over even though saves/<name> holds checkpoints (its best_*.pt and last.pt "
        "are removed first)",
    )


def _add_record_args(g: argparse._ArgumentGroup) -> None:
    d = A2CConfig
    g.add_argument(
        "-r",
        "--reward",
        help="learn from this reward model (.pt from 03_reward_train.py) instead of the game score",
    )
    g.add_argument(
        "--reward-penalty",
        type=float,
        default=d.reward_penalty,
        metavar="L",
        help="with an ensemble reward model (-r, --ensemble K): learn from mean - L * std of the members' "
        "normalised predictions, lower where they disagree (default 0: the mean)",
    )
    g.add_argument(
        "--reward-reload",
        action="store_true",
        help="live rounds: keep watching the -r file (a stat about once a second) and switch to each new version "
        "between two steps, without stopping (03_reward_train.py --follow installs them); its normalisation "
        "restarts from the new model's stored stats; a broken or wrong-game file is skipped with one warning; "
        "TensorBoard's reward_model/version names the version in use",
    )
    g.add_argument(
        "--reward-scale",
        type=float,
        default=d.reward_scale,
        metavar="S",
        help="-r: the std of the learned reward the learner gets (the papers: 0.05, near the clipped score's 0.11)",
    )
    g.add_argument(
        "--reward-norm",
        choices=REWARD_NORMS,
        default=d.reward_norm,
        help="-r: where the reward's centre and std come from: running = the agent's own last 10,000 predictions "
        "(median-centred), labels = fixed, the mean and std over the labelled clips stored in the checkpoint "
        "(each version's own under --reward-reload)",
    )
    g.add_argument(
        "--reward-oracle",
        action="store_true",
        help="-r: learn from the game's true per-step score sent through the learned reward's path (its "
        "--reward-norm, --reward-scale, clip and --terminal) instead of the model's prediction; with "
        "--reward-norm labels the score's statistics over the same labelled clips, stored in -r's checkpoint "
        "(experiments.round --oracle-arm: what the path costs apart from the model's errors)",
    )
    g.add_argument("--db-path", help="record segments into this DB directory (recording is off without it)")
    g.add_argument(
        "--record-prob",
        type=float,
        default=d.record_prob,
        help="per agent step and env, probability to start recording a segment "
        "(default gives ~2,500 segments over 10M steps)",
    )
    g.add_argument("--segment-steps", type=int, default=d.segment_steps, help="agent steps per recorded segment")


def _add_output_args(g: argparse._ArgumentGroup) -> None:
    d = A2CConfig
    g.add_argument("--save", help="checkpoint directory (default: saves/<name>)")
    g.add_argument(
        "--test-every", type=int, default=d.test_every, help="evaluate every this many agent steps (0: never)"
    )
    g.add_argument(
        "--test-episodes",
        type=int,
        default=d.test_episodes,
        help="full games (all lives) per evaluation, played side by side",
    )
    g.add_argument("--runs-dir", default=d.runs_dir, help="TensorBoard log root")


def _add_speed_args(g: argparse._ArgumentGroup) -> None:
    d = A2CConfig
    g.add_argument(
        "--bf16",
        action="store_true",
        help="run the networks' forward passes in bfloat16 autocast (weights and loss stay float32): "
        "~2x faster learner on CPUs with AVX512-BF16/AMX and on GPUs; emulated (slow) on other CPUs",
    )
    g.add_argument("--threads", type=int, default=d.threads, help="torch CPU threads (0: one per core)")
    g.add_argument(
        "--env-threads",
        type=int,
        default=d.env_threads,
        metavar="N",
        help="emulator threads of every vector env (training and evaluation; 0: the cores this process may "
        "use, divided among the ranks of a torchrun on this machine)",
    )


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
