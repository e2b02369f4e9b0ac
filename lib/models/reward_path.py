"""The reward path: how a learned reward's raw per-step prediction becomes what the learner is paid.
One record, ``RewardPath`` (the norm, its window, the clip, the scale, the score beside it), that
stage 1 builds from its flags (``A2CConfig.reward_path``), the reward env applies (``pay``), the
policy checkpoint stores (``record``) and ``04_play.py`` rebuilds (``RewardPath.read``), so that a
game played back shows the reward as that run was paid. Torch-free: the stages' ``--help`` reads its
names. Why these norms and clips: docs/reference.md and docs/results.md."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

REWARD_NORMS = ("running", "labels", "window")  # --reward-norm: where the learned reward's statistics come from
DEFAULT_NORM_WINDOW = 10_000  # running: the agent's last 10,000 predictions, over all envs
BOOK_NORM_WINDOW = 25  # window: the book's 100 raw frames of one env, in agent steps (frameskip 4)
DEFAULT_CLIP = 5.0  # |normalised reward| at most 5 std
SIGN = "sign"  # clip by sign: ptan's ClipRewardEnv after the book's normalisation
MAX_CLIP = 1000.0
MAX_WINDOW = 1_000_000
MAX_SCALE = 1e6
MIN_STD = 1e-6


class RunningNorm:
    """Median, mean and std over the last ``window`` values (a ring buffer), with a prior (mean,
    std) used until ``warmup`` values have been seen (the prior's mean standing in for the median).
    ``normalise`` adds a batch and returns it centred on the median and divided by the std."""

    def __init__(self, window: int, prior: tuple[float, float] | None = None, warmup: int | None = None):
        if window < 1:
            raise ValueError(f"norm window must be at least 1, got {window}")
        self.buf = np.zeros(window, dtype=np.float64)
        self.count = 0  # values ever added
        self.pos = 0
        self.prior = prior
        self.warmup = max(1, window // 10) if warmup is None else warmup
        self.mean, self.std = prior if prior is not None else (0.0, 1.0)
        self.center = self.mean

    def add(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64).ravel()
        n = len(self.buf)
        if len(x) >= n:
            self.buf[:] = x[-n:]
            self.pos = 0
        else:
            end = self.pos + len(x)
            if end <= n:
                self.buf[self.pos : end] = x
            else:
                k = n - self.pos
                self.buf[self.pos :] = x[:k]
                self.buf[: end - n] = x[k:]
            self.pos = end % n
        self.count += len(x)
        if self.prior is None or self.count >= self.warmup:
            filled = self.buf[: min(self.count, n)]
            self.mean, self.std = float(filled.mean()), float(filled.std())
            self.center = float(np.median(filled))

    def normalise(self, x: np.ndarray) -> np.ndarray:
        """Add ``x`` (N,) to the window, return (x - median) / std (std < MIN_STD counts as 1)."""
        self.add(x)
        scale = self.std if self.std >= MIN_STD else 1.0
        return ((np.asarray(x, dtype=np.float64) - self.center) / scale).astype(np.float32)


class WindowNorm:
    """``--reward-norm window``, the book's normalisation: each env's prediction is centred on the
    mean of its own last ``window`` predictions (the current one included; never reset at a lost
    life) and divided by their std. Unlike the book, a window not yet full uses what it has (an
    env's first step is 0): a raw prediction carries the model's arbitrary offset."""

    def __init__(self, window: int, n_envs: int):
        if window < 2:
            raise ValueError(f"norm window must be at least 2, got {window}")
        self.buf = np.zeros((window, n_envs), dtype=np.float64)
        self.count = 0  # steps added (every env adds one a step)
        self.mean = self.center = 0.0  # over the envs, for TensorBoard
        self.std = 1.0

    def normalise(self, x: np.ndarray) -> np.ndarray:
        """Add ``x`` (N,), one prediction per env, and return each minus its env's window mean,
        divided by that window's std (std < MIN_STD counts as 1)."""
        x = np.asarray(x, dtype=np.float64).ravel()
        if x.shape != self.buf.shape[1:]:
            raise ValueError(f"expected {self.buf.shape[1]} predictions (one per env), got {x.shape}")
        self.buf[self.count % len(self.buf)] = x
        self.count += 1
        filled = self.buf[: min(self.count, len(self.buf))]
        mean, std = filled.mean(0), filled.std(0)
        self.mean = self.center = float(mean.mean())
        self.std = float(std.mean())
        return ((x - mean) / np.where(std >= MIN_STD, std, 1.0)).astype(np.float32)


class FixedNorm(RunningNorm):
    """``--reward-norm labels``: a fixed centre (the mean) and std, as the papers normalise (Ibarz et
    al. 2018 A.1: statistics over the labelled clips, not over the agent's own recent steps, so a
    policy drifting into what the model pays more cannot move the centre with it)."""

    def __init__(self, mean: float, std: float):
        super().__init__(1, prior=(mean, std), warmup=1)
        self.mean, self.std, self.center = float(mean), float(std), float(mean)

    def add(self, x: np.ndarray) -> None:
        self.count += int(np.size(x))


Norm = RunningNorm | WindowNorm


def norm_prior(model: Any) -> tuple[float, float] | None:
    """The (mean, std) of per-step predictions stored in a reward model's checkpoint, which
    ``RunningNorm`` uses until its window fills; None when it has none usable (not finite, std <=
    0)."""
    if not getattr(model, "has_norm_stats", True):
        return None
    mean, std = getattr(model, "norm_mean", None), getattr(model, "norm_std", None)
    if mean is None or std is None or not math.isfinite(mean) or not math.isfinite(std) or std <= 0:
        return None
    return float(mean), float(std)


def normalised(x: np.ndarray) -> np.ndarray:
    """A whole series of predictions normalised as the learner does once its window holds them:
    centred on the median, divided by the std (a constant series: centred only)."""
    x = np.asarray(x, dtype=np.float64).ravel()
    return RunningNorm(len(x)).normalise(x) if len(x) else np.zeros(0, dtype=np.float32)


def score_pay(score: np.ndarray) -> np.ndarray:
    """The game's score as the learner is paid it without a learned reward: its sign, -1, 0 or +1
    a step (ptan's ClipRewardEnv, the book's)."""
    return np.sign(np.asarray(score, dtype=np.float32))


def clip_value(text: str) -> float | str | None:
    """--reward-clip's text as a path's clip: a bound in (0, MAX_CLIP] or ``SIGN``; None where it
    is neither."""
    if text == SIGN:
        return SIGN
    try:
        c = float(text)
    except (TypeError, ValueError):
        return None
    return c if math.isfinite(c) and 0 < c <= MAX_CLIP else None


@dataclass(frozen=True)
class RewardPath:
    """What the learner is paid for a raw prediction: normalised by ``norm`` ("running": the
    agent's last ``window`` predictions over all envs, median-centred; "labels": fixed, the reward
    model's stats over its labelled clips; "window": each env's last ``window`` steps,
    mean-centred), clipped (``clip`` std, ``SIGN``, or None), times ``scale``, plus the score's sign
    with ``plus_score``. The default is ``01_a2c.py -r``'s."""

    norm: str = "running"
    window: int = DEFAULT_NORM_WINDOW
    clip: float | str | None = DEFAULT_CLIP
    scale: float = 1.0
    plus_score: bool = False

    def __post_init__(self) -> None:
        if self.norm not in REWARD_NORMS:
            raise ValueError(f"norm must be one of {', '.join(REWARD_NORMS)}, got {str(self.norm)[:40]!r}")
        least = 2 if self.norm == "window" else 1
        if type(self.window) is not int or not least <= self.window <= MAX_WINDOW:
            raise ValueError(f"norm window must be an integer in {least}..{MAX_WINDOW:,}, got {str(self.window)[:40]}")
        ok_clip = self.clip is None or self.clip == SIGN
        if not ok_clip and isinstance(self.clip, int | float) and not isinstance(self.clip, bool):
            ok_clip = 0 < self.clip <= MAX_CLIP  # exact for any int; NaN and inf fail it
        if not ok_clip:
            raise ValueError(f"clip must be a number in (0, {MAX_CLIP:g}], sign or none, got {str(self.clip)[:40]}")
        scale = self.scale
        if isinstance(scale, bool) or not isinstance(scale, int | float) or not (0 < scale <= MAX_SCALE):
            raise ValueError(f"scale must be a number in (0, {MAX_SCALE:g}], got {str(scale)[:40]}")
        if not isinstance(self.plus_score, bool):
            raise ValueError(f"plus_score must be true or false, got {str(self.plus_score)[:40]}")

    def new_norm(self, n_envs: int, stats: tuple[float, float] | None) -> Norm:
        """A fresh norm of this path for ``n_envs`` envs side by side. ``stats``: the reward
        model's (mean, std), the prior of "running" and the fixed centre and std of "labels"
        (ValueError without them)."""
        if self.norm == "labels":
            if stats is None:
                raise ValueError("--reward-norm labels needs the reward model's statistics of its labelled clips")
            return FixedNorm(*stats)
        if self.norm == "window":
            return WindowNorm(self.window, n_envs)
        return RunningNorm(self.window, prior=stats)

    def pay(self, raw: np.ndarray, norm: Norm, score: np.ndarray | None = None) -> tuple[np.ndarray, float]:
        """(what the learner is paid for the raw predictions ``raw`` (N,), float32; the share of
        the step clipped). ``norm`` is this path's (``new_norm``), fed one step at a time; ``score``
        (N,) the step's true score, which ``plus_score`` needs."""
        rewards = norm.normalise(raw)
        clipped = 0.0
        if self.clip == SIGN:  # ptan's ClipRewardEnv after the book's normalisation
            clipped = float(np.mean(np.abs(rewards) != 1))
            rewards = np.sign(rewards)
        elif self.clip is not None:  # in std units, before the scale
            clipped = float(np.mean(np.abs(rewards) > self.clip))
            rewards = np.clip(rewards, -self.clip, self.clip)
        paid = rewards * self.scale
        if self.plus_score:
            if score is None:
                raise ValueError("a path with plus_score pays the score too: give the step's score")
            paid = paid + score_pay(score)
        return paid.astype(np.float32), clipped

    def bound(self) -> float:
        """The largest pay a step can get: the edge a plot of it draws."""
        edge = 1.0 if self.clip == SIGN else DEFAULT_CLIP if self.clip is None else float(self.clip)
        return edge * self.scale + (1.0 if self.plus_score else 0.0)

    def describe(self) -> str:
        """The path in a few words, as its flags read: 'norm window 25, clip sign, scale 1'."""
        norm = {"running": f"running {self.window:,}", "labels": "labels", "window": f"window {self.window:,}"}
        clip = "none" if self.clip is None else self.clip if self.clip == SIGN else f"{self.clip:g}"
        text = f"norm {norm[self.norm]}, clip {clip}, scale {self.scale:g}"
        return text + (", plus the score" if self.plus_score else "")

    def record(self) -> dict[str, Any]:
        """The path as a checkpoint stores it (plain values)."""
        return asdict(self)

    @classmethod
    def read(cls, rec: Any) -> RewardPath:
        """A path from a checkpoint's record (untrusted): ValueError in one line for anything that
        is not one."""
        if not isinstance(rec, dict):
            raise ValueError(f"the reward path must be a dict, got {type(rec).__name__}")
        unknown = set(rec) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"the reward path has unknown fields: {', '.join(sorted(map(str, unknown)))[:80]}")
        return cls(**rec)
