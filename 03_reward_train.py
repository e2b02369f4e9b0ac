#!/usr/bin/env python3
"""Train the reward model on the preference labels of one or more segment DBs.

    03_reward_train.py -n v0 -o saves/reward db/v0 [db/v1 ...]
    03_reward_train.py --evaluate saves/reward/reward-v0.pt db/v1 [db/v2 ...]   # score, no training

Writes the best model (lowest test loss) to OUTDIR/reward-NAME.pt, for ``01_a2c.py -r`` and
``04_play.py``; TensorBoard logs go under runs/. All the logic is in lib/reward_train.py.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lib.errors import UserError, run_cli

ARCHS = ("diff", "book")  # lib.reward_model.ARCHS, the default first (not imported: --help stays torch-free)
DIFF_BLOCK = "4x12"  # lib.reward_model.DIFF_BLOCK as ROWSxCOLS


def block_arg(text: str) -> tuple[int, int]:
    """--diff-block ROWSxCOLS -> (rows, cols); whether they divide 84 is checked with the rest."""
    rows, sep, cols = text.lower().partition("x")
    if not sep or not rows.strip().isdigit() or not cols.strip().isdigit():
        raise argparse.ArgumentTypeError(f"expected ROWSxCOLS such as 4x12, got {text!r}")
    return int(rows), int(cols)


def _add_network_args(p: argparse.ArgumentParser) -> None:
    """Which reward network, and what it sees."""
    p.add_argument(
        "--arch",
        choices=ARCHS,
        default=ARCHS[0],
        help="network: diff = grey 84x84 frame and its change to the frame the step led to (sees where "
        "points are scored); book = the book's net on the colour frame the action is chosen on",
    )
    p.add_argument(
        "--mask-rows",
        type=int,
        default=0,
        metavar="N",
        help="--arch diff: blank the top N rows of its 84x84 input, as the paper masks the score "
        "(10 covers SeaQuest's score): the model must then learn from the scene",
    )
    p.add_argument(
        "--diff-block",
        type=block_arg,
        default=block_arg(DIFF_BLOCK),
        metavar="ROWSxCOLS",
        help=f"--arch diff: the block its frame and change are averaged over, each a divisor of 84 "
        f"(default {DIFF_BLOCK}); finer rows keep apart what sits in different rows of the screen "
        f"(in SeaQuest the score, rows 3-6, and the reserve subs, rows 8-11)",
    )
    p.add_argument(
        "--encoder",
        metavar="POLICY",
        default=None,
        help="--arch diff: also feed it the features of this policy checkpoint's conv layers (frozen; "
        "use the policy the DB was recorded with, e.g. saves/.../best.pt) on the stack frame, frame, "
        "frame, next frame; the checkpoint then carries them",
    )
    p.add_argument(
        "--input",
        choices=("full", "half"),
        default="full",
        help="--arch book's input: full = 210x160 colour frames; half = 105x80 (2x2 average), ~4x cheaper",
    )


def _add_lever_args(p: argparse.ArgumentParser) -> None:
    """Training levers of the few-labels ablation: augmentation, weight decay, SURF's pseudo-labels
    and temporal cropping."""
    p.add_argument(
        "--augment",
        type=int,
        default=0,
        metavar="PX",
        help="training augmentation: shift each frame randomly by up to PX pixels (0: off)",
    )
    p.add_argument(
        "--weight-decay",
        type=float,
        default=0.0,
        metavar="W",
        help="AdamW weight decay (0: plain Adam); the paper regularised its reward model with L2",
    )
    p.add_argument(
        "--pseudo-labels",
        type=float,
        default=0.0,
        metavar="TAU",
        help="SURF's semi-supervision (0: off): every optimiser step also draws --batch random pairs of "
        "ALL the DBs' segments, labeled or not, and trains on the model's own answer where it is at "
        "least TAU sure (e.g. 0.95)",
    )
    p.add_argument("--pseudo-weight", type=float, default=1.0, metavar="LAMBDA", help="weight of the pseudo-label loss")
    p.add_argument(
        "--crop",
        type=int,
        default=0,
        metavar="STEPS",
        help="SURF's temporal cropping (0: off): in training a segment's return sums a random window of "
        "its steps, up to STEPS shorter than the segment",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Train the reward model (Bradley-Terry on preference labels) on one or more segment DBs.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("dbs", nargs="+", metavar="DB", help="segment DB directories with labels (labels.jsonl)")
    p.add_argument("-n", "--name", help="name of the run: the model is OUTDIR/reward-NAME.pt (needed to train)")
    p.add_argument("-o", "--out", metavar="OUTDIR", help="directory for the model (needed to train)")
    p.add_argument(
        "--evaluate",
        metavar="MODEL",
        help="train nothing: score this reward model on the DBs' segments with true rewards (oracle agreement "
        "over all pairs whose true returns differ, return and per-step correlation), one line per DB and a total",
    )
    p.add_argument("--dev", default="cpu", help="torch device to train on: cpu or cuda")
    p.add_argument("--epochs", type=int, default=100, help="maximum epochs (early stopping usually ends sooner)")
    p.add_argument("--batch", type=int, default=16, help="labeled pairs per optimiser step (the book: 64)")
    p.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate (the book: 1e-4)")
    p.add_argument("--seed", type=int, default=42, help="seed of the train/test split, shuffling and weights")
    p.add_argument("--test-ratio", type=float, default=0.2, help="share of the labels held out for testing")
    p.add_argument(
        "--patience",
        type=int,
        default=None,
        help="stop after this many epochs without a better test loss (default: 20 for --arch diff, "
        "whose epochs are cheap; the book's 4 for --arch book)",
    )
    p.add_argument(
        "--noise",
        action="store_true",
        help="assume 10%% of the answers are random (p' = 0.9 p + 0.05), as in the paper",
    )
    p.add_argument(
        "--ensemble",
        type=int,
        default=1,
        metavar="K",
        help="train K models on bootstrap samples; predict their mean, log their disagreement",
    )
    _add_network_args(p)
    p.add_argument(
        "--micro-frames",
        type=int,
        default=100,
        help="steps per forward/backward pass (gradients accumulate up to --batch): bounds memory",
    )
    _add_lever_args(p)
    p.add_argument(
        "--env", default=None, help="game of legacy DBs whose segments don't name one (default SeaquestNoFrameskip-v4)"
    )
    p.add_argument("--runs-dir", default="runs", help="TensorBoard log directory")
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (logs only); it is off anyway when stderr is not a terminal",
    )
    return p


def evaluate(args: argparse.Namespace) -> int:
    from lib.model import resolve_device
    from lib.reward_eval import evaluate_model
    from lib.reward_model import load_reward_model
    from lib.segments import check_same_game

    device = resolve_device(args.dev)
    for db in args.dbs:
        if not Path(db).is_dir():
            raise UserError(f"DB not found: {db}")
    game = check_same_game(args.dbs, "--evaluate got")
    rm = load_reward_model(args.evaluate, game=game, device=device)
    print(f"scoring {args.evaluate} on {len(args.dbs)} DB(s), device {device}")
    evaluate_model(rm, args.dbs)
    return 0


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.evaluate:
        return evaluate(args)
    if not args.name or not args.out:
        parser.error("training needs -n NAME and -o OUTDIR (or give --evaluate MODEL to score a model)")
    if "/" in args.name or "\0" in args.name or args.name.startswith(".") or len(args.name) > 100:
        raise UserError(f"-n must be a plain name (no '/', no leading '.', at most 100 characters), got {args.name!r}")
    from torch.utils.tensorboard import SummaryWriter

    from lib.model import resolve_device
    from lib.reward_train import TrainConfig, check_config, load_preferences, summary_lines, train_reward_model
    from lib.tb import hparams_table, run_dir

    device = resolve_device(args.dev)  # fail on --dev cuda without a GPU before reading the DBs
    cfg = TrainConfig(
        epochs=args.epochs,
        batch=args.batch,
        lr=args.lr,
        seed=args.seed,
        test_ratio=args.test_ratio,
        patience=args.patience,
        noise=args.noise,
        ensemble=args.ensemble,
        micro_frames=args.micro_frames,
        downscale=2 if args.input == "half" else 1,
        augment=args.augment,
        device=str(device),
        arch=args.arch,
        mask_rows=args.mask_rows,
        diff_block=args.diff_block,
        encoder=args.encoder,
        weight_decay=args.weight_decay,
        pseudo_tau=args.pseudo_labels,
        pseudo_weight=args.pseudo_weight,
        crop=args.crop,
    )
    check_config(cfg)  # every flag in range before the DBs are read
    data = load_preferences(args.dbs, env=args.env, unlabeled=args.pseudo_labels > 0)
    log_dir = run_dir(args.runs_dir, args.name, "reward", data.game, args.seed)
    try:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        writer = SummaryWriter(log_dir=str(log_dir))
    except OSError as e:
        raise UserError(
            f"cannot write TensorBoard logs to {log_dir}: {e.strerror or e} (pass another --runs-dir)"
        ) from None
    writer.add_text("hyperparameters", hparams_table({**vars(args), "dbs": " ".join(args.dbs)}))
    try:
        res = train_reward_model(
            data, cfg, Path(args.out) / f"reward-{args.name}.pt", writer=writer, progress=not args.no_progress
        )
    finally:
        writer.close()
    print("\n".join(summary_lines(res)))
    print(f"next: 01_a2c.py -r {res.path} (with -m <policy> --finetune to fine-tune a policy on it)")
    return 0


if __name__ == "__main__":
    run_cli(main)
