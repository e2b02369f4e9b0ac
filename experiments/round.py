#!/usr/bin/env python3
"""Does a round of labels change what the agent does? A whole round with no person, one command.

1. v0: A2C from scratch for --v0-steps, recording a segment DB (``01_a2c.py --db-path``);
2. --holdout of the DB's segments are set aside; a synthetic teacher (``lib/teachers.py``)
   labels --labels random pairs of the others (``02_label_ui.py --oracle``'s code);
3. a reward model with stage 3's defaults (``03_reward_train.py``), scored on the held-out
   segments: agreement with the teacher over every held-out pair it prefers one of, per-step
   correlation of predicted and true reward;
4. arm ``rlhf``: v0's best policy fine-tuned on the reward model (``-r --finetune``) for
   --ft-steps; arm ``control``: the same policy fine-tuned on the true score, same steps and
   settings (shared by every teacher of the same --out);
5. v0, control and rlhf each play --eval-games full games with the same seeds.

Prints one table (rows v0, control, rlhf: score with a 95% interval, length, refills per game,
lives lost, the share lost to oxygen) with the reward model's figures, says which of the issue's
targets hold, and writes ``round.png`` (eval score and behaviour against fine-tune steps, both
arms) and ``round.json`` under ``--out/<teacher>-<labels>``. Every stage's output is kept under
--out and reused when the command runs again: a stopped run continues where it stopped.

    python -m experiments.round --teacher oxygen            # CPU defaults: ~1M + 2 x 500k steps
    python -m experiments.round --teacher score
    python -m experiments.round --scale 10 --dev cuda       # a 10M-step v0 on a GPU
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from lib.errors import UserError, run_cli
from lib.files import atomic_write
from lib.labels import FIRST_BETTER, SECOND_BETTER, load_labels
from lib.model import BEST_GLOB, best_checkpoint, read_checkpoint
from lib.oracle import oracle_label_db
from lib.play import play
from lib.reward_eval import oracle_agreement, predict_segments, score
from lib.reward_model import load_reward_model
from lib.reward_wrapper import normalised
from lib.segments import DB_INFO_FILE, SegmentError, db_game, list_segments, read_segment
from lib.teachers import RULE_FACTS, TEACHERS, Teacher, segment_facts

ROOT = Path(__file__).resolve().parents[1]

ARMS = ("v0", "control", "rlhf")
ROUND_MODES = ("random", "uncertain", "disagree")  # lib.sampling's modes that need no fine-tuning DB
CURVE_TAGS = ("eval/score_mean", "eval/refills_per_game", "eval/oxygen_death_share")
V0_EVALS = 10  # evaluations during v0: its best checkpoint is the policy both arms start from
EVAL_SEED = 20_000  # the evaluation games of every arm: apart from training and in-run eval seeds
Z95 = 1.96  # normal approximation of the 95% interval of a mean


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
    p.add_argument("--seed", type=int, default=0, help="seed of v0, the split, the labels and the fine-tunes")
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
        default="random",
        help="which pairs the teacher labels (02_label_ui.py --sampling): random, or the first third at random "
        "and each further third picked by a reward model trained on the labels so far",
    )
    p.add_argument(
        "--reward-args",
        default="",
        metavar='"FLAGS"',
        help='03_reward_train.py flags for every reward model of the round, e.g. "--ensemble 3" (disagree '
        "needs an ensemble); they name the round's directory, so that rounds with other flags never share one",
    )
    p.add_argument("--evals", type=int, default=5, help="evaluations during each fine-tune (the round.png curve)")
    p.add_argument("--test-episodes", type=int, default=10, help="games per evaluation during training")
    return p


MAX_SCALE = 1000.0
MAX_SEED = 2**31 - 1  # the games' seeds (ALE takes 32-bit seeds; each env adds its index)


def check(args: argparse.Namespace) -> None:
    """Every bad value is one line (UserError) before anything runs."""
    try:
        shlex.split(args.reward_args)
    except ValueError as e:
        raise UserError(f"--reward-args cannot be split into flags ({e}): {args.reward_args!r}") from None
    if not (math.isfinite(args.scale) and 0 < args.scale <= MAX_SCALE):
        raise UserError(f"--scale must be a number in (0, {MAX_SCALE:g}], got {args.scale}")
    if min(int(args.v0_steps * args.scale), int(args.ft_steps * args.scale)) < 1:
        raise UserError(
            f"--scale {args.scale:g} leaves less than one agent step of --v0-steps {args.v0_steps} or "
            f"--ft-steps {args.ft_steps}: give a larger --scale"
        )
    if not 0 <= args.seed <= MAX_SEED:
        raise UserError(f"--seed must be in 0..{MAX_SEED}, got {args.seed}")
    wrong = [
        (args.labels < 1, f"--labels must be at least 1, got {args.labels}"),
        (args.v0_steps < 1 or args.ft_steps < 1, "--v0-steps and --ft-steps must be at least 1"),
        (args.eval_games < 1, f"--eval-games must be at least 1, got {args.eval_games}"),
        (not args.scale > 0, f"--scale must be positive, got {args.scale}"),
        (not 0 <= args.teacher_noise <= 1, f"--teacher-noise must be in [0, 1], got {args.teacher_noise}"),
        (not 0 < args.holdout < 1, f"--holdout must be in (0, 1), got {args.holdout}"),
        (not 0 < args.record_prob <= 1, f"--record-prob must be in (0, 1], got {args.record_prob}"),
        (args.evals < 1 or args.test_episodes < 1, "--evals and --test-episodes must be at least 1"),
        (args.sampling != "random" and args.labels < 3, "--sampling needs --labels 3 or more (labeled in thirds)"),
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
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            f.write(line)
            f.flush()
            print(f"  [{name}] {line}", end="", flush=True)
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


def train_a2c(name: str, save_dir: Path, steps: int, evals: int, args: argparse.Namespace, extra: list[str]) -> None:
    """``01_a2c.py`` for ``steps`` with ``evals`` evaluations: skipped when done, continued
    (--resume) when stopped."""
    done = a2c_progress(save_dir)
    if done is not None and done >= steps:
        log(f"{name}: done ({done:,} steps in {save_dir}), reused")
        return
    test_every = max(steps // evals, 1)
    cmd = [sys.executable, str(ROOT / "01_a2c.py"), "-n", name, "--save", str(save_dir), "--dev", args.dev]
    cmd += ["--max-steps", str(steps), "--seed", str(args.seed), "--runs-dir", str(args.out / "tb")]
    cmd += ["--test-every", str(test_every), "--test-episodes", str(args.test_episodes)]
    if done is not None:  # stopped part-way: continue from last.pt (its policy, not -m's)
        cmd += ["--resume", *_drop_flag_value(extra, "-m")]
    else:
        cmd += ["--force", *extra]
    run_stage(name, cmd, args.out / "logs" / f"{name}.log")
    reached = a2c_progress(save_dir) or 0
    if reached < steps:  # Ctrl-C reached the child too: it saved last.pt and ended cleanly
        raise UserError(f"{name} stopped at step {reached:,} of {steps:,}: run the same command to continue")


def _drop_flag_value(cmd: list[str], flag: str) -> list[str]:
    """``cmd`` without ``flag`` and the value after it."""
    out, skip = [], False
    for x in cmd:
        if skip:
            skip = False
            continue
        if x == flag:
            skip = True
            continue
        out.append(x)
    return out


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


def round_dir(args: argparse.Namespace) -> Path:
    """The teacher's directory under --out: teacher, labels, and whatever else makes its labels or
    model differ (noise, a sampling mode, --reward-args)."""
    name = f"{args.teacher}-{args.labels}"
    name += f"-noise{args.teacher_noise:g}" if args.teacher_noise else ""
    name += f"-{args.sampling}" if args.sampling != "random" else ""
    flags = re.sub(r"[^A-Za-z0-9.]+", "", args.reward_args)
    return args.out / (name + (f"-{flags}" if flags else ""))


def label_steps(n: int, sampling: str) -> list[int]:
    """Label counts at which a model is trained before the next pick: all at once at random, else
    thirds (the first at random: no model exists yet)."""
    return [n] if sampling == "random" else sorted({n // 3, 2 * n // 3, n})


def label(tdb: Path, args: argparse.Namespace, upto: int | None = None, reward: Path | None = None) -> None:
    """The teacher labels ``tdb`` up to ``upto`` (default --labels) pairs: at random, or picked by
    --sampling with ``reward``, as the label page would offer them."""
    upto = args.labels if upto is None else upto
    have = len(load_labels(tdb, warn=None))
    if have >= upto:
        log(f"labels: {have} in {tdb}, reused")
        return
    how = args.sampling if reward is not None else "random"
    s = oracle_label_db(
        tdb,
        upto - have,
        seed=args.seed if args.sampling == "random" else args.seed * 1000 + upto,  # random: as before --sampling
        teacher=args.teacher,
        noise=args.teacher_noise,
        sampling=how,
        reward=reward,
    )
    log(f"labels: {s.labeled} {how} pairs from the {args.teacher} teacher in {s.seconds:.0f} s: {s.counts}")


def label_and_train(tdb: Path, tdir: Path, args: argparse.Namespace) -> Path:
    """Labels and the round's reward model. With a model-picked --sampling, a model trained on the
    first third picks the second third, a model of both the last; only the final one is the round's."""
    model: Path | None = None
    steps = label_steps(args.labels, args.sampling)
    for n in steps:
        label(tdb, args, n, model)
        model = train_reward(tdb, tdir, args, "round" if n == steps[-1] else f"round-{n}")
    assert model is not None
    return model


def train_reward(tdb: Path, tdir: Path, args: argparse.Namespace, name: str = "round") -> Path:
    path = tdir / f"reward-{name}.pt"
    if path.exists():
        log(f"reward model: {path}, reused")
        return path
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", name, "-o", str(tdir), "--dev", args.dev]
    cmd += ["--seed", str(args.seed), "--runs-dir", str(args.out / "tb"), "--no-progress"]
    cmd += [*shlex.split(args.reward_args), str(tdb)]
    run_stage("reward", cmd, args.out / "logs" / f"reward-{tdir.name}-{name}.log")
    return path


# --- figures ------------------------------------------------------------------------------------


def held_out_figures(db: Path, holdout: list[str], reward: Path, teacher: str, dev: str) -> dict[str, float]:
    """The reward model on segments it never saw: agreement with the teacher over every held-out
    pair the teacher prefers one of (a predicted tie counts as wrong), and ``--evaluate``'s
    figures against the score (agreement, per-step correlation); and what the model pays where a
    life is lost (``life_loss_rewards``)."""
    rm = load_reward_model(reward, device=dev)
    preds = predict_segments(rm, db, holdout)
    vs_score = score(preds)
    game = (db_game(db) or (None, None))[0]
    facts, lost = [], []
    for rel in preds.names:
        seg = read_segment(db, rel)
        facts.append(segment_facts(seg.frames, seg.rewards, seg.dones, game))
        lost.append(np.zeros(len(seg.frames), dtype=bool) if seg.dones is None else np.asarray(seg.dones, dtype=bool))
    judge = Teacher(teacher)
    i, j = np.triu_indices(len(facts), k=1)
    verdicts = np.array([judge.judge(facts[a], facts[b]) for a, b in zip(i, j, strict=True)])
    # The teacher's preference as a pair of "true returns", so that oracle_agreement's one rule
    # applies: (1, 0) when #1 is preferred, (0, 1) for #2, NaN (left out) for ties and can't tell.
    t1 = np.where(verdicts == FIRST_BETTER, 1.0, np.where(verdicts == SECOND_BETTER, 0.0, math.nan))
    agree, n = oracle_agreement(preds.pred_returns[i], preds.pred_returns[j], t1, 1.0 - t1)
    return {
        "teacher_agreement": agree,
        "teacher_pairs": n,
        "score_agreement": vs_score.agreement,
        "score_pairs": vs_score.pairs,
        "step_corr_heldout": vs_score.step_corr,
        "heldout_segments": vs_score.segments,
        **life_loss_rewards(preds.pred_steps, np.concatenate(lost) if lost else np.zeros(0, dtype=bool)),
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


EVIDENCE_KEY = {"oxygen_deaths": "by_oxygen_death", "refills": "by_refill", "returns": "by_score"}


def teacher_evidence(db: Path, tdb: Path, train: list[str], teacher: str) -> dict[str, int]:
    """What the teacher had to go on: how its labels were decided (by the teacher's own rule: the
    score teacher decides every label by the score), and how many of the labelable segments show a
    voluntary refill or an oxygen death at all (SeaQuest)."""
    ev = {"labels": 0, "by_oxygen_death": 0, "by_refill": 0, "by_score": 0, "ties": 0, "cant_tell": 0}
    for lab in load_labels(tdb, warn=None).values():
        ev["labels"] += 1
        if lab.label not in (FIRST_BETTER, SECOND_BETTER):
            ev["ties" if lab.label == 0 else "cant_tell"] += 1
            continue
        for fact in RULE_FACTS[teacher]:
            values = lab.extra.get(fact)
            if isinstance(values, list) and len(values) == 2 and values[0] != values[1]:
                ev[EVIDENCE_KEY[fact]] += 1
                break
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
    """--eval-games full games with EVAL_SEED (the same games for every arm); kept in ``cache``."""
    if cache.exists():
        d = json.loads(cache.read_text())
        if d.get("policy") == str(policy) and d.get("games") == args.eval_games:
            return d
    log(f"evaluating {policy}: {args.eval_games} games")
    results = play(policy, episodes=args.eval_games, device=args.dev, seed=EVAL_SEED, log=lambda m: None)
    d = {
        "policy": str(policy),
        "games": args.eval_games,
        "scores": [r.score for r in results],
        "lengths": [r.steps for r in results],
        "refills": [r.oxygen.refills if r.oxygen else None for r in results],
        "deaths": [r.oxygen.deaths if r.oxygen else None for r in results],
        "oxygen_deaths": [r.oxygen.oxygen_deaths if r.oxygen else None for r in results],
    }
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(cache, json.dumps(d).encode())
    return d


def summarise(d: dict[str, Any]) -> dict[str, float]:
    scores = np.array(d["scores"], dtype=np.float64)
    half = Z95 * scores.std(ddof=1) / math.sqrt(len(scores)) if len(scores) > 1 else math.nan
    out = {"score": float(scores.mean()), "score_ci": half, "length": float(np.mean(d["lengths"]))}
    if all(v is not None for v in d["refills"]):
        deaths = sum(d["deaths"])
        out["refills"] = float(np.mean(d["refills"]))
        out["deaths"] = float(np.mean(d["deaths"]))
        out["oxygen_deaths"] = float(np.mean(d["oxygen_deaths"]))
        out["oxygen_share"] = sum(d["oxygen_deaths"]) / deaths if deaths else 0.0
    return out


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


def plot(path: Path, curves: dict[str, dict[str, tuple[list[int], list[float]]]], v0: dict[str, float], title: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("eval/score_mean", "score", "mean eval score")]
    if "refills" in v0:
        panels += [
            ("eval/refills_per_game", "refills", "voluntary refills per game"),
            ("eval/oxygen_death_share", "oxygen_share", "share of lives lost to oxygen"),
        ]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (tag, key, label) in zip(axes[0], panels, strict=True):
        for arm, style in (("control", "tab:grey"), ("rlhf", "tab:blue")):
            steps, values = curves[arm].get(tag, ([], []))
            ax.plot([0, *steps], [v0[key], *values], marker="o", color=style, label=arm)
        ax.axhline(v0[key], color="black", linestyle=":", linewidth=1, label="v0")
        ax.set_xlabel("fine-tune agent steps")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def table(rows: dict[str, dict[str, float]]) -> str:
    head = "| arm | score (95% CI) | length | refills/game | lives lost/game | lost to oxygen |"
    lines = [head, "|---|---:|---:|---:|---:|---:|"]
    for arm in ARMS:
        r = rows[arm]
        ox = (
            f"{r['refills']:.2f} | {r['deaths']:.2f} | {100 * r['oxygen_share']:.0f}%"
            if "refills" in r
            else "n/a | n/a | n/a"
        )
        lines.append(f"| {arm} | {r['score']:.0f} ± {r['score_ci']:.0f} | {r['length']:.0f} | {ox} |")
    return "\n".join(lines)


def targets(teacher: str, rows: dict[str, dict[str, float]]) -> list[tuple[str, bool]]:
    """The issue's targets for this teacher, each with whether it held."""
    rl, ctl, v0 = rows["rlhf"], rows["control"], rows["v0"]
    if teacher == "score":
        return [("rlhf scores at least 0.9x control", rl["score"] >= 0.9 * ctl["score"])]
    return [
        ("rlhf refills at least once per game", rl["refills"] >= 1.0),
        ("rlhf refills at least 3x as often as control", rl["refills"] >= 3 * ctl["refills"] and rl["refills"] > 0),
        ("rlhf loses at most half as many lives to oxygen", rl["oxygen_deaths"] <= 0.5 * ctl["oxygen_deaths"]),
        ("rlhf scores no less than v0", rl["score"] >= v0["score"]),
    ]


# --- the round ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    check(args)
    t0 = time.time()
    out: Path = args.out
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {out}: {e.strerror or e}") from None
    v0_steps, ft_steps = int(args.v0_steps * args.scale), int(args.ft_steps * args.scale)
    db = out / "db"
    tdir = round_dir(args)
    tdir.mkdir(parents=True, exist_ok=True)

    # 1. v0 and its DB
    train_a2c(
        "round-v0", out / "v0", v0_steps, V0_EVALS, args, ["--db-path", str(db), "--record-prob", str(args.record_prob)]
    )
    v0_policy = best_policy(out / "v0")
    # 2. labels on the segments that are not held out
    split = split_db(db, out, args.holdout, args.seed)
    tdb = tdir / "db"
    teacher_db(db, tdb, split["train"])
    # 3. the reward model (with --sampling, the models that picked pairs first), on never-seen segments
    reward = label_and_train(tdb, tdir, args)
    fig_path = tdir / "reward_heldout.json"
    if fig_path.exists():
        rm_figs = json.loads(fig_path.read_text())
    else:
        rm_figs = held_out_figures(db, split["holdout"], reward, args.teacher, args.dev)
        atomic_write(fig_path, json.dumps(rm_figs).encode())
    # 4. the two arms from the same policy
    ft = ["-m", str(v0_policy), "--finetune"]
    train_a2c("round-control", out / "control", ft_steps, args.evals, args, ft)
    rlhf_name = f"round-rlhf-{tdir.name}"
    train_a2c(rlhf_name, tdir / "rlhf", ft_steps, args.evals, args, [*ft, "-r", str(reward)])
    # 5. the same games for all three
    policies = {"v0": v0_policy, "control": out / "control" / "last.pt", "rlhf": tdir / "rlhf" / "last.pt"}
    caches = {"v0": out / "eval" / "v0.json", "control": out / "eval" / "control.json", "rlhf": tdir / "eval.json"}
    rows = {arm: summarise(evaluate_arm(policies[arm], caches[arm], args)) for arm in ARMS}
    _, corr = tb_scalars(out / "tb", rlhf_name, "reward_model/step_corr")
    rm_figs["step_corr_finetune"] = float(np.mean(corr)) if corr else math.nan

    curves = {
        arm: {
            tag: tb_scalars(out / "tb", name, tag)
            for tag in ("eval/score_mean", "eval/refills_per_game", "eval/oxygen_death_share")
        }
        for arm, name in (("control", "round-control"), ("rlhf", rlhf_name))
    }
    title = f"{args.teacher} teacher, {args.labels} {args.sampling} labels, v0 {v0_steps:,} steps, "
    title += f"fine-tune {ft_steps:,} steps"
    title += f", reward model {args.reward_args}" if args.reward_args else ""
    plot(tdir / "round.png", curves, rows["v0"], title)

    print(f"\n## Round: {title}, {args.eval_games} eval games (seed {args.seed})\n")
    print(table(rows))
    print(
        f"\nreward model on {rm_figs['heldout_segments']} never-seen segments: "
        f"{100 * rm_figs['teacher_agreement']:.1f}% agreement with the teacher ({rm_figs['teacher_pairs']} pairs), "
        f"{100 * rm_figs['score_agreement']:.1f}% with the score; per-step correlation with the true reward "
        f"{rm_figs['step_corr_heldout']:+.2f} (held out), "
        f"{rm_figs['step_corr_finetune']:+.2f} (during the rlhf fine-tune)"
    )
    ev_path = tdir / "evidence.json"
    if ev_path.exists():
        ev = json.loads(ev_path.read_text())
    else:
        ev = teacher_evidence(db, tdb, split["train"], args.teacher)
        atomic_write(ev_path, json.dumps(ev).encode())
    print(
        f"the teacher's {ev['labels']} labels: {ev['by_oxygen_death']} decided by an oxygen death, "
        f"{ev['by_refill']} by a refill, {ev['by_score']} by the score, {ev['ties']} ties, "
        f"{ev['cant_tell']} can't tell; of the {ev['segments']} labelable segments {ev['with_refill']} show a "
        f"voluntary refill and {ev['with_oxygen_death']} an oxygen death ({ev['lives_lost']} lives lost)"
    )
    checks = targets(args.teacher, rows)
    for what, ok in checks:
        print(f"target: {what}: {'met' if ok else 'MISSED'}")
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "v0_steps": v0_steps,
        "ft_steps": ft_steps,
        "rows": rows,
        "reward_model": rm_figs,
        "teacher_evidence": ev,
        "targets": {what: ok for what, ok in checks},
    }
    atomic_write(tdir / "round.json", json.dumps(report, indent=1).encode())
    print(f"\n{tdir / 'round.png'}, {tdir / 'round.json'} ({(time.time() - t0) / 60:.1f} min)")


def cli() -> None:
    try:
        run_cli(main)
    except KeyboardInterrupt:
        print("\ninterrupted: every finished stage is kept; run the same command to continue", file=sys.stderr)
        raise SystemExit(130) from None


if __name__ == "__main__":
    cli()
