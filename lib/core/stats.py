"""Small statistics every stage reports with: one Pearson correlation (of two series, or of two
streams from running sums); whether a number read from a file is finite."""

from __future__ import annotations

import math

import numpy as np


def finite(v: int | float) -> bool:
    """``math.isfinite`` that is False, not OverflowError, for an int no float holds (a file can
    hold 10**400)."""
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def pearson(x, y) -> float:
    """Pearson r of two equal-length series; NaN with fewer than 2 points or a constant series
    (undefined: a game without points scored has a constant true reward)."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if len(x) != len(y):
        raise ValueError(f"pearson needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


class StepCorrelation:
    """Pearson correlation of two streams of numbers from running sums (no history kept): the
    reward model's per-step prediction against the true reward, all envs, every step."""

    def __init__(self) -> None:
        self.n = 0
        self.sums = np.zeros(5)  # x, y, xx, yy, xy

    def add(self, x: np.ndarray, y: np.ndarray) -> None:
        x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
        self.n += len(x)
        self.sums += (x.sum(), y.sum(), (x * x).sum(), (y * y).sum(), (x * y).sum())

    def value(self) -> float | None:
        """The correlation, None with fewer than 2 steps or a constant stream (no points scored)."""
        if self.n < 2:
            return None
        sx, sy, sxx, syy, sxy = self.sums / self.n
        vx, vy = sxx - sx * sx, syy - sy * sy
        if vx <= 1e-12 or vy <= 1e-12:
            return None
        return float((sxy - sx * sy) / np.sqrt(vx * vy))
