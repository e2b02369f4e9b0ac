"""Small statistics every stage reports with: one Pearson correlation, one 95% interval of a mean."""

from __future__ import annotations

import math

import numpy as np

Z95 = 1.96  # normal approximation of the 95% interval of a mean


def pearson(x, y) -> float:
    """Pearson r of two equal-length series; NaN with fewer than 2 points or a constant series
    (undefined: a game without points scored has a constant true reward)."""
    x, y = np.asarray(x, dtype=np.float64).ravel(), np.asarray(y, dtype=np.float64).ravel()
    if len(x) != len(y):
        raise ValueError(f"pearson needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2 or x.std() == 0 or y.std() == 0:
        return math.nan
    return float(np.corrcoef(x, y)[0, 1])


def mean_ci95(values) -> tuple[float, float]:
    """(mean, half-width of its 95% interval); the half-width is NaN with fewer than 2 values."""
    v = np.asarray(values, dtype=np.float64).ravel()
    if len(v) == 0:
        return math.nan, math.nan
    half = Z95 * v.std(ddof=1) / math.sqrt(len(v)) if len(v) > 1 else math.nan
    return float(v.mean()), float(half)
