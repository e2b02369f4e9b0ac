"""``03_reward_train.py``'s command line: the flags, grouped (core / follow / model / labels /
output / baselines), each taking its default from ``TrainConfig`` or ``FollowConfig``; and ``main``,
which trains a reward model, with ``--follow`` retrains it as labels arrive (``lib/reward_follow.py``),
or with ``--evaluate`` scores one. Imports no torch until it runs: ``--help`` stays fast."""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path
from typing import Any

from lib.cli_help import DefaultsOnceFormatter
from lib.errors import EXIT_INTERRUPTED, UserError
from lib.reward_config import ARCHS, INPUTS, FollowConfig, TrainConfig
from lib.teachers import (
    DEFAULT_DEATH_PENALTY,
    DEFAULT_TEACHER,
    GAUGE_TEACHERS,
    TEACHERS,
    Teacher,
    death_penalty_for,
    teacher_help,
)

D = TrainConfig  # the defaults live in one place
FD = FollowConfig


def block_arg(text: str) -> tuple[int, int]:
    """--diff-block ROWSxCOLS -> (rows, cols); whether they divide 84 is checked with the rest."""
    rows, sep, cols = text.lower().partition("x")
    if not sep or not rows.strip().isdigit() or not cols.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 4x12, got {text!r}")
    return int(rows), int(cols)


def _core_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("core", "what to do, where, and the optimiser")
    g.add_argument(
        "--evaluate",
        metavar="MODEL",
        help="train nothing: score this reward model on the DBs' segments with true rewards (oracle agreement "
        "over all pairs whose true returns differ, return and per-step correlation, and the agreement with "
        "--teacher's own answers over all pairs it prefers one of, per deciding rule too), one line per DB "
        "and a total",
    )
    g.add_argument(
        "--teacher",
        choices=TEACHERS,
        default=argparse.SUPPRESS,  # given or not: it applies to --evaluate only
        help=f"--evaluate: whose rule the model is scored against beside the bare score (default "
        f"{DEFAULT_TEACHER}): " + teacher_help(),
    )
    g.add_argument(
        "--death-penalty",
        type=float,
        default=argparse.SUPPRESS,
        metavar="P",
        help=f"--evaluate with the score teacher: each life lost in a clip costs P points of its sum, as "
        f"02_label_ui.py --oracle labels (default {DEFAULT_DEATH_PENALTY:g}; 0: the bare score's order)",
    )
    g.add_argument("--dev", default=D.device, help="torch device to train on: cpu or cuda")
    g.add_argument("--epochs", type=int, default=D.epochs, help="maximum epochs (early stopping usually ends sooner)")
    g.add_argument("--batch", type=int, default=D.batch, help="labeled pairs per optimiser step (the book: 64)")
    g.add_argument("--lr", type=float, default=D.lr, help="Adam learning rate (the book: 1e-4)")
    g.add_argument("--seed", type=int, default=D.seed, help="seed of the train/test split, shuffling and weights")
    g.add_argument(
        "--test-ratio",
        type=float,
        default=D.test_ratio,
        help="share of the labels held out for testing (--follow: about this share, chosen by a hash of the pair "
        "and --seed, so that a label held out for one version stays held out)",
    )
    g.add_argument(
        "--patience",
        type=int,
        default=D.patience,
        help="stop after this many epochs without a better test loss (default: 20 for --arch diff, "
        "whose epochs are cheap; the book's 4 for --arch book)",
    )
    g.add_argument(
        "--micro-frames",
        type=int,
        default=D.micro_frames,
        help="steps per forward/backward pass (gradients accumulate up to --batch): bounds memory",
    )


def _follow_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "follow",
        "keep running and retrain as labels arrive (live rounds: label while the agent trains, the agent "
        "picks up each new model with 01_a2c.py -r OUTDIR/reward-NAME.pt --reward-reload)",
    )
    g.add_argument(
        "--follow",
        action="store_true",
        help="stay running: train a new version whenever --retrain-every new labels have arrived in the DBs' "
        "labels.jsonl (a new pair's answer or an edited one; can't-tell and retracted lines do not count), "
        "starting from the installed model's weights; keep each as OUTDIR/reward-NAME-vK.pt, log it in "
        "OUTDIR/reward-NAME-versions.jsonl, and install it as OUTDIR/reward-NAME.pt only when its held-out "
        "loss is not higher than the installed model's on the same held-out labels (held out by a hash of "
        "the pair: a label held out once stays held out). The first version installs when there is no "
        "model. Ctrl-C or SIGTERM stops it (a training in progress is dropped; exit code 130)",
    )
    g.add_argument(
        "--retrain-every",
        type=int,
        default=argparse.SUPPRESS,  # given or not: it applies to --follow only
        metavar="K",
        help=f"--follow: new labels between two versions (default: {FD.retrain_every})",
    )
    g.add_argument(
        "--poll",
        type=float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help=f"--follow: how often to look at the label files (default: {FD.poll:g})",
    )


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model", "the reward network (--arch diff, the default) and its ensemble")
    rows, cols = D.diff_block
    g.add_argument(
        "--diff-block",
        type=block_arg,
        default=D.diff_block,
        metavar="ROWSxCOLS",
        help=f"--arch diff: the block its frame and change are averaged over, each a divisor of 84 "
        f"(default {rows}x{cols}); finer rows keep apart what sits in different rows of the screen "
        f"(in SeaQuest the score, rows 3-6, and the reserve subs, rows 8-11)",
    )
    g.add_argument(
        "--diff-signed",
        action="store_true",
        help="--arch diff: also average the signed change (next frame - frame) over each block, which "
        "says which way a thing moved (in SeaQuest: the sub climbing or diving); the absolute change "
        "alone is the same set of pixels either way",
    )
    g.add_argument(
        "--diff-flow",
        action="store_true",
        help="--arch diff: also the scene's vertical and horizontal shift between the frame and the next "
        "(least squares over the whole frame), two features that say 'moved up' wherever it happens, where "
        "the block means must learn each place from labels (in SeaQuest: the sub climbing)",
    )
    g.add_argument(
        "--ensemble",
        type=int,
        default=D.ensemble,
        metavar="K",
        help="train K models on bootstrap samples; predict their mean, log their disagreement",
    )


def _label_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("labels", "the segment DBs and how their answers are read")
    g.add_argument("dbs", nargs="+", metavar="DB", help="segment DB directories with labels (labels.jsonl)")
    g.add_argument(
        "--noise",
        action="store_true",
        help="assume 10%% of the answers are random (p' = 0.9 p + 0.05), as in the paper",
    )
    g.add_argument(
        "--env", default=None, help="game of legacy DBs whose segments don't name one (default SeaquestNoFrameskip-v4)"
    )


def _output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output", "where the model and the logs go")
    g.add_argument("-n", "--name", help="name of the run: the model is OUTDIR/reward-NAME.pt (needed to train)")
    g.add_argument("-o", "--out", metavar="OUTDIR", help="directory for the model (needed to train)")
    g.add_argument("--runs-dir", default="runs", help="TensorBoard log directory")
    g.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (logs only); it is off anyway when stderr is not a terminal",
    )


def _baseline_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("baselines", "the book's network and the paper's score masking, to compare with")
    g.add_argument(
        "--arch",
        choices=ARCHS,
        default=D.arch,
        help="network: diff = grey 84x84 frame and its change to the frame the step led to (sees where "
        "points are scored); book = the book's net on the colour frame the action is chosen on",
    )
    g.add_argument(
        "--mask-rows",
        type=int,
        default=D.mask_rows,
        metavar="N",
        help="--arch diff: blank the top N rows of its 84x84 input, as the paper masks the score "
        "(10 covers SeaQuest's score): the model must then learn from the scene",
    )
    g.add_argument(
        "--input",
        choices=tuple(INPUTS),
        default=next(k for k, v in INPUTS.items() if v == D.downscale),
        help="--arch book's input: full = 210x160 colour frames; half = 105x80 (2x2 average), ~4x cheaper",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Train the reward model (Bradley-Terry on preference labels) on one or more segment DBs.",
        formatter_class=DefaultsOnceFormatter,
    )
    for add in (_core_args, _follow_args, _model_args, _label_args, _output_args, _baseline_args):
        add(p)
    return p


def config_from_args(args: argparse.Namespace, device: str) -> TrainConfig:
    """The TrainConfig of parsed flags: every field of the flag of the same name, ``downscale`` from
    ``--input`` and ``device`` the resolved ``--dev``."""
    given = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if hasattr(args, f.name)}
    return TrainConfig(**given, downscale=INPUTS[args.input], device=device)


def follow_config_from_args(args: argparse.Namespace) -> FollowConfig:
    """The FollowConfig of parsed flags (their defaults where not given); UserError for --retrain-every
    or --poll without --follow, and for --follow with --evaluate."""
    given = {k: getattr(args, k) for k in ("retrain_every", "poll") if hasattr(args, k)}
    if args.follow and args.evaluate:
        raise UserError("--follow trains and --evaluate only scores a model: give one of them")
    if given and not args.follow:
        raise UserError(f"--{next(iter(given)).replace('_', '-')} applies to --follow only")
    return FollowConfig(**given)


def check_name(name: str) -> None:
    """``-n`` names a file in OUTDIR: a plain name only."""
    if "/" in name or "\0" in name or name.startswith(".") or len(name) > 100:
        raise UserError(f"-n must be a plain name (no '/', no leading '.', at most 100 characters), got {name!r}")


def evaluate_teacher(args: argparse.Namespace) -> tuple[str, float]:
    """--evaluate's teacher and death penalty (its default where not given); UserError for either
    without --evaluate, or a penalty the teacher does not take."""
    given = [f"--{k.replace('_', '-')}" for k in ("teacher", "death_penalty") if hasattr(args, k)]
    if given and not args.evaluate:
        raise UserError(f"{given[0]} applies to --evaluate only")
    teacher = getattr(args, "teacher", DEFAULT_TEACHER)
    try:
        return teacher, death_penalty_for(teacher, getattr(args, "death_penalty", None))
    except ValueError as e:
        raise UserError(str(e)) from None


def evaluate(args: argparse.Namespace, teacher: str, penalty: float) -> int:
    """``--evaluate MODEL DB...``: one line of figures per DB and a total, against the score and
    against ``teacher`` at death penalty ``penalty`` (``evaluate_teacher``)."""
    from lib.model import resolve_device
    from lib.reward_eval import evaluate_model
    from lib.reward_model import load_reward_model
    from lib.seaquest import OXYGEN_GAMES
    from lib.segments import check_same_game

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


def tb_writer(args: argparse.Namespace, game: str) -> Any:
    """The run's TensorBoard writer (``lib/tb.py``'s run directory) with the flags as its
    hyper-parameter table; UserError with one line when --runs-dir cannot be written."""
    from torch.utils.tensorboard import SummaryWriter

    from lib.tb import hparams_table, run_dir

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


def follow(args: argparse.Namespace, fcfg: FollowConfig) -> int:
    """``--follow``: retrain as labels arrive until Ctrl-C / SIGTERM (exit 130, or 2 on a mistake)."""
    from lib.envs import DEFAULT_ENV, rom_name
    from lib.model import resolve_device
    from lib.reward_follow import Follower, check_follow_config
    from lib.reward_train import _output_paths, check_config
    from lib.segments import check_same_game

    device = resolve_device(args.dev)
    cfg = config_from_args(args, str(device))
    check_config(cfg)
    check_follow_config(fcfg)
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


def train(args: argparse.Namespace) -> int:
    """Train on the DBs' labels; the best model goes to OUTDIR/reward-NAME.pt, logs to --runs-dir.
    Exit 130 when stopped by Ctrl-C: the model is installed, but it is not a finished training."""
    from lib.model import resolve_device
    from lib.reward_data import load_preferences
    from lib.reward_train import check_config, summary_lines, train_reward_model

    device = resolve_device(args.dev)  # fail on --dev cuda without a GPU before reading the DBs
    cfg = config_from_args(args, str(device))
    check_config(cfg)  # every flag in range before the DBs are read
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


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    fcfg = follow_config_from_args(args)
    teacher, penalty = evaluate_teacher(args)
    if args.evaluate:
        return evaluate(args, teacher, penalty)
    if not args.name or not args.out:
        parser.error("training needs -n NAME and -o OUTDIR (or give --evaluate MODEL to score a model)")
    check_name(args.name)
    return follow(args, fcfg) if args.follow else train(args)
