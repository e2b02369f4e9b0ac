"""Which pairs should a person be asked about? Learning curves of the reward model for each
``--sampling`` mode of the label page, with a synthetic teacher as the labeler.

For each teacher and seed, on one recorded DB (by default the round benchmark's, ``runs/round/seed0/db``,
with its held-out split):

1. the teacher labels the first --steps[0] pairs at random (no model exists yet) and a reward
   model is trained on them (``03_reward_train.py --ensemble K``, the same K for every mode);
2. for each mode (random, uncertain, disagree): the teacher labels the next pairs the way the
   page would offer them to a person (``02_label_ui.py --oracle --sampling MODE --reward``, the
   latest model of that mode), a model is trained on all labels so far, and so on to the last
   step;
3. every model is scored on the held-out segments it never saw: agreement with the teacher on
   every held-out pair it prefers one of, agreement with the score, per-step correlation.

Prints one table (mean over seeds), writes ``sampling.json`` and ``sampling.png`` (held-out
agreement against labels, one line per mode, one panel per teacher) under --out. Models and
labels are kept and reused when the command runs again.

    python -m experiments.sampling                              # the round's DB, both teachers, 1 seed
    python -m experiments.sampling --db DB --teachers score --steps 100,200,300 --seeds 0,1,2
    python -m experiments.sampling ... -- --arch book   # arguments after -- go to 03_reward_train.py
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.flags import at_least_one, dev_setting
from experiments.readouts import held_out_figures
from experiments.stages import log, run_stage, split_db, teacher_db
from lib.atari.seaquest import OXYGEN_GAMES
from lib.core.errors import UserError, run_cli
from lib.core.files import atomic_write
from lib.core.settings import Check, check_between, check_fields, setting
from lib.core.settings import build_parser as settings_parser
from lib.core.table import print_table
from lib.label_ui.oracle import OracleSettings, oracle_label_db
from lib.models.teachers import TEACHERS
from lib.store.labels import LABELS_FILE, check_relpath, load_labels
from lib.store.segments import db_game

ROOT = Path(__file__).resolve().parents[1]

MODES = ("random", "uncertain", "disagree")


def csv(text: str, cast: Callable[[str], Any] = str) -> list[Any] | None:
    """A comma-separated list ("100,200,300") as its items, each made by ``cast``; None where one is
    not (an int flag given "1,x")."""
    try:
        return [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        return None


def _csv_checks(flag: str, cast: Callable[[str], Any] = str) -> list[Check]:
    """A comma-separated list flag's own checks: every item a ``cast``, at least one item."""
    return [
        (lambda v: csv(v, cast) is not None, f"{flag}: expected a comma-separated list, got {{v!r}}"),
        (lambda v: bool(csv(v, cast)), f"{flag} is empty"),
    ]


def _increasing(text: str) -> bool:
    steps = csv(text, int) or [0]
    return steps == sorted(set(steps)) and steps[0] >= 1


GROUPS = {  # --help's groups, in order, and their titles
    "db": "the DB and its held-out split",
    "curves": "the curves: teachers, modes, label counts, seeds",
    "run": "where it runs and what it keeps",
}


@dataclass(frozen=True)
class SamplingSettings:
    """What ``python -m experiments.sampling`` is told, one field per flag in ``--help`` order."""

    db: Path = setting(ROOT / "runs" / "round" / "seed0" / "db", "a segment DB with true rewards", group="db")
    split: Path | None = setting(
        None,
        "held-out / labelable split (JSON); default: DB/../split.json when it exists (the round's), "
        "else made with --holdout and kept in --out",
        group="db",
        type=Path,
    )
    holdout: float = setting(0.2, "share of the DB's segments never labeled", group="db")
    teachers: str = setting(
        "score,oxygen",
        "comma-separated teachers (lib/models/teachers.py)",
        group="curves",
        checks=[
            *_csv_checks("--teachers"),
            (lambda v: all(t in TEACHERS for t in csv(v) or []), f"--teachers must be among {', '.join(TEACHERS)}"),
        ],
    )
    modes: str = setting(
        ",".join(MODES),
        "comma-separated sampling modes",
        group="curves",
        checks=[
            *_csv_checks("--modes"),
            (lambda v: all(m in MODES for m in csv(v) or []), f"--modes must be among {', '.join(MODES)}"),
        ],
    )
    steps: str = setting(
        "100,200,300",
        "label counts at which a model is trained and scored",
        group="curves",
        checks=[*_csv_checks("--steps", int), (_increasing, "--steps must be increasing label counts")],
    )
    seeds: str = setting(
        "0", "comma-separated seeds (labels, training)", group="curves", checks=_csv_checks("--seeds", int)
    )
    ensemble: int = setting(
        3,
        "members of every reward model (disagree needs >= 2)",
        group="curves",
        checks=at_least_one("--ensemble must be at least 1"),
    )
    pool: int | None = setting(
        None, "candidate pairs per pick (default 10x the pairs picked)", group="curves", type=int
    )
    out: Path = setting(ROOT / "runs" / "sampling", "where labels and models are kept", group="run")
    dev: str = dev_setting("torch device of training and scoring", group="run")
    train_args: list[str] = setting(
        [], "after --: extra arguments of 03_reward_train.py", group="run", positional=True, nargs="*"
    )


def build_parser() -> argparse.ArgumentParser:
    """The flags in groups (``--help``), one per ``SamplingSettings`` field."""
    return settings_parser(
        SamplingSettings,
        "python -m experiments.sampling",
        "Reward-model learning curves for each --sampling mode, labeled by synthetic teachers.",
        GROUPS,
    )


def train_step_model(tdb: Path, out_dir: Path, name: str, seed: int, args: SamplingSettings) -> Path:
    """One step's reward model: ``03_reward_train.py`` on ``tdb``'s labels; reused when it is there."""
    path = out_dir / f"reward-{name}.pt"
    if path.exists():
        return path
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", name, "-o", str(out_dir), "--dev", args.dev]
    cmd += ["--seed", str(seed), "--ensemble", str(args.ensemble), "--runs-dir", str(args.out / "tb")]
    cmd += ["--no-progress", *args.train_args, str(tdb)]
    run_stage(f"reward {name}", cmd, args.out / "logs" / f"reward-{name}.log")
    return path


def grow(db: Path, tdb: Path, train_segs: list[str], parent: Path | None) -> None:
    """A DB of the labelable segments (hard links) holding the parent step's labels."""
    teacher_db(db, tdb, train_segs)
    if parent is not None and not (tdb / LABELS_FILE).exists():
        shutil.copyfile(parent / LABELS_FILE, tdb / LABELS_FILE)


def curve(
    db: Path,
    split: dict[str, list[str]],
    teacher: str,
    mode: str,
    seed: int,
    steps: list[int],
    args: SamplingSettings,
) -> list[dict[str, float]]:
    """Labels and models of one (teacher, mode, seed); the first step is shared by every mode."""
    base = args.out / f"{teacher}-s{seed}"
    points: list[dict[str, float]] = []
    parent_db: Path | None = None
    model: Path | None = None
    for k, n in enumerate(steps):
        name = f"{teacher}-s{seed}-{n}" if k == 0 else f"{teacher}-s{seed}-{mode}-{n}"
        tdb = base / (f"first-{n}" if k == 0 else f"{mode}-{n}") / "db"
        grow(db, tdb, split["train"], parent_db)
        have = len(load_labels(tdb, warn=None))
        if have < n:
            how = "random" if k == 0 else mode
            s = oracle_label_db(
                tdb,
                n - have,
                seed=seed * 1000 + n,
                settings=OracleSettings(
                    teacher=teacher, sampling=how, reward=model if how != "random" else None, pool=args.pool
                ),
            )
            log(f"{name}: {s.labeled} {how} labels from the {teacher} teacher: {s.counts}")
        model = train_step_model(tdb, tdb.parent, name, seed, args)
        fig_path = tdb.parent / "heldout.json"
        if fig_path.exists():
            figs = json.loads(fig_path.read_text())
        else:
            figs = held_out_figures(db, split["holdout"], model, teacher, args.dev)
            atomic_write(fig_path, json.dumps(figs).encode())
        points.append({"labels": n, **figs})
        parent_db = tdb
    return points


def plot(path: Path, results: dict[str, dict[str, dict[int, list[dict[str, float]]]]], steps: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    teachers = list(results)
    fig, axes = plt.subplots(1, len(teachers), figsize=(5.5 * len(teachers), 4), squeeze=False)
    for ax, teacher in zip(axes[0], teachers, strict=True):
        for mode, by_seed in results[teacher].items():
            ys = np.array([[p["teacher_agreement"] * 100 for p in pts] for pts in by_seed.values()])
            mean = ys.mean(0)
            ax.plot(steps, mean, marker="o", label=f"{mode} ({len(ys)} seed{'s' if len(ys) > 1 else ''})")
            if len(ys) > 1:
                ax.fill_between(steps, ys.min(0), ys.max(0), alpha=0.15)
        ax.set_title(f"{teacher} teacher")
        ax.set_xlabel("labels")
        ax.set_ylabel("held-out agreement with the teacher (%)")
        ax.set_xticks(steps)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def read_split(args: SamplingSettings) -> dict[str, list[str]] | None:
    """--split, else the round's split.json beside the DB; None when neither exists."""
    path = args.split or (args.db.parent / "split.json")
    if not path.exists():
        if args.split is not None:
            raise UserError(f"--split {path}: no such file")
        return None
    try:
        split = json.loads(path.read_text())
        ok = all(isinstance(split.get(k), list) and split[k] for k in ("holdout", "train"))
        split = {k: [check_relpath(rel) for rel in split[k]] for k in ("holdout", "train")} if ok else None
    except (ValueError, TypeError, UnicodeDecodeError, AttributeError):
        ok = False
    if not ok:
        raise UserError(f"{path} is not a split (JSON with non-empty 'holdout' and 'train' lists of DB paths)")
    return split


def main(argv: list[str] | None = None) -> None:
    args = SamplingSettings(**vars(build_parser().parse_args(argv)))
    check_fields(args)
    teachers, modes, steps, seeds = csv(args.teachers), csv(args.modes), csv(args.steps, int), csv(args.seeds, int)
    assert teachers and modes and steps and seeds  # check_fields: each a non-empty list
    check_between(
        [
            (
                not args.db.is_dir(),
                f"--db {args.db}: not a DB directory (run experiments/round.py first, or pass --db)",
            ),
            ("disagree" in modes and args.ensemble < 2, "--modes disagree needs --ensemble 2 or more"),
        ]
    )
    game = (db_game(args.db) or (None, None))[0]
    if "oxygen" in teachers and game not in OXYGEN_GAMES:
        teachers = [t for t in teachers if t != "oxygen"]
        log(f"oxygen teacher left out: {args.db} holds {game or 'an unknown game'}, not SeaQuest")
        if not teachers:
            raise UserError("no teacher can label this DB")
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    split = read_split(args) or split_db(args.db, args.out, args.holdout, 0)
    results: dict[str, dict[str, dict[int, list[dict[str, float]]]]] = {}
    for teacher in teachers:
        for seed in seeds:
            for mode in modes:
                pts = curve(args.db, split, teacher, mode, seed, steps, args)
                results.setdefault(teacher, {}).setdefault(mode, {})[seed] = pts

    rows = []
    for teacher, by_mode in results.items():
        for mode, by_seed in by_mode.items():
            for k, n in enumerate(steps):
                pts = [by_seed[s][k] for s in seeds]
                agree = [100 * p["teacher_agreement"] for p in pts]
                spread = f" (seeds {min(agree):.1f}-{max(agree):.1f})" if len(pts) > 1 else ""
                setting = f"{mode}, {n} labels, {len(pts)} seed(s){spread}"
                rows.append((f"{teacher}: held-out teacher agreement", f"{np.mean(agree):.1f}", "%", setting))
                score_agree = [100 * p["score_agreement"] for p in pts]
                rows.append((f"{teacher}: held-out score agreement", f"{np.mean(score_agree):.1f}", "%", setting))
                corr = [p["step_corr_heldout"] for p in pts]
                ok = [c for c in corr if not math.isnan(c)]
                rows.append(
                    (f"{teacher}: per-step correlation", f"{np.mean(ok):+.3f}" if ok else "n/a", "Pearson r", setting)
                )
    segs = len(split["holdout"])
    title = f"bench_sampling ({args.db}, {segs} held-out segments, ensemble {args.ensemble})"
    print_table(title, rows)
    plot(args.out / "sampling.png", results, steps)
    report = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "results": {t: {m: {str(s): p for s, p in bs.items()} for m, bs in bm.items()} for t, bm in results.items()},
    }
    atomic_write(args.out / "sampling.json", json.dumps(report, indent=1).encode())
    print(f"\n{args.out / 'sampling.png'}, {args.out / 'sampling.json'} ({(time.time() - t0) / 60:.1f} min)")


if __name__ == "__main__":
    run_cli(main)
