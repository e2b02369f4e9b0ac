"""Does a round of labels change what the agent does? Rounds with no person, one command.

Per seed (``--seeds``, each under ``--out/seed<S>``):

1. v0: A2C from scratch for --v0-steps, recording a segment DB (``01_a2c.py --db-path``);
2. round k: --holdout of the round's DB is set aside; a synthetic teacher (``lib/teachers.py``)
   labels --labels random pairs of the rest (``02_label_ui.py --oracle``'s code). Round 1's DB
   is v0's; round k > 1's is the DB the rlhf fine-tune of round k-1 recorded of its own play,
   where a new behaviour first shows (the book's rounds). All of a round's labels come from its
   newest DB: what the person of the book labelled;
3. a reward model with stage 3's defaults trained on EVERY label so far (all the rounds' DBs),
   scored on the held-out segments of the round's DB: agreement with the teacher over every pair
   it prefers one of, per-step correlation of predicted and true reward;
4. arm ``rlhf``: fine-tuned on that reward model (``-r --finetune``) for --ft-steps, from round
   k-1's best rlhf policy (v0's in round 1; the book's way) or, with ``--from v0``, from v0's
   every round (the book's own suggestion); it records its DB for the next round. Arm
   ``control``: the same on the true score, from round k-1's best control policy (or v0's), so
   both arms have had the same fine-tune steps (shared by every teacher of the same --out);
5. v0 and each round's control and rlhf play --eval-games full games with the same seeds.

Prints one table row per round and arm (score with its 95% interval, length, refills per game,
lives lost, the share lost to oxygen, low-gauge climbs toward the surface, the share of steps
at the surface), the reward model's figures and which rule decided the labels per round,
a reward-hacking watch per round (correlation of the rlhf arm's predicted and true game returns
during its fine-tune; its time at the surface), whether the issue's targets hold, and writes
``round.png`` and ``round.json`` under ``--out/seed<S>/<teacher>-<labels>``; with several seeds
also the rows averaged over the seeds (intervals across seeds) in ``--out/<teacher>-<labels>.json``.
Every stage's output is kept and reused when the command runs again: a stopped run continues.

    python -m experiments.round --teacher surface --rounds 3 --labels 100   # the book's three rounds
    python -m experiments.round --teacher score --seeds 0,1
    python -m experiments.round --scale 10 --dev cuda                      # a 10M-step v0 on a GPU
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from experiments.live import report_live, run_live, stop_piped
from experiments.round_report import ARMS, across_seeds, behaviour_share, model_targets, plot, summarise, table, targets
from lib.a2c_cli import to_argv
from lib.a2c_config import FINETUNE_LEARNING_RATE, A2CConfig
from lib.checkpoints import read_checkpoint
from lib.errors import UserError, run_cli
from lib.files import atomic_write
from lib.labels import FIRST_BETTER, LABELS_FILE, SECOND_BETTER, load_labels
from lib.model import BEST_GLOB, best_checkpoint
from lib.oracle import oracle_label_db
from lib.play import play
from lib.play_config import PlayConfig
from lib.reward_eval import oracle_agreement, predict_segments, score
from lib.reward_model import load_reward_model, reward_training_finished
from lib.reward_wrapper import normalised
from lib.seaquest import LOW_OXYGEN, divers_aboard, oxygen_levels, shows_gauge, sub_rows
from lib.seeds import MAX_SEED
from lib.segments import DB_INFO_FILE, SegmentError, db_game, list_segments, read_segment
from lib.signals import PARENT_SIGNALS, SignalStop
from lib.teachers import RULE_FACTS, TEACHERS, Teacher, segment_facts

ROOT = Path(__file__).resolve().parents[1]

ROUND_MODES = ("random", "uncertain", "disagree", "rare")  # lib.sampling's modes that need no fine-tuning DB
NO_MODEL_MODES = ("random", "rare")
FT_LAYERS = ("frozen", "full")  # label all at once: no reward model picks the pairs
CURVE_TAGS = (
    "eval/score_mean",
    "eval/refills_per_game",
    "eval/oxygen_death_share",
    "eval/low_climbs_per_game",
    "eval/length_mean",
    "eval/surface_share",
    # the over-optimisation picture (Gao et al. 2022): the proxy's return and the true score of the
    # training games, and the distance from the start policy, per fine-tune
    "finetune/kl_to_start",
    "finetune/learned_return",
    "finetune/score",
)
V0_EVALS = 10  # evaluations during v0: its best checkpoint is the policy both arms start from
EVAL_SEED = 20_000  # the evaluation games of every arm: apart from training and in-run eval seeds


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.round",
        description="A whole RLHF round with a synthetic teacher: v0, labels, reward model, fine-tune on the "
        "reward model (rlhf) and on the score (control), then the same evaluation games for all three.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--teacher", choices=TEACHERS, default="oxygen", help="who labels (lib/teachers.py)")
    p.add_argument("--teacher-noise", type=float, default=0.0, help="share of random answers of the teacher")
    p.add_argument("--labels", type=int, default=300, help="labeled pairs for the reward model")
    p.add_argument("--v0-steps", type=int, default=1_000_000, help="agent steps of the from-scratch v0 run")
    p.add_argument("--ft-steps", type=int, default=500_000, help="agent steps of each fine-tune arm")
    p.add_argument("--eval-games", type=int, default=30, help="full games each of v0, control and rlhf plays")
    p.add_argument("--out", type=Path, default=Path("runs/round"), help="where every stage's output is kept")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every step count by this (10 for a GPU)")
    p.add_argument("--dev", default="cpu", help="torch device of every stage: cpu, cuda or cuda:N")
    p.add_argument(
        "--seeds",
        type=seed_list,
        default=[0],
        metavar="S,S,...",
        help="run everything once per seed (v0, the splits, the labels, the fine-tunes), each under --out/seed<S>; "
        "the report gives means with 95%% intervals across the seeds",
    )
    p.add_argument(
        "--rounds", type=int, default=1, help="label-retrain-finetune rounds (round k labels round k-1's DB)"
    )
    p.add_argument(
        "--from",
        dest="start",
        choices=("best", "v0"),
        default="best",
        help="where each round's fine-tunes start: best = round k-1's best policy of the same arm (the book's "
        "way), v0 = v0's best policy every round",
    )
    _add_label_args(p)
    _add_finetune_args(p)
    return p


def _add_label_args(p: argparse.ArgumentParser) -> None:
    """What gets recorded and labelled, and how the reward model is trained."""
    p.add_argument(
        "--record-prob",
        type=float,
        default=0.001,
        help="v0's per-step chance to start recording a segment (0.001: ~1,000 segments per 1M steps)",
    )
    p.add_argument("--holdout", type=float, default=0.2, help="share of the DB's segments never labeled")
    p.add_argument(
        "--sampling",
        choices=ROUND_MODES,
        default="rare",
        help="which pairs the teacher labels (02_label_ui.py --sampling): rare, the default (no model: the "
        "segments that look least like the others first, each with a random partner; it doubled the surface "
        "teacher's held-out agreement on diver-climb pairs over random, docs/results.md); random; or the first "
        "third at random and each further third picked by a reward model trained on the labels so far "
        "(uncertain, disagree)",
    )
    p.add_argument(
        "--death-penalty",
        type=float,
        default=0.0,
        metavar="P",
        help="the score teacher: each life lost in a clip costs P points of its sum (02_label_ui.py "
        "--death-penalty); names the round's directory",
    )
    p.add_argument(
        "--reward-args",
        default="",
        metavar='"FLAGS"',
        help='03_reward_train.py flags for every reward model of the round, e.g. "--ensemble 3" (disagree '
        "needs an ensemble); they name the round's directory, so that rounds with other flags never share one",
    )


def _add_finetune_args(p: argparse.ArgumentParser) -> None:
    """What the fine-tunes train and how they are watched; the modes that skip or replace them."""
    p.add_argument(
        "--ft-layers",
        choices=FT_LAYERS,
        default="frozen",
        help="what each fine-tune trains, both arms alike: frozen = the heads only, the conv layers frozen "
        "(01_a2c.py --finetune, the book's way), full = every layer, at the same learning rate",
    )
    p.add_argument(
        "--ft-args",
        default="",
        metavar='"FLAGS"',
        help='01_a2c.py flags for the rlhf (and oracle) fine-tunes, e.g. "--terminal none --reward-scale 0.05 '
        "--reward-norm labels\"; they name the round's directory, as --reward-args do",
    )
    p.add_argument(
        "--oracle-arm",
        action="store_true",
        help="add an arm fine-tuned on the TRUE per-step score sent through exactly the rlhf arm's reward path "
        "(01_a2c.py -r MODEL --reward-oracle with the same --ft-args: normalisation, scale, clip, terminal): "
        "what the path costs apart from what the model's errors cost",
    )
    p.add_argument(
        "--reward-only",
        action="store_true",
        help="the cheap inner loop: v0 (reused when done), round 1's labels and reward model, and its held-out "
        "agreement per deciding rule; no fine-tune and no evaluation games",
    )
    p.add_argument(
        "--live",
        action="store_true",
        help="the same teacher, labels and agent steps, live (experiments/live.py): round 1's labels and model, "
        "then ONE fine-tune of --rounds x --ft-steps from v0 while the teacher labels the other "
        "(--rounds - 1) x --labels pairs of the agent's newest clips and the reward model is retrained as they "
        "arrive; its row is printed beside the staged rounds' (run those first for the comparison)",
    )
    p.add_argument("--evals", type=int, default=5, help="evaluations during each fine-tune (the round.png curve)")
    p.add_argument("--test-episodes", type=int, default=10, help="games per evaluation during training")


MAX_SCALE = 1000.0
MAX_ROUNDS = 50


def seed_list(text: str) -> list[int]:
    """--seeds 0,1,2 -> [0, 1, 2]."""
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seeds such as 0,1,2, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("expected at least one seed")
    return seeds


def check(args: argparse.Namespace) -> None:
    """Every bad value is one line (UserError) before anything runs."""
    for flag, value in (("--reward-args", args.reward_args), ("--ft-args", args.ft_args)):
        try:
            shlex.split(value)
        except ValueError as e:
            raise UserError(f"{flag} cannot be split into flags ({e}): {value!r}") from None
    check_ft_args(args.ft_args)
    if not (math.isfinite(args.scale) and 0 < args.scale <= MAX_SCALE):
        raise UserError(f"--scale must be a number in (0, {MAX_SCALE:g}], got {args.scale}")
    if min(int(args.v0_steps * args.scale), int(args.ft_steps * args.scale)) < 1:
        raise UserError(
            f"--scale {args.scale:g} leaves less than one agent step of --v0-steps {args.v0_steps} or "
            f"--ft-steps {args.ft_steps}: give a larger --scale"
        )
    bad_seeds = [s for s in args.seeds if not 0 <= s <= MAX_SEED]
    if bad_seeds or len(set(args.seeds)) != len(args.seeds):
        raise UserError(f"--seeds must be distinct numbers in 0..{MAX_SEED}, got {','.join(map(str, args.seeds))}")
    if not 1 <= args.rounds <= MAX_ROUNDS:
        raise UserError(f"--rounds must be in 1..{MAX_ROUNDS}, got {args.rounds}")
    wrong = [
        (args.labels < 1, f"--labels must be at least 1, got {args.labels}"),
        (args.v0_steps < 1 or args.ft_steps < 1, "--v0-steps and --ft-steps must be at least 1"),
        (args.eval_games < 1, f"--eval-games must be at least 1, got {args.eval_games}"),
        (not args.scale > 0, f"--scale must be positive, got {args.scale}"),
        (not 0 <= args.teacher_noise <= 1, f"--teacher-noise must be in [0, 1], got {args.teacher_noise}"),
        (not 0 < args.holdout < 1, f"--holdout must be in (0, 1), got {args.holdout}"),
        (not 0 <= args.death_penalty < 1e9, f"--death-penalty must be a number of points >= 0, not {args.death_penalty}"),  # noqa: E501
        (args.death_penalty > 0 and args.teacher != "score", "--death-penalty is the score teacher's (02_label_ui.py)"),
        (args.oracle_arm and (args.live or args.reward_only), "--oracle-arm is an arm of the staged rounds"),
        (not 0 < args.record_prob <= 1, f"--record-prob must be in (0, 1], got {args.record_prob}"),
        (args.evals < 1 or args.test_episodes < 1, "--evals and --test-episodes must be at least 1"),
        (args.sampling not in NO_MODEL_MODES and args.labels < 3, "--sampling needs --labels 3 or more (in thirds)"),
        (args.live and args.reward_only, "--live and --reward-only exclude each other"),
        (args.live and args.rounds < 2, "--live needs --rounds 2 or more (round 1's labels come first)"),
        (args.live and args.sampling not in NO_MODEL_MODES, "--live labels --sampling random or rare pairs"),
        (args.live and args.start == "v0", "--live fine-tunes once, from v0: --from does not apply"),
        (args.sampling == "disagree" and ensemble_of(args) < 2, "--sampling disagree needs an ensemble: --reward-args '--ensemble 3'"),  # noqa: E501
    ]  # fmt: skip
    for bad, message in wrong:
        if bad:
            raise UserError(message)


# --- stages -------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[round {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_stage(name: str, cmd: list[str], logfile: Path) -> None:
    """Run a pipeline script, its output appended to ``logfile`` and echoed with a prefix."""
    logfile.parent.mkdir(parents=True, exist_ok=True)
    log(f"{name}: $ {' '.join(cmd[1:])}  (log: {logfile})")
    with open(logfile, "a", encoding="utf-8") as f:

        def echo(line: str) -> None:
            f.write(line)
            f.flush()
            print(f"  [{name}] {line}", end="", flush=True)

        # its own session: Ctrl-C, SIGTERM and SIGHUP reach this module only (cli), which stops it
        # on its own Ctrl-C path (experiments.live.stop_piped) before it ends
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                echo(line)
        except KeyboardInterrupt:
            stop_piped(name, proc, echo)
            raise
        rc = proc.wait()
    if rc != 0:
        raise UserError(f"stage {name} failed (exit {rc}); its output is in {logfile}")


def a2c_progress(save_dir: Path) -> int | None:
    """Agent steps a run in ``save_dir`` has done (from its last.pt), None when it has none."""
    last = save_dir / "last.pt"
    if not last.exists():
        return None
    ck = read_checkpoint(last, "model")
    return int(ck.get("progress", {}).get("step", 0))


def train_a2c(cfg: A2CConfig, evals: int, args: argparse.Namespace) -> None:
    """``01_a2c.py`` with the arm's settings (``cfg``: name, save directory, ``max_steps``, where it
    starts and what it learns from and records) and the round's (device, seed, logs, ``evals``
    evaluations): skipped when done, continued (``resume``) when stopped."""
    steps = cfg.max_steps
    done = a2c_progress(cfg.save_dir)
    if done is not None and done >= steps:
        log(f"{cfg.name}: done ({done:,} steps in {cfg.save_dir}), reused")
        return
    cfg = replace(
        cfg,
        dev=args.dev,
        seed=args.seed,
        runs_dir=str(args.out / "tb"),
        test_every=max(steps // evals, 1),
        test_episodes=args.test_episodes,
    )
    # stopped part-way: continue from last.pt (its policy, not the one the arm starts from)
    cfg = replace(cfg, resume=True, model=None) if done is not None else replace(cfg, force=True)
    run_stage(cfg.name, [sys.executable, str(ROOT / "01_a2c.py"), *to_argv(cfg)], args.out / "logs" / f"{cfg.name}.log")
    reached = a2c_progress(cfg.save_dir) or 0
    if reached < steps:  # Ctrl-C reached the child too: it saved last.pt and ended cleanly
        raise UserError(f"{cfg.name} stopped at step {reached:,} of {steps:,}: run the same command to continue")


def best_policy(save_dir: Path) -> Path:
    """A run's best checkpoint (``lib.model.best_checkpoint``)."""
    best = best_checkpoint(save_dir)
    if best is None:
        raise UserError(f"no {BEST_GLOB} in {save_dir}: the run never finished an evaluation")
    return best


def split_db(db: Path, out: Path, holdout: float, seed: int) -> dict[str, list[str]]:
    """Held-out and labelable segments of the v0 DB (kept in out/split.json, made once)."""
    path = out / "split.json"
    if path.exists():
        return json.loads(path.read_text())
    segs = list_segments(db)
    if len(segs) < 10:
        raise UserError(f"v0 recorded {len(segs)} segments into {db}: too few for a round (raise --record-prob)")
    order = np.random.default_rng(seed).permutation(len(segs))
    n_hold = max(2, int(round(holdout * len(segs))))
    split = {"holdout": sorted(segs[i] for i in order[:n_hold]), "train": sorted(segs[i] for i in order[n_hold:])}
    atomic_write(path, json.dumps(split).encode())
    return split


def teacher_db(db: Path, tdb: Path, train: list[str]) -> None:
    """A DB of the labelable segments for one teacher's labels: hard links to v0's files (a
    DB holds one labels.jsonl, and teachers must not share it)."""
    for rel in [DB_INFO_FILE, *train]:
        src, dst = db / rel, tdb / rel
        if dst.exists() or not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dst)
        except OSError:
            atomic_write(dst, src.read_bytes())


def ensemble_of(args: argparse.Namespace) -> int:
    """The --ensemble K of --reward-args (1 when not given)."""
    words = shlex.split(args.reward_args)
    for i, w in enumerate(words):
        if w == "--ensemble" and i + 1 < len(words) and words[i + 1].isdigit():
            return int(words[i + 1])
        if w.startswith("--ensemble=") and w.split("=", 1)[1].isdigit():
            return int(w.split("=", 1)[1])
    return 1


# 01_a2c.py flags that the round sets itself for each arm: --ft-args may not name them
FT_ARGS_RESERVED = {"-n", "--name", "-m", "--model", "-r", "--reward", "--save", "--db-path", "--max-steps", "--seed"}
FT_ARGS_RESERVED |= {"--resume", "--force", "--runs-dir", "--test-every", "--test-episodes", "--dev", "--reward-oracle"}


def check_ft_args(ft_args: str) -> None:
    """--ft-args: 01_a2c.py's own flags, parsed by its parser (a wrong one is one line now, not an
    arm's failure an hour later); none of those the round sets per arm."""
    from lib.a2c_cli import build_parser as a2c_parser

    words = shlex.split(ft_args)
    taken = sorted({w.split("=", 1)[0] for w in words} & FT_ARGS_RESERVED)
    if taken:
        raise UserError(f"--ft-args may not set {', '.join(taken)}: the round sets it for each arm")
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # argparse's usage lines: our one line says it
            a2c_parser().parse_args(["-n", "x", *words])
    except SystemExit:
        raise UserError(f"--ft-args {ft_args!r}: not flags 01_a2c.py takes (see python 01_a2c.py --help)") from None


def ft_config(args: argparse.Namespace, **fields: Any) -> A2CConfig:
    """An rlhf or oracle arm's A2CConfig: the round's ``fields`` with --ft-args on top."""
    from lib.a2c_cli import build_parser as a2c_parser

    parsed = vars(a2c_parser().parse_args(["-n", "x", *shlex.split(args.ft_args)]))
    given = {k: v for k, v in parsed.items() if k != "name" and v != getattr(A2CConfig, k, None)}
    return A2CConfig(**{**fields, **given})


def round_name(args: argparse.Namespace) -> str:
    """The teacher's directory under a seed's directory: teacher, labels, and whatever else makes
    its labels, models or fine-tunes differ (noise, a sampling mode, --reward-args, --from v0,
    --ft-layers full)."""
    name = f"{args.teacher}-{args.labels}"
    name += f"-noise{args.teacher_noise:g}" if args.teacher_noise else ""
    name += f"-{args.sampling}" if args.sampling != "rare" else ""  # rare: the default
    name += f"-death{args.death_penalty:g}" if getattr(args, "death_penalty", 0) else ""
    flags = re.sub(r"[^A-Za-z0-9.]+", "", args.reward_args)
    name += f"-{flags}" if flags else ""
    ft_flags = re.sub(r"[^A-Za-z0-9.]+", "", getattr(args, "ft_args", ""))
    name += f"-ft{ft_flags}" if ft_flags else ""
    name += "-fromv0" if getattr(args, "start", "best") == "v0" else ""
    return name + (f"-{args.ft_layers}" if getattr(args, "ft_layers", "frozen") != "frozen" else "")


def label_steps(n: int, sampling: str) -> list[int]:
    """Label counts at which a model is trained before the next pick: all at once at random or
    rare, else thirds (the first at random: no model exists yet)."""
    return [n] if sampling in NO_MODEL_MODES else sorted({n // 3, 2 * n // 3, n})


def label(tdb: Path, args: argparse.Namespace, upto: int | None = None, reward: Path | None = None) -> None:
    """The teacher labels ``tdb`` up to ``upto`` (default --labels) pairs: at random, or picked by
    --sampling with ``reward``, as the label page would offer them."""
    upto = args.labels if upto is None else upto
    have = len(load_labels(tdb, warn=None))
    if have >= upto:
        log(f"labels: {have} in {tdb}, reused")
        return
    how = args.sampling if reward is not None or args.sampling in NO_MODEL_MODES else "random"
    s = oracle_label_db(
        tdb,
        upto - have,
        seed=args.seed if args.sampling == "random" else args.seed * 1000 + upto,  # random: as before --sampling
        teacher=args.teacher,
        noise=args.teacher_noise,
        sampling=how,
        reward=reward,
        death_penalty=args.death_penalty,
    )
    log(f"labels: {s.labeled} {how} pairs from the {args.teacher} teacher in {s.seconds:.0f} s: {s.counts}")


def label_and_train(tdb: Path, tdir: Path, args: argparse.Namespace, older: list[Path] | None = None) -> Path:
    """Labels of ``tdb`` and the round's reward model, trained on them and on the ``older`` rounds'
    label DBs. With a model-picked --sampling, a model trained on the first third picks the second
    third, a model of both the last; only the final one is the round's."""
    model: Path | None = None
    steps = label_steps(args.labels, args.sampling)
    for n in steps:
        label(tdb, args, n, model)
        model = train_reward([*(older or []), tdb], tdir, args, "round" if n == steps[-1] else f"round-{n}")
    assert model is not None
    return model


def train_reward(dbs: list[Path], tdir: Path, args: argparse.Namespace, name: str = "round") -> Path:
    path = tdir / f"reward-{name}.pt"
    if reward_training_finished(path):
        log(f"reward model: {path}, reused")
        return path
    if path.exists():
        log(f"reward model: {path} was stopped early by hand (or is unreadable): training it again")
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", name, "-o", str(tdir), "--dev", args.dev]
    cmd += ["--seed", str(args.seed), "--runs-dir", str(args.out / "tb"), "--no-progress"]
    cmd += [*shlex.split(args.reward_args), *map(str, dbs)]
    run_stage("reward", cmd, args.out / "logs" / f"reward-{tdir.parent.name}-{tdir.name}-{name}.log")
    return path


# --- figures ------------------------------------------------------------------------------------


def held_out_figures(
    db: Path, holdout: list[str], reward: Path, teacher: str, dev: str, death_penalty: float = 0.0
) -> dict[str, Any]:
    """The reward model on segments it never saw: agreement with the teacher over every held-out
    pair the teacher prefers one of (a predicted tie counts as wrong), overall and per deciding rule
    (``by_rule``: agreement and pairs); ``--evaluate``'s figures against the score (agreement,
    per-step correlation); what the model pays where a life is lost (``life_loss_rewards``) and,
    for SeaQuest, on steps with a low gauge and a diver aboard (``diver_step_rewards``)."""
    rm = load_reward_model(reward, device=dev)
    preds = predict_segments(rm, db, holdout)
    vs_score = score(preds)
    game = (db_game(db) or (None, None))[0]
    facts, lost, flags = [], [], []
    for rel in preds.names:
        seg = read_segment(db, rel)
        facts.append(segment_facts(seg.frames, seg.rewards, seg.dones, game))
        lost.append(np.zeros(len(seg.frames), dtype=bool) if seg.dones is None else np.asarray(seg.dones, dtype=bool))
        if shows_gauge(game, seg.frames.shape[1:]):  # the steps' flags, not the frames (~5 MB a segment)
            flags.append(diver_step_flags(seg.frames))
    judge = Teacher(teacher, death_penalty=death_penalty)
    i, j = np.triu_indices(len(facts), k=1)
    verdicts = [judge.judge_rule(facts[a], facts[b]) for a, b in zip(i, j, strict=True)]
    agree, n, by_rule = rule_agreement(preds.pred_returns[i], preds.pred_returns[j], verdicts)
    figs: dict[str, Any] = {
        "teacher_agreement": agree,
        "teacher_pairs": n,
        "by_rule": by_rule,
        "score_agreement": vs_score.agreement,
        "score_pairs": vs_score.pairs,
        "step_corr_heldout": vs_score.step_corr,
        "heldout_segments": vs_score.segments,
        **life_loss_rewards(preds.pred_steps, np.concatenate(lost) if lost else np.zeros(0, dtype=bool)),
    }
    if flags and len(flags) == len(facts):
        figs.update(_diver_step_figures(preds.pred_steps, flags))
    return figs


def rule_agreement(
    pred1: np.ndarray, pred2: np.ndarray, verdicts: list[tuple[int, str]]
) -> tuple[float, int, dict[str, dict[str, float]]]:
    """Agreement of predicted returns with the teacher's verdicts (answer, rule) on the same pairs:
    over every pair it prefers one of, and per rule that decided ({rule: {agreement, pairs}})."""
    answers = np.array([a for a, _ in verdicts], dtype=np.int64).reshape(-1)
    rules = np.array([r for _, r in verdicts], dtype=object).reshape(-1)
    # The preference as a pair of "true returns", so that oracle_agreement's one rule applies:
    # (1, 0) when #1 is preferred, (0, 1) for #2, NaN (left out) for ties and can't tell.
    t1 = np.where(answers == FIRST_BETTER, 1.0, np.where(answers == SECOND_BETTER, 0.0, math.nan))
    agree, n = oracle_agreement(pred1, pred2, t1, 1.0 - t1)
    by_rule = {}
    for rule in sorted(set(rules[np.isfinite(t1)].tolist())):
        m = rules == rule
        a, k = oracle_agreement(pred1[m], pred2[m], t1[m], 1.0 - t1[m])
        by_rule[rule] = {"agreement": a, "pairs": k}
    return agree, n, by_rule


def diver_step_rewards(pred_steps: np.ndarray, frames: list[np.ndarray]) -> dict[str, float]:
    """SeaQuest: the model's mean normalised reward (``lib.reward_wrapper.normalised``, the
    learner's units) on the held-out steps with a low gauge (0 < level <= LOW_OXYGEN, not filling:
    ``lib.seaquest``'s low) and a diver aboard, split by whether the sub climbs there (its top row
    above the step before's, within a segment): ``diver_climb_z`` and ``diver_still_z`` (NaN where
    there are none), with their counts.
    A model that has learned what the surface teacher asks for pays more for the climb."""
    return _diver_step_figures(pred_steps, [diver_step_flags(f) for f in frames])


def diver_step_flags(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One segment's (T,) masks: a low gauge (not filling) with a diver aboard, and the sub climbing."""
    levels, rows, divers = oxygen_levels(frames), sub_rows(frames), divers_aboard(frames)
    draining, up = np.zeros(len(frames), dtype=bool), np.zeros(len(frames), dtype=bool)
    draining[1:] = levels[1:] <= levels[:-1]  # not filling (a segment's first step: not judged)
    up[1:] = (rows[1:] >= 0) & (rows[:-1] >= 0) & (rows[1:] < rows[:-1])
    return draining & (levels > 0) & (levels <= LOW_OXYGEN) & (divers > 0), up


def _diver_step_figures(pred_steps: np.ndarray, flags: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    z = normalised(pred_steps).astype(np.float64)
    steps = sum(len(low) for low, _ in flags)
    if len(z) != steps:
        raise ValueError(f"{len(z)} predictions for {steps} steps")
    low, up = np.concatenate([f[0] for f in flags]), np.concatenate([f[1] for f in flags])
    climb, still = low & up, low & ~up
    return {
        "diver_climb_z": float(z[climb].mean()) if climb.any() else math.nan,
        "diver_climb_steps": int(climb.sum()),
        "diver_still_z": float(z[still].mean()) if still.any() else math.nan,
        "diver_still_steps": int(still.sum()),
    }


LIFE_LOSS_LEAD = 15  # steps before a life loss that ``life_loss_rewards`` also averages


def life_loss_rewards(pred_steps: np.ndarray, life_lost: np.ndarray) -> dict[str, float]:
    """What a reward model pays around a lost life, in the learner's units: per-step predictions
    normalised as ``RewardModelWrapper`` does (``lib.reward_wrapper.normalised``). The true
    reward there is 0, so a model the agent cannot exploit pays about 0 or less.

    ``life_loss_z``: the mean on the steps that lost a life; ``pre_loss_z``: the mean over the
    ``LIFE_LOSS_LEAD`` steps before each of them (what the agent is paid for heading into a death);
    ``life_losses``: how many there were. NaN where there is none."""
    pred_steps = np.asarray(pred_steps, dtype=np.float64)
    life_lost = np.asarray(life_lost, dtype=bool)
    if pred_steps.shape != life_lost.shape:
        raise ValueError(f"{pred_steps.shape} predictions for {life_lost.shape} steps")
    z = normalised(pred_steps).astype(np.float64)
    at = np.flatnonzero(life_lost)
    lead = np.zeros(len(z), dtype=bool)
    for t in at:
        lead[max(0, t - LIFE_LOSS_LEAD) : t] = True
    lead &= ~life_lost
    return {
        "life_losses": int(len(at)),
        "life_loss_z": float(z[at].mean()) if len(at) else math.nan,
        "pre_loss_z": float(z[lead].mean()) if lead.any() else math.nan,
    }


def own_clip_figures(db: Path, reward: Path, dev: str) -> dict[str, float]:
    """What a reward model pays around a lost life on the clips the agent fine-tuned on it recorded of
    its own play (``life_loss_rewards``): does the agent it produced find dying paid?"""
    names = list_segments(db, warn=None)
    preds = predict_segments(load_reward_model(reward, device=dev), db, names)
    lost = []
    for rel in preds.names:
        seg = read_segment(db, rel)
        lost.append(np.zeros(len(seg.frames), dtype=bool) if seg.dones is None else np.asarray(seg.dones, dtype=bool))
    return {
        "segments": len(preds.names),
        **life_loss_rewards(preds.pred_steps, np.concatenate(lost) if lost else np.zeros(0, dtype=bool)),
    }


EVIDENCE_KEY = {"oxygen_deaths": "by_oxygen_death", "refills": "by_refill", "returns": "by_score"}
RULE_KEY = {"oxygen_death": "by_oxygen_death", "refill": "by_refill", "score": "by_score"}


def teacher_evidence(db: Path, tdb: Path, train: list[str], teacher: str) -> dict[str, int]:
    """What the teacher had to go on: how its labels were decided (by the teacher's own rule: the
    score teacher decides every label by the score), and how many of the labelable segments show a
    voluntary refill or an oxygen death at all (SeaQuest)."""
    ev = {"labels": 0, "by_oxygen_death": 0, "by_refill": 0, "by_score": 0, "ties": 0, "cant_tell": 0}
    rules: dict[str, int] = {}
    for lab in load_labels(tdb, warn=None).values():
        ev["labels"] += 1
        rule = lab.extra.get("rule")
        if isinstance(rule, str):  # the rule the teacher recorded (lib.oracle)
            rules[rule] = rules.get(rule, 0) + 1
        if lab.label not in (FIRST_BETTER, SECOND_BETTER):
            ev["ties" if lab.label == 0 else "cant_tell"] += 1
            continue
        if rule in RULE_KEY:  # recorded: oxygen_death, refill or score (climb and idle: in "rules" only)
            ev[RULE_KEY[rule]] += 1
            continue
        for fact in RULE_FACTS.get(teacher, ()):  # labels written before rules were recorded
            values = lab.extra.get(fact)
            if isinstance(values, list) and len(values) == 2 and values[0] != values[1]:
                ev[EVIDENCE_KEY[fact]] += 1
                break
    ev["rules"] = rules  # type: ignore[assignment]
    game = (db_game(db) or (None, None))[0]
    ev.update(segments=0, with_refill=0, with_oxygen_death=0, lives_lost=0)
    for rel in train:
        try:
            seg = read_segment(db, rel)
        except SegmentError:
            continue
        f = segment_facts(seg.frames, seg.rewards, seg.dones, game)
        ev["segments"] += 1
        if f.oxygen is not None:
            ev["with_refill"] += f.oxygen.refills > 0
            ev["with_oxygen_death"] += f.oxygen.oxygen_deaths > 0
            ev["lives_lost"] += f.oxygen.deaths
    return ev


def evaluate_arm(policy: Path, cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    """--eval-games full games with EVAL_SEED (the same games for every arm); kept in ``cache``,
    keyed on the policy's content (a run resumed to more steps writes a new ``last.pt`` at the
    same path) and the games."""

    def games() -> dict[str, Any]:
        log(f"evaluating {policy}: {args.eval_games} games")
        cfg = PlayConfig(model=str(policy), episodes=args.eval_games, dev=args.dev, seed=EVAL_SEED)
        results = play(cfg, log=lambda m: None)
        return {
            "policy": str(policy),
            "games": args.eval_games,
            "scores": [r.score for r in results],
            "lengths": [r.steps for r in results],
            "refills": [r.oxygen.refills if r.oxygen else None for r in results],
            "deaths": [r.oxygen.deaths if r.oxygen else None for r in results],
            "oxygen_deaths": [r.oxygen.oxygen_deaths if r.oxygen else None for r in results],
            **{name: [_surface(r, key) for r in results] for name, key in SURFACE_FIGURES.items()},
        }

    return cached_json(cache, games, {"policy": file_digest(policy), "games": args.eval_games, "seed": EVAL_SEED})


# evaluate_arm's record: its name -> the SurfaceCounts field per game
SURFACE_FIGURES = {
    "climbs": "low_climbs",
    "surface_steps": "surface_steps",
    "rescues": "rescues",
    "diver_steps": "diver_steps",
}


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes: what a cached figure of it was made from."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def tb_scalars(tb_root: Path, run_prefix: str, tag: str) -> tuple[list[int], list[float]]:
    """(steps, values) of ``tag`` from the newest TensorBoard run whose name starts with
    ``run_prefix`` (a resumed run continues in the same directory)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted(p for p in tb_root.glob(f"{run_prefix}__*") if p.is_dir())
    steps: dict[int, float] = {}
    for run in runs:  # earlier directories of a run started over are overwritten by later ones
        acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            steps.update({e.step: e.value for e in acc.Scalars(tag)})
    keys = sorted(steps)
    return keys, [steps[k] for k in keys]


# --- the rounds ---------------------------------------------------------------------------------


def _surface(res: Any, key: str) -> float | None:
    """A game's surface figure (``lib.behaviour``'s observer), None where the game had none."""
    counts = getattr(res, "surface", None)
    return None if counts is None else float(getattr(counts, key))


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def cached_json(path: Path, make: Any, key: dict[str, Any] | None = None) -> Any:
    """``make()``'s JSON-able result, kept in ``path`` with ``key`` (what it was made from: a
    file's digest, the settings) and read back when the command runs again with the same key;
    made again when the key differs or the file is unreadable."""
    if path.exists():
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            kept = None
        if isinstance(kept, dict) and kept.get("made_from") == key and "value" in kept:
            return kept["value"]
    value = make()
    atomic_write(path, json.dumps({"made_from": key, "value": value}).encode())
    return value


@dataclass
class SeedRun:
    """One seed's run: its settings (``args.out`` is the seed's directory, ``args.seed`` its seed),
    the teacher's directory, v0's DB, split and best policy."""

    args: argparse.Namespace
    tdir: Path
    db: Path
    split: dict[str, list[str]]
    v0_policy: Path


def seed_args(args: argparse.Namespace, seed: int) -> argparse.Namespace:
    """``args`` for one seed: its own directory under --out."""
    one = copy.copy(args)
    one.seed, one.out = seed, args.out / f"seed{seed}"
    return one


def run_v0(args: argparse.Namespace) -> SeedRun:
    """v0 and its DB (stage 1), the DB's split; the teacher's directory."""
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {args.out}: {e.strerror or e}") from None
    db = args.out / "db"
    v0 = A2CConfig(
        name="round-v0",
        save=str(args.out / "v0"),
        max_steps=int(args.v0_steps * args.scale),
        db_path=str(db),
        record_prob=args.record_prob,
    )
    train_a2c(v0, V0_EVALS, args)
    tdir = args.out / round_name(args)
    tdir.mkdir(parents=True, exist_ok=True)
    return SeedRun(args, tdir, db, split_db(db, args.out, args.holdout, args.seed), best_policy(args.out / "v0"))


def round_source(sr: SeedRun, k: int) -> tuple[Path, dict[str, list[str]]]:
    """The DB round ``k`` labels, and its split: v0's in round 1, else what round k-1's rlhf
    fine-tune recorded of its own play (split with a seed of its own)."""
    if k == 1:
        return sr.db, sr.split
    db = sr.tdir / f"r{k - 1}" / "rlhf-db"
    return db, split_db(db, sr.tdir / f"r{k}", sr.args.holdout, sr.args.seed + k)


def fine_tune_arms(sr: SeedRun, k: int, reward: Path) -> dict[str, tuple[str, Path]]:
    """Round ``k``'s control and rlhf fine-tunes: (TensorBoard name, save directory) per arm."""
    args, rdir = sr.args, sr.tdir / f"r{k}"
    steps, fresh = int(args.ft_steps * args.scale), k == 1 or args.start == "v0"
    ctl_base = args.out / ("control" if args.ft_layers == "frozen" else f"control-{args.ft_layers}")
    ctl_dir = ctl_base / f"r{1 if args.start == 'v0' else k}"
    ctl_start = sr.v0_policy if fresh else best_policy(ctl_base / f"r{k - 1}")
    ctl_name = f"round-{ctl_base.name}-{ctl_dir.name}"
    ft = ft_settings(args.ft_layers)
    control = A2CConfig(name=ctl_name, save=str(ctl_dir), max_steps=steps, model=str(ctl_start), **ft)
    train_a2c(control, args.evals, args)
    rl_start = sr.v0_policy if fresh else best_policy(sr.tdir / f"r{k - 1}" / "rlhf")
    rl_name = f"round-rlhf-{sr.tdir.name}-r{k}"
    rlhf = ft_config(
        args,
        name=rl_name,
        save=str(rdir / "rlhf"),
        max_steps=steps,
        model=str(rl_start),
        reward=str(reward),
        db_path=str(rdir / "rlhf-db"),  # the next round's DB
        record_prob=args.record_prob,
        **ft,
    )
    train_a2c(rlhf, args.evals, args)
    arms = {"control": (ctl_name, ctl_dir), "rlhf": (rl_name, rdir / "rlhf")}
    if args.oracle_arm:  # the true score through the rlhf arm's path: -r's stats, --ft-args, no DB
        or_start = sr.v0_policy if fresh else best_policy(sr.tdir / f"r{k - 1}" / "oracle")
        or_name = f"round-oracle-{sr.tdir.name}-r{k}"
        oracle = ft_config(
            args,
            name=or_name,
            save=str(rdir / "oracle"),
            max_steps=steps,
            model=str(or_start),
            reward=str(reward),
            reward_oracle=True,
            **ft,
        )
        train_a2c(oracle, args.evals, args)
        arms["oracle"] = (or_name, rdir / "oracle")
    return arms


def ft_settings(layers: str) -> dict[str, Any]:
    """A fine-tune's A2CConfig fields for --ft-layers: frozen conv layers (--finetune), or every
    layer trained at the fine-tune's learning rate."""
    if layers == "frozen":
        return {"finetune": True}
    return {"finetune": False, "lr": FINETUNE_LEARNING_RATE}


def label_agreement(reward: Path, ldb: Path, dev: str) -> dict[str, float]:
    """How well a reward model understood the clips of the agent it produced: the share of the
    labels of ``ldb`` that prefer one clip (1 or 2) whose order its predicted returns agree with,
    measured before it is trained on them (a predicted tie counts as wrong)."""
    labels = [lab for lab in load_labels(ldb, warn=None).values() if lab.label in (FIRST_BETTER, SECOND_BETTER)]
    names = sorted({n for lab in labels for n in (lab.sample1, lab.sample2)})
    preds = predict_segments(load_reward_model(reward, device=dev), ldb, names)
    ret = dict(zip(preds.names, preds.pred_returns.tolist(), strict=True))
    judged = [lab for lab in labels if lab.sample1 in ret and lab.sample2 in ret]
    order = {FIRST_BETTER: 1.0, SECOND_BETTER: -1.0}
    right = sum(np.sign(ret[lab.sample1] - ret[lab.sample2]) == order[lab.label] for lab in judged)
    return {"agreement": right / len(judged) if judged else math.nan, "pairs": len(judged)}


def reward_round(sr: SeedRun, k: int) -> tuple[Path, dict[str, Any]]:
    """Round ``k``'s inner loop: labels of its DB, a reward model of every label so far, its
    held-out figures and the labels' evidence (the reward model and its ``reward_model`` and
    ``evidence`` figures)."""
    args, rdir = sr.args, sr.tdir / f"r{k}"
    rdir.mkdir(parents=True, exist_ok=True)
    src, split = round_source(sr, k)
    ldb = rdir / "label-db"
    teacher_db(src, ldb, split["train"])
    older = [sr.tdir / f"r{j}" / "label-db" for j in range(1, k)]
    previous = sr.tdir / f"r{k - 1}" / "reward-round.pt"
    if k > 1 and not (rdir / "reward-round.pt").exists():
        label(ldb, args)  # this round's labels first: the previous model is judged on them before training
    reward = label_and_train(ldb, rdir, args, older)
    before = None
    if k > 1 and previous.exists():
        before = cached_json(
            rdir / "previous_model_on_new_labels.json",
            lambda: label_agreement(previous, ldb, args.dev),
            {"reward": file_digest(previous), "labels": file_digest(ldb / LABELS_FILE)},
        )
    figs = cached_json(
        rdir / "reward_heldout.json",
        lambda: held_out_figures(src, split["holdout"], reward, args.teacher, args.dev, args.death_penalty),
        {"reward": file_digest(reward), "teacher": args.teacher, "holdout": len(split["holdout"])}
        | ({"death_penalty": args.death_penalty} if args.death_penalty else {}),
    )
    evidence = cached_json(
        rdir / "evidence.json",
        lambda: teacher_evidence(src, ldb, split["train"], args.teacher),
        {"labels": file_digest(ldb / LABELS_FILE), "teacher": args.teacher},
    )
    if before is not None:
        figs = {**figs, "previous_on_new_labels": before["agreement"], "previous_on_new_pairs": before["pairs"]}
    return reward, {"reward_model": figs, "evidence": evidence}


def run_round(sr: SeedRun, k: int) -> dict[str, Any]:
    """Round ``k``: ``reward_round``, both fine-tunes, the evaluation games; its rows, reward-model
    figures, label evidence, watch and curves."""
    args, rdir = sr.args, sr.tdir / f"r{k}"
    reward, figures = reward_round(sr, k)
    figs = figures["reward_model"]
    arms = fine_tune_arms(sr, k, reward)
    policies = {"v0": sr.v0_policy, **{arm: d / "last.pt" for arm, (_, d) in arms.items()}}
    evals = args.out / "eval"
    caches = {"v0": evals / "v0.json", "control": evals / f"control-{arms['control'][1].name}.json"}
    caches["rlhf"] = rdir / "eval.json"
    caches["oracle"] = rdir / "eval-oracle.json"
    rows = {arm: summarise(evaluate_arm(policies[arm], caches[arm], args)) for arm in ARMS if arm in policies}
    tb, rl_name = args.out / "tb", arms["rlhf"][0]
    figs["step_corr_finetune"] = _mean(tb_scalars(tb, rl_name, "reward_model/step_corr")[1])
    own_db = rdir / "rlhf-db"
    if list_segments(own_db, warn=None):
        figs["own_clips"] = cached_json(
            rdir / "own_clips.json",
            lambda: own_clip_figures(own_db, reward, args.dev),
            {"reward": file_digest(reward), "segments": len(list_segments(own_db, warn=None))},
        )
    watch = {
        "return_corr": _mean(tb_scalars(tb, rl_name, "reward_model/true_vs_pred_corr")[1]),
        "surface_share": rows["rlhf"].get("surface_share", math.nan),
    }
    curves = {arm: {tag: tb_scalars(tb, name, tag) for tag in CURVE_TAGS} for arm, (name, _) in arms.items()}
    return {"rows": rows, **figures, "watch": watch, "curves": curves}


def print_model_figures(what: str, rm: dict[str, Any]) -> None:
    """A reward model's held-out figures: overall, per deciding rule, on low-gauge diver steps."""
    during = rm.get("step_corr_finetune")
    print(
        f"{what} on {rm['heldout_segments']} never-seen segments of the round's DB: "
        f"{100 * rm['teacher_agreement']:.1f}% agreement with the teacher ({rm['teacher_pairs']} pairs), "
        f"{100 * rm['score_agreement']:.1f}% with the score; per-step correlation with the true reward "
        f"{rm['step_corr_heldout']:+.2f} (held out)"
        + (f", {during:+.2f} (during the rlhf fine-tune)" if during is not None else "")
    )
    if by_rule := rm.get("by_rule"):
        parts = [f"{rule} {100 * v['agreement']:.1f}% ({v['pairs']} pairs)" for rule, v in by_rule.items()]
        print("  held-out agreement per deciding rule: " + ", ".join(parts))
    if "diver_climb_z" in rm:
        print(
            f"  mean normalised reward on held-out steps with a low gauge and a diver aboard: climbing "
            f"{rm['diver_climb_z']:+.2f} ({rm['diver_climb_steps']} steps), not climbing "
            f"{rm['diver_still_z']:+.2f} ({rm['diver_still_steps']} steps)"
        )


def print_reward_notes(k: int, r: dict[str, Any]) -> None:
    """The reward model's held-out figures (overall, per deciding rule, on low-gauge diver steps)
    and how the round's labels were decided."""
    rm = r["reward_model"]
    if "previous_on_new_labels" in rm:
        print(
            f"round {k}: round {k - 1}'s reward model agreed with {100 * rm['previous_on_new_labels']:.1f}% of this "
            f"round's {rm['previous_on_new_pairs']} new labels (its agent's own clips) before training on them"
        )
    print_model_figures(f"round {k}: reward model", rm)
    if "life_loss_z" in rm:
        print(
            f"  normalised reward where a life is lost {rm['life_loss_z']:+.2f} ({rm['life_losses']} losses), "
            f"the {LIFE_LOSS_LEAD} steps before {rm['pre_loss_z']:+.2f} (the median step is 0)"
        )
    print_evidence(r["evidence"])


def print_evidence(ev: dict[str, Any]) -> None:
    """How the labels were decided (``teacher_evidence``)."""
    rules = ", ".join(f"{n} {rule}" for rule, n in sorted(ev.get("rules", {}).items(), key=lambda x: -x[1]))
    print(
        f"  the teacher's {ev['labels']} labels: {ev['by_oxygen_death']} decided by an oxygen death, "
        f"{ev['by_refill']} by a refill, {ev['by_score']} by the score, {ev['ties']} ties, "
        f"{ev['cant_tell']} can't tell"
        + (f"; by the rule recorded: {rules}" if rules else "")
        + f"; {100 * behaviour_share(ev):.0f}% decided by a rule the score does not pay for"
        + f"; of the DB's {ev['segments']} labelable segments {ev['with_refill']} show a voluntary refill "
        f"and {ev['with_oxygen_death']} an oxygen death ({ev['lives_lost']} lives lost)"
    )


def print_round_notes(k: int, r: dict[str, Any]) -> None:
    """``print_reward_notes``, what the model pays for a death on the rlhf agent's own clips, and
    the reward-hacking watch."""
    print_reward_notes(k, r)
    if own := r["reward_model"].get("own_clips"):
        print(
            f"  on the rlhf agent's own {own['segments']} clips: normalised reward where a life is lost "
            f"{own['life_loss_z']:+.2f} ({own['life_losses']} losses), the {LIFE_LOSS_LEAD} steps before "
            f"{own['pre_loss_z']:+.2f} (the median step is 0)"
        )
    w = r["watch"]
    print(
        f"  reward-hacking watch: rlhf's paid (normalised) vs true game return correlation {w['return_corr']:+.2f} "
        f"(mean over its fine-tune), share of its eval steps at the surface "
        f"{100 * w['surface_share']:.1f}%"
    )


def report_seed(sr: SeedRun, results: list[dict[str, Any]], t0: float) -> list[dict[str, dict[str, float]]]:
    """One seed's table, notes, targets, round.png and round.json; returns its rows per round."""
    args = sr.args
    rounds = [r["rows"] for r in results]
    title = f"{args.teacher} teacher, {args.rounds} round(s) of {args.labels} {args.sampling} labels, "
    title += f"v0 {int(args.v0_steps * args.scale):,} steps, fine-tunes {int(args.ft_steps * args.scale):,} "
    title += f"steps from {'v0' if args.start == 'v0' else 'the best of the round before'}"
    title += f", reward model {args.reward_args}" if args.reward_args else ""
    plot(sr.tdir / "round.png", [r["curves"] for r in results], rounds[0]["v0"], title)
    print(f"\n## Rounds: {title}, {args.eval_games} eval games (one seed: {args.seed})\n")
    print(table(rounds) + "\n")
    for k, r in enumerate(results, start=1):
        print_round_notes(k, r)
    checks = targets(args.teacher, rounds) + model_targets(args.teacher, results)
    for what, ok in checks:
        print(f"target: {what}: {'n/a (no such pair)' if ok is None else 'met' if ok else 'MISSED'}")
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rounds": [{key: r[key] for key in ("rows", "reward_model", "evidence", "watch")} for r in results],
        "targets": {what: ok for what, ok in checks},
    }
    atomic_write(sr.tdir / "round.json", json.dumps(report, indent=1).encode())
    print(f"\n{sr.tdir / 'round.png'}, {sr.tdir / 'round.json'} ({(time.time() - t0) / 60:.1f} min so far)")
    return rounds


def report_seeds(args: argparse.Namespace, per_seed: list[list[dict[str, dict[str, float]]]]) -> None:
    """The rows averaged over the seeds (each ``±``: the 95% interval across seeds) and the targets."""
    rows = across_seeds(per_seed)
    seeds = ",".join(map(str, args.seeds))
    print(
        f"\n## {args.teacher} teacher, seeds {seeds}: means over {len(per_seed)} seeds (± 95% interval across them)\n"
    )
    print(table(rows) + "\n")
    checks = targets(args.teacher, rows)
    for what, ok in checks:
        print(f"target (mean of the seeds): {what}: {'met' if ok else 'MISSED'}")
    path = args.out / f"{round_name(args)}.json"
    report = {"seeds": args.seeds, "rounds": rows, "targets": {what: ok for what, ok in checks}}
    atomic_write(path, json.dumps(report, indent=1).encode())
    print(f"\n{path}")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    check(args)
    t0 = time.time()
    per_seed = []
    for seed in args.seeds:
        sr = run_v0(seed_args(args, seed))
        if args.live:
            per_seed.append(report_live(sr, run_live(sr), t0))
            continue
        if args.reward_only:  # the inner loop: round 1's labels and reward model, no fine-tune
            reward, figures = reward_round(sr, 1)
            print(f"\n## seed {seed}: {round_name(sr.args)}, reward model {reward}\n")
            print_reward_notes(1, figures)
            continue
        results = [run_round(sr, k) for k in range(1, args.rounds + 1)]
        per_seed.append(report_seed(sr, results, t0))
    if len(args.seeds) > 1 and not args.reward_only and not args.live:
        report_seeds(args, per_seed)


def cli() -> None:
    try:
        with SignalStop(at_once=True, signals=PARENT_SIGNALS):  # SIGTERM and SIGHUP: the Ctrl-C path
            run_cli(main)
    except KeyboardInterrupt:
        print("\ninterrupted: every finished stage is kept; run the same command to continue", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
