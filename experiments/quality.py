"""Quality benchmark of the reward model: does it order segments it never saw as the teacher does?

For each seed:
1. record a DB with a short A2C run (``01_a2c.py --db-path``), or reuse one with ``--db``;
2. set aside ``--holdout`` of its segments (a split of its own per seed), never trained on;
3. a synthetic teacher (``--teacher``, ``lib/models/teachers.py``) labels ``--labels`` random pairs of the
   other segments;
4. each ``--variant`` (a name and 03_reward_train.py flags, the levers of the ablation) trains on
   exactly these labels, with ``--seed`` set to the seed;
5. every model is scored on ALL held-out pairs the teacher prefers one of (segments the model never
   saw; a predicted tie counts as wrong), against the score (``03_reward_train.py --evaluate``'s
   figures: agreement and per-step correlation with the true reward), and its cost is read from
   the trainer: seconds per labeled pair per epoch and peak memory.

Prints one row per variant and seed, then the ablation table: the mean over seeds (each seed's
value in the setting column). ``--keep DIR`` keeps DBs, labels, models and logs, and a run that
finds a model there already scores it instead of training again.

    python -m experiments.quality                                   # record a DB, diff vs book, seed 0
    python -m experiments.quality --db runs/round/seed0/db --seeds 0,1,2 --variant diff="--arch diff" \\
        --variant book="--arch book"

Targets (a reward model from few labels): at 300 score labels, mean of 3 seeds, at least
90% held-out agreement and a per-step correlation of at least 0.5.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from experiments.flags import RawDescriptionFormatter, dev_setting
from experiments.readouts import LIFE_LOSS_LEAD, held_out_figures
from lib.core.errors import UserError, run_cli
from lib.core.settings import build_parser as settings_parser
from lib.core.settings import check_fields, setting
from lib.core.table import print_table
from lib.label_ui.oracle import OracleSettings, oracle_label_db
from lib.models.reward import load_reward_model
from lib.models.teachers import DEFAULT_TEACHER, TEACHERS
from lib.store.labels import EQUAL, load_labels
from lib.store.segments import list_segments

ROOT = Path(__file__).resolve().parents[1]

DEFAULT_VARIANTS = ("diff=--arch diff", "book=--arch book")
PEAK = re.compile(r"peak memory (\d+) MB")


def record(db: Path, work: Path, steps: int, record_prob: float, seed: int) -> float:
    """Record a DB with a short A2C run; returns its seconds."""
    cmd = [sys.executable, str(ROOT / "01_a2c.py"), "-n", "quality", "--db-path", str(db)]
    cmd += ["--max-steps", str(steps), "--record-prob", str(record_prob), "--test-every", "0"]
    cmd += ["--seed", str(seed), "--save", str(work / "a2c"), "--runs-dir", str(work / "runs")]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


VARIANT_NAME = re.compile(r"[A-Za-z0-9_.+-]+")


def parse_variant(text: str) -> tuple[str, list[str]]:
    """--variant NAME="FLAGS" (checked by its field) -> (NAME, the flags as words)."""
    name, _, flags = text.partition("=")
    return name, shlex.split(flags)


def _is_variant(text: str) -> bool:
    """NAME=FLAGS with a plain name and flags that split into words."""
    name, sep, flags = text.partition("=")
    try:
        shlex.split(flags)
    except ValueError:
        return False
    return bool(sep) and VARIANT_NAME.fullmatch(name) is not None


def _seeds(text: str) -> list[int] | None:
    """--seeds "0,1,2" -> [0, 1, 2]; None where an item is not an integer."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        return None


def split_and_label(db: Path, work: Path, seed: int, args: QualitySettings) -> tuple[Path, list[str], int]:
    """Seed ``seed``'s training DB (a copy of the non-held-out segments, labeled by the teacher)
    and held-out segments; reused from ``work`` when there. Returns (train DB, held out, ties)."""
    segs = list_segments(db)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(segs))
    n_hold = int(round(len(segs) * args.holdout))
    hold = sorted(segs[i] for i in perm[:n_hold])
    train_db = work / f"train-db-s{seed}"
    done = train_db / "labels.jsonl"
    if not done.is_file():
        shutil.rmtree(train_db, ignore_errors=True)
        for i in perm[n_hold:]:
            (train_db / segs[i]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(db / segs[i], train_db / segs[i])
        if (db / "db.json").is_file():
            shutil.copy2(db / "db.json", train_db / "db.json")
        oracle_label_db(train_db, args.labels, seed=seed, settings=OracleSettings(teacher=args.teacher))
    ties = sum(1 for lab in load_labels(train_db, warn=None).values() if lab.label == EQUAL)
    return train_db, hold, ties


def train_variant(
    name: str, flags: list[str], train_db: Path, seed: int, work: Path, extra: list[str]
) -> tuple[Path, float, float | None]:
    """Train one variant on one seed's labels (or reuse its model): (model, seconds, peak MB)."""
    out = work / "saves"
    path = out / f"reward-{name}-s{seed}.pt"
    cost = work / "logs" / f"{name}-s{seed}.json"
    if path.is_file() and cost.is_file():
        c = json.loads(cost.read_text())
        return path, float(c["seconds"]), c.get("peak_mb")
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "-n", f"{name}-s{seed}", "-o", str(out)]
    cmd += [str(train_db), "--seed", str(seed), "--runs-dir", str(work / "runs"), "--no-progress", *flags, *extra]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    cost.parent.mkdir(parents=True, exist_ok=True)
    (work / "logs" / f"{name}-s{seed}.log").write_text(r.stdout + r.stderr)
    if r.returncode != 0:
        raise UserError(f"training {name} (seed {seed}) failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
    m = PEAK.search(r.stdout)
    peak = float(m.group(1)) if m else None
    cost.write_text(json.dumps({"seconds": dt, "peak_mb": peak}))
    return path, dt, peak


GROUPS = {  # --help's groups, in order, and their titles
    "data": "the DB, the labels and the held-out segments",
    "variants": "the variants compared",
    "run": "where it runs and what it keeps",
}


@dataclass(frozen=True)
class QualitySettings:
    """What ``python -m experiments.quality`` is told, one field per flag in ``--help`` order."""

    db: str | None = setting(None, "reuse this recorded DB instead of recording one (it is not modified)", group="data")
    steps: int = setting(120_000, "agent steps of the recording A2C run", group="data")
    record_prob: float = setting(0.004, "recording probability of that run", group="data")
    labels: int = setting(300, "teacher labels to train on", group="data")
    holdout: float = setting(0.25, "share of segments never trained on", group="data")
    teacher: str = setting(
        DEFAULT_TEACHER, "the synthetic labeler (lib/models/teachers.py)", group="data", choices=TEACHERS
    )
    seeds: str = setting(
        "0",
        "comma-separated seeds: split, labels and training seed",
        group="data",
        checks=[
            (lambda v: _seeds(v) is not None, "--seeds must be comma-separated integers, got {v!r}"),
            (lambda v: bool(_seeds(v)), "--seeds names no seed"),
        ],
    )
    variant: list[str] | None = setting(
        None,
        "a lever to compare: a name and 03_reward_train.py flags (repeatable; default: "
        + ", ".join(DEFAULT_VARIANTS)
        + ")",
        group="variants",
        action="append",
        metavar='NAME="FLAGS"',
        checks=[(_is_variant, '--variant must be NAME="03_reward_train.py flags", got {v!r}')],
    )
    dev: str = dev_setting("torch device of training and scoring", group="run")
    keep: str | None = setting(
        None, "keep the work directory here (DB, labels, models, logs) and reuse what is there", group="run"
    )
    train_args: list[str] = setting(
        [],
        "after --: flags for every variant's training",
        group="variants",
        positional=True,
        nargs=argparse.REMAINDER,
    )


def build_parser() -> argparse.ArgumentParser:
    """The flags in groups (``--help``), one per ``QualitySettings`` field; the description is the
    module docstring, laid out as written."""
    p = settings_parser(QualitySettings, "python -m experiments.quality", __doc__, GROUPS)
    p.formatter_class = RawDescriptionFormatter
    return p


def main() -> int:
    args = QualitySettings(**vars(build_parser().parse_args()))
    check_fields(args)
    extra = [a for a in args.train_args if a != "--"]
    variants = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    seeds = _seeds(args.seeds) or []
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rlhf-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, str, str]] = []
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    splits: dict[int, list[str]] = {}
    try:
        db = Path(args.db) if args.db else work / "db"
        if args.db and not db.is_dir():
            raise UserError(f"DB not found: {db}")
        if not args.db and not list_segments(db, warn=None):
            dt = record(db, work, args.steps, args.record_prob, seeds[0])
            rows.append(("recording run", f"{dt:.0f}", "s", f"01_a2c.py {args.steps:,} steps"))
        for seed in seeds:
            train_db, hold, ties = split_and_label(db, work, seed, args)
            splits[seed] = hold
            rows.append(
                (
                    f"seed {seed}: labels",
                    f"{args.labels}",
                    "pairs",
                    f"{args.teacher} teacher, {ties} ties; {len(hold)} segments held out",
                )
            )
            for name, flags in variants:
                path, dt, peak = train_variant(name, flags, train_db, seed, work, extra)
                fig = held_out_figures(db, hold, path, args.teacher, args.dev)
                m = load_reward_model(path).metrics
                fig.update(seed=seed, seconds=dt, peak_mb=peak, s_per_pair=m.get("s_per_pair"), epoch=m.get("epoch"))
                results[name].append(fig)
                rows.append(
                    (
                        f"seed {seed}: {name}",
                        f"{100 * fig['teacher_agreement']:.1f}",
                        "%",
                        f"{fig['teacher_pairs']} held-out pairs; per-step corr {fig['step_corr_heldout']:+.3f}; "
                        f"{dt:.0f} s",
                    )
                )
        report = {"args": vars(args), "results": results, "holdout": splits}
        (work / "quality.json").write_text(json.dumps(report, indent=1))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print_table(f"quality: {args.labels} {args.teacher} labels, seeds {args.seeds}", rows)
    print_table("ablation (mean over seeds; each seed's value in brackets)", ablation_rows(variants, results))
    return 0


def ablation_rows(
    variants: list[tuple[str, list[str]]], results: dict[str, list[dict[str, Any]]]
) -> list[tuple[str, str, str, str]]:
    def cell(name: str, key: str, scale: float, fmt: str) -> tuple[str, str]:
        vals = [r[key] for r in results[name] if r.get(key) is not None]
        if not vals:
            return "n/a", ""
        each = ", ".join(format(scale * v, fmt) for v in vals)
        return format(scale * float(np.mean(vals)), fmt), f"[{each}]"

    rows = []
    for name, flags in variants:
        setting = " ".join(flags) or "(defaults)"
        v, each = cell(name, "teacher_agreement", 100, ".1f")
        rows.append((f"{name}: held-out agreement", v, "%", f"{setting} {each}"))
        v, each = cell(name, "step_corr_heldout", 1, "+.3f")
        rows.append((f"{name}: per-step corr", v, "Pearson r", each))
        v, each = cell(name, "life_loss_z", 1, "+.2f")
        rows.append((f"{name}: reward on a life loss", v, "std", each))
        v, each = cell(name, "pre_loss_z", 1, "+.2f")
        rows.append((f"{name}: reward before a life loss", v, "std", f"{LIFE_LOSS_LEAD} steps before {each}"))
        v, each = cell(name, "s_per_pair", 1, ".3f")
        rows.append((f"{name}: training cost", v, "s/pair/epoch", each))
        peaks = [r["peak_mb"] for r in results[name] if r.get("peak_mb") is not None]
        rows.append((f"{name}: peak memory", f"{max(peaks):.0f}" if peaks else "n/a", "MB RSS", "max over seeds"))
    return rows


if __name__ == "__main__":
    run_cli(main)
