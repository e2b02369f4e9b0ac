"""``03_reward_train.py``'s command line, built from ``RewardArgs``'s fields, and ``main``: train a
reward model, retrain it as labels arrive (``--follow``), or score one (``--evaluate``). Imports no
torch until it runs, so ``--help`` stays fast."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from lib.core import settings
from lib.core.errors import EXIT_INTERRUPTED, UserError
from lib.models.teachers import DEFAULT_TEACHER, GAUGE_TEACHERS, Teacher, death_penalty_for
from lib.reward.config import FollowConfig, RewardArgs, TrainConfig

GROUPS = {  # --help's groups, in order, with their descriptions
    "core": ("core", "what to do, where, and the optimiser"),
    "follow": (
        "follow",
        "keep running and retrain as labels arrive (live rounds: label while the agent trains, the agent "
        "picks up each new model with 01_a2c.py -r OUTDIR/reward-NAME.pt --reward-reload)",
    ),
    "model": ("model", "the reward network (--arch diff, the default) and its ensemble"),
    "labels": ("labels", "the segment DBs and how their answers are read"),
    "output": ("output", "where the model and the logs go"),
    "baselines": ("baselines", "the book's network and the paper's score masking, to compare with"),
}

RETIRED = {  # flags the measurements closed: given, one line that says why and where the figures are
    "--diff-signed": "was retired after commit a8a38db: the signed change per block did not make a climbing "
    "low-gauge diver step pay more than a still one (-0.07 and -0.21 std on seeds 0 and 1; -0.24 and +0.11 "
    "without it, docs/results.md)",
}


def build_parser() -> argparse.ArgumentParser:
    """03_reward_train.py's flags in groups (``--help``), one per ``RewardArgs`` field; the retired ones refused."""
    return settings.retire(
        settings.build_parser(
            RewardArgs,
            "03_reward_train.py",
            "Train the reward model (Bradley-Terry on preference labels) on one or more segment DBs.",
            GROUPS,
        ),
        RETIRED,
    )


def config_from_args(args: RewardArgs | argparse.Namespace, device: str) -> TrainConfig:
    """The TrainConfig of parsed flags: every field of the flag of the same name, ``device`` the
    resolved ``--dev``."""
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    return TrainConfig(**given, device=device)


def evaluate_teacher(args: RewardArgs) -> tuple[str, float]:
    """--evaluate's teacher and death penalty (the teacher's own where not given); UserError for a
    penalty the teacher does not take."""
    teacher = args.teacher or DEFAULT_TEACHER
    try:
        return teacher, death_penalty_for(teacher, args.death_penalty)
    except ValueError as e:
        raise UserError(str(e)) from None


def evaluate(args: RewardArgs, teacher: str, penalty: float) -> int:
    """``--evaluate MODEL DB...``: one line of figures per DB and a total, against the score and
    against ``teacher`` at death penalty ``penalty`` (``evaluate_teacher``)."""
    from lib.atari.seaquest import OXYGEN_GAMES
    from lib.models.policy import resolve_device
    from lib.models.reward import load_reward_model
    from lib.reward.eval import evaluate_model
    from lib.store.segments import check_same_game

    device = resolve_device(args.dev)
    for db in args.dbs:
        if not Path(db).is_dir():
            raise UserError(f"DB not found: {db}")
    game = check_same_game(args.dbs, "--evaluate got")
    if teacher in GAUGE_TEACHERS and game not in OXYGEN_GAMES:
        raise UserError(
            f"the {teacher} teacher reads SeaQuest's oxygen gauge; the DBs hold {game or 'an unknown game'}"
        )
    rm = load_reward_model(args.evaluate, game=game, device=device)
    print(f"scoring {args.evaluate} on {len(args.dbs)} DB(s), device {device}")
    evaluate_model(rm, args.dbs, Teacher(teacher, death_penalty=penalty))
    return 0


def tb_writer(args: RewardArgs, game: str) -> Any:
    """The run's TensorBoard writer (``lib/core/tb.py``'s run directory) with the flags as its
    hyper-parameter table; UserError with one line when --runs-dir cannot be written."""
    from torch.utils.tensorboard import SummaryWriter

    from lib.core.tb import hparams_table, run_dir

    log_dir = run_dir(args.runs_dir, args.name, "reward", game, args.seed)
    try:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        writer = SummaryWriter(log_dir=str(log_dir))
    except OSError as e:
        raise UserError(
            f"cannot write TensorBoard logs to {log_dir}: {e.strerror or e} (pass another --runs-dir)"
        ) from None
    writer.add_text("hyperparameters", hparams_table({**vars(args), "dbs": " ".join(args.dbs)}))
    return writer


def follow(args: RewardArgs, fcfg: FollowConfig) -> int:
    """``--follow``: retrain as labels arrive until Ctrl-C / SIGTERM (exit 130, or 2 on a mistake)."""
    from lib.atari.envs import DEFAULT_ENV, rom_name
    from lib.models.policy import resolve_device
    from lib.reward.follow import Follower
    from lib.reward.train import _output_paths
    from lib.store.segments import check_same_game

    device = resolve_device(args.dev)
    cfg = config_from_args(args, str(device))
    cfg.check()  # every flag in range before the DBs are read (--retrain-every, --poll: RewardArgs.check)
    for db in args.dbs:
        if not Path(db).is_dir():
            raise UserError(f"DB not found: {db}")
    game = check_same_game(args.dbs, "--follow got") or rom_name(args.env or DEFAULT_ENV)
    out_dir = _output_paths(Path(args.out) / f"reward-{args.name}.pt")[0].parent
    writer = tb_writer(args, game)
    try:
        follower = Follower(args.dbs, cfg, fcfg, out_dir, args.name, args.env, writer, not args.no_progress, _say)
        return follower.run()
    finally:
        writer.close()


def _say(line: str) -> None:
    print(line, flush=True)  # a follower runs for hours, its output often goes to a log file


def train_once(args: RewardArgs) -> int:
    """Train once on the DBs' labels; the best model goes to OUTDIR/reward-NAME.pt, logs to
    --runs-dir. Exit 130 when stopped by Ctrl-C: the model is installed, but marked as not finished."""
    from lib.models.policy import resolve_device
    from lib.reward.data import load_preferences
    from lib.reward.train import summary_lines, train_reward_model

    device = resolve_device(args.dev)  # fail on --dev cuda without a GPU before reading the DBs
    cfg = config_from_args(args, str(device))
    cfg.check()  # every flag in range before the DBs are read
    data = load_preferences(args.dbs, env=args.env)
    writer = tb_writer(args, data.game)
    try:
        res = train_reward_model(
            data, cfg, Path(args.out) / f"reward-{args.name}.pt", writer=writer, progress=not args.no_progress
        )
    finally:
        writer.close()
    print("\n".join(summary_lines(res)))
    print(f"next: 01_a2c.py -r {res.path} (with -m <policy> --finetune to fine-tune a policy on it)")
    return 0 if res.finished else EXIT_INTERRUPTED


def main(argv: list[str] | None = None) -> int:
    """``03_reward_train.py``: check the flags, then score (--evaluate), follow or train."""
    parser = build_parser()
    args = RewardArgs(**vars(parser.parse_args(argv)))
    args.check()
    teacher, penalty = evaluate_teacher(args)
    if args.evaluate:
        return evaluate(args, teacher, penalty)
    if not args.name or not args.out:
        parser.error("training needs -n NAME and -o OUTDIR (or give --evaluate MODEL to score a model)")
    return follow(args, args.follow_config()) if args.follow else train_once(args)
