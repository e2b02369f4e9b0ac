"""How well a trained reward model orders segments it may never have seen: ``03_reward_train.py
--evaluate MODEL DB...`` and ``bench/quality.py``'s held-out figures use these functions.

Three figures per set of segments with true rewards:
- **oracle agreement**: over every pair of segments whose true returns differ, the share whose
  predicted returns order them the same way (``oracle_agreement``: a predicted tie is wrong);
- **return correlation**: Pearson r of predicted and true segment returns;
- **per-step correlation**: Pearson r of the per-step prediction and the true reward of each step.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lib.errors import UserError, warn
from lib.reward_model import RewardPredictor
from lib.reward_train import oracle_agreement
from lib.segments import SegmentError, list_segments, read_segment


@dataclass
class SegmentPredictions:
    """The model's and the game's rewards for a set of segments."""

    names: list[str]
    pred_returns: np.ndarray  # (S,)
    true_returns: np.ndarray  # (S,)
    pred_steps: np.ndarray  # (sum of lengths,)
    true_steps: np.ndarray  # (sum of lengths,)
    skipped: int = 0  # unreadable segments, or segments without true rewards


@dataclass
class Scores:
    """The three figures for a set of segments (NaN where undefined)."""

    segments: int
    pairs: int
    agreement: float
    return_corr: float
    step_corr: float

    def line(self, what: str) -> str:
        pct = "n/a" if math.isnan(self.agreement) else f"{100 * self.agreement:.1f}%"
        return (
            f"{what}: {self.segments} segments, oracle agreement {pct} ({self.pairs:,} pairs with different "
            f"true returns), return corr {_r(self.return_corr)}, per-step corr {_r(self.step_corr)}"
        )


def _r(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{x:+.3f}"


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r, NaN with fewer than 2 points or a constant series."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def all_pairs_agreement(pred: np.ndarray, true: np.ndarray) -> tuple[float, int]:
    """``oracle_agreement`` over every unordered pair of the segments (S*(S-1)/2 pairs)."""
    i, j = np.triu_indices(len(pred), k=1)
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    return oracle_agreement(pred[i], pred[j], true[i], true[j])


def predict_segments(
    rm: RewardPredictor, db: str | os.PathLike, names: Sequence[str], warn: Callable[[str], None] = warn
) -> SegmentPredictions:
    """Per-step predictions of the model for ``names`` of a DB; segments that cannot be read or
    have no true rewards (the book's) are skipped, with one warning each for broken ones."""
    kept, pr, tr, ps, ts = [], [], [], [], []
    skipped = 0
    for rel in names:
        try:
            seg = read_segment(db, rel)
        except SegmentError as e:
            warn(f"skipped: {e}")
            skipped += 1
            continue
        if seg.rewards is None:
            skipped += 1
            continue
        pred = np.asarray(rm.predict_clip(seg), dtype=np.float64).reshape(-1)
        kept.append(rel)
        pr.append(pred.sum())
        tr.append(float(np.sum(seg.rewards, dtype=np.float64)))
        ps.append(pred)
        ts.append(np.asarray(seg.rewards, dtype=np.float64))
    cat = (lambda xs: np.concatenate(xs)) if ps else (lambda xs: np.zeros(0))
    return SegmentPredictions(kept, np.array(pr), np.array(tr), cat(ps), cat(ts), skipped)


def score(p: SegmentPredictions) -> Scores:
    """The three figures of a set of predictions."""
    agree, n = all_pairs_agreement(p.pred_returns, p.true_returns)
    return Scores(len(p.names), n, agree, pearson(p.pred_returns, p.true_returns), pearson(p.pred_steps, p.true_steps))


def merge(parts: Sequence[SegmentPredictions]) -> SegmentPredictions:
    """Several DBs' predictions as one set (pairs across DBs count too)."""
    return SegmentPredictions(
        [n for p in parts for n in p.names],
        np.concatenate([p.pred_returns for p in parts]) if parts else np.zeros(0),
        np.concatenate([p.true_returns for p in parts]) if parts else np.zeros(0),
        np.concatenate([p.pred_steps for p in parts]) if parts else np.zeros(0),
        np.concatenate([p.true_steps for p in parts]) if parts else np.zeros(0),
        sum(p.skipped for p in parts),
    )


def evaluate_model(rm: RewardPredictor, dbs: Sequence[str | os.PathLike], log: Callable[[str], None] = print) -> Scores:
    """``--evaluate``: one line per DB and a total line over all their segments; returns the total.
    UserError when no DB has a segment with true rewards."""
    parts = []
    for db in dbs:
        root = Path(db)
        if not root.is_dir():
            raise UserError(f"DB not found: {root}")
        p = predict_segments(rm, root, list_segments(root))
        skipped = f" ({p.skipped} skipped: unreadable or without true rewards)" if p.skipped else ""
        log(score(p).line(str(root)) + skipped)
        parts.append(p)
    total = merge(parts)
    if not total.names:
        raise UserError("no segment with true rewards in " + ", ".join(map(str, dbs)) + ": nothing to score")
    result = score(total)
    log(result.line(f"total ({len(parts)} DB{'s' if len(parts) > 1 else ''})"))
    return result
