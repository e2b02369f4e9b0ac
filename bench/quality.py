#!/usr/bin/env python3
"""Quality benchmark of the reward model: does it order segments as the true score does?

1. record a DB with a short A2C run (``01_a2c.py --db-path``), or reuse one with ``--db``;
2. set aside ``--holdout`` of its segments, never trained on;
3. oracle-label ``--labels`` random pairs of the other segments (the higher true return wins);
4. train with ``03_reward_train.py`` (once per ``--inputs`` entry: full and/or half resolution);
5. report the oracle agreement on ALL held-out pairs with different true returns (segments the
   model never saw), next to the agreement on pairs of training-pool segments that no label
   compares, on the trainer's own test split (pairs held out, their segments not), and the
   correlation of predicted with true returns.

    python bench/quality.py [--steps 120000] [--labels 300] [--inputs full,half] [--db DB]

Target: at least 85% agreement on at least 100 held-out pairs. Prints a table: figure | value |
unit | setting.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Set as AbstractSet
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from table import print_table  # noqa: E402  (bench/ is on sys.path when run as a script)

from lib.labels import load_labels, pair_key  # noqa: E402
from lib.oracle import oracle_label_db  # noqa: E402
from lib.reward_eval import Scores, predict_segments, score  # noqa: E402
from lib.reward_model import RewardPredictor, load_reward_model  # noqa: E402
from lib.reward_train import oracle_agreement  # noqa: E402
from lib.segments import list_segments, read_segment  # noqa: E402


def record(db: Path, work: Path, steps: int, record_prob: float, seed: int) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "01_a2c.py"),
        "-n",
        "quality",
        "--db-path",
        str(db),
        "--max-steps",
        str(steps),
        "--record-prob",
        str(record_prob),
        "--test-every",
        "0",
        "--seed",
        str(seed),
        "--save",
        str(work / "a2c"),
        "--runs-dir",
        str(work / "runs"),
    ]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)


def agreement(
    segs: list[str], p: np.ndarray, t: np.ndarray, skip: AbstractSet[tuple[str, str]] = frozenset()
) -> tuple[float, int]:
    """``oracle_agreement`` (the trainer's rule: a predicted tie counts as wrong) over every pair
    of ``segs`` not in ``skip``."""
    pairs = [(i, j) for i, j in itertools.combinations(range(len(segs)), 2) if pair_key(segs[i], segs[j]) not in skip]
    if not pairs:
        return float("nan"), 0
    i, j = np.array(pairs).T
    return oracle_agreement(p[i], p[j], t[i], t[j])


def heldout_agreement(rm: RewardPredictor, db: Path, segs: list[str]) -> Scores:
    """``03_reward_train.py --evaluate``'s figures over the held-out segments ``segs``."""
    return score(predict_segments(rm, db, segs))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", help="reuse this recorded DB instead of recording one (it is not modified)")
    ap.add_argument("--steps", type=int, default=120_000, help="agent steps of the recording A2C run")
    ap.add_argument("--record-prob", type=float, default=0.004, help="recording probability of that run")
    ap.add_argument("--labels", type=int, default=300, help="oracle labels to train on")
    ap.add_argument("--holdout", type=float, default=0.25, help="share of segments never trained on")
    ap.add_argument("--inputs", default="full,half", help="comma-separated --input values to compare")
    ap.add_argument("--seed", type=int, default=0, help="seed of the recording, split and labels")
    ap.add_argument("--keep", help="keep the work directory here (DB, labels, models)")
    ap.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: extra 03_reward_train.py flags")
    args = ap.parse_args()
    extra = [a for a in args.train_args if a != "--"]
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="rlhf-quality-"))
    work.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, str, str]] = []
    try:
        db = Path(args.db) if args.db else work / "db"
        if not args.db:
            t0 = time.perf_counter()
            record(db, work, args.steps, args.record_prob, args.seed)
            rows.append(
                (
                    "recording run",
                    f"{time.perf_counter() - t0:.0f}",
                    "s",
                    f"01_a2c.py {args.steps:,} steps, --record-prob {args.record_prob}",
                )
            )
        segs = list_segments(db)
        rng = np.random.default_rng(args.seed)
        perm = rng.permutation(len(segs))
        n_hold = int(round(len(segs) * args.holdout))
        hold = sorted(segs[i] for i in perm[:n_hold])
        train_db = work / "train-db"
        shutil.rmtree(train_db, ignore_errors=True)
        for i in perm[n_hold:]:
            (train_db / segs[i]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(db / segs[i], train_db / segs[i])
        summary = oracle_label_db(train_db, args.labels, seed=args.seed)
        returns = [read_segment(db, s).true_return for s in segs]
        rows.append(
            (
                "DB",
                f"{len(segs)}",
                "segments",
                f"{np.mean(np.array(returns) > 0):.0%} with points, mean return {np.mean(returns):.1f}",
            )
        )
        ties = summary.counts.get(0, 0)
        rows.append(
            (
                "oracle labels",
                f"{summary.labeled}",
                "pairs",
                f"over {len(segs) - n_hold} training-pool segments, {ties} ties",
            )
        )
        # The looser reading of "held-out pairs": pairs never labeled, but of segments that
        # other (training) pairs contain.
        pool = list_segments(train_db)
        labeled = set(load_labels(train_db))
        for inp in [s.strip() for s in args.inputs.split(",") if s.strip()]:
            out = work / "saves"
            cmd = [
                sys.executable,
                str(ROOT / "03_reward_train.py"),
                "-n",
                f"q-{inp}",
                "-o",
                str(out),
                str(train_db),
                "--input",
                inp,
                "--runs-dir",
                str(work / "runs"),
                "--no-progress",
                *extra,
            ]
            print("$ " + " ".join(cmd[1:]), file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            dt = time.perf_counter() - t0
            sys.stderr.write(r.stdout[-3000:] + r.stderr[-1000:])
            if r.returncode != 0:
                raise SystemExit(f"training failed: {r.stderr.strip().splitlines()[-1:]}")
            path = out / f"reward-q-{inp}.pt"
            rm = load_reward_model(path)
            m = rm.metrics
            held = heldout_agreement(rm, db, hold)
            setting = f"--input {inp} {' '.join(extra)}".strip()
            rows.append(
                (
                    "held-out oracle agreement",
                    f"{100 * held.agreement:.1f}",
                    "%",
                    f"{setting}: {held.pairs} pairs of {held.segments} never-trained segments",
                )
            )
            rows.append(("held-out return correlation", f"{held.return_corr:.3f}", "Pearson r", setting))
            rows.append(("held-out per-step correlation", f"{held.step_corr:.3f}", "Pearson r", setting))
            pool_pred = predict_segments(rm, train_db, pool)
            share, n_unl = agreement(pool_pred.names, pool_pred.pred_returns, pool_pred.true_returns, skip=labeled)
            rows.append(
                (
                    "unlabeled-pair oracle agreement",
                    f"{100 * share:.1f}",
                    "%",
                    f"{setting}: {n_unl} never-labeled pairs of {len(pool)} training-pool segments",
                )
            )
            ta = m.get("oracle_agreement")
            rows.append(
                (
                    "test-split oracle agreement",
                    "n/a" if ta is None else f"{100 * ta:.1f}",
                    "%",
                    f"{setting}: {int(m.get('oracle_pairs') or 0)} held-out pairs, best epoch {int(m['epoch'])}",
                )
            )
            rows.append(("training time", f"{dt:.0f}", "s", f"{setting}, {1000 * m['s_per_pair']:.0f} ms/pair/epoch"))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    print_table("quality (reward model vs the true score)", rows)


if __name__ == "__main__":
    main()
