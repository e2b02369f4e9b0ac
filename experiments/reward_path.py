"""What the learner would be paid, offline: one reward model's predictions on a DB's clips sent
through each reward path of ``01_a2c.py -r`` (the normalisation and the clip), before any fine-tune.

The paths: ``running`` (the median and std of all the clips' steps, as the running window of the
agent's last 10,000 predictions sees them once it is full) or ``window`` (each clip's own last
``--norm-window`` steps, the book's per-env window: a clip is one env's consecutive steps, so its
first steps have a shorter window than a run has), each with the ±5 clip or the sign (ptan's, after
the book's normalisation). For each: the mean pay of a climbing and of a still low-gauge step with a
diver aboard (``experiments.readouts.diver_step_flags``) and their difference, the same difference
with a high gauge (a model that reads the gauge pays the climb there less), the steps that lose a
life and the ``LIFE_LOSS_LEAD`` steps before them, and the mean step.

    python -m experiments.reward_path --reward runs/round/seed0/surface-100/r1/reward.pt \\
        --db runs/round/seed0/db --split runs/round/seed0/split.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from experiments.flags import check_out, rows_out_setting
from experiments.readouts import diver_step_flags, diver_step_means, life_loss_means
from lib.core.errors import UserError, run_cli
from lib.core.files import atomic_write
from lib.core.settings import build_parser as settings_parser
from lib.core.settings import check_fields, in_range, setting
from lib.models.reward import load_reward_model
from lib.models.reward_path import BOOK_NORM_WINDOW, DEFAULT_CLIP, WindowNorm, normalised
from lib.reward.eval import predict_segments
from lib.store.segments import list_segments, read_segment

PATHS = ("running", "window")
CLIPS = ("5", "sign")


def path_rewards(preds: list[np.ndarray], norm: str, clip: str, window: int = BOOK_NORM_WINDOW) -> list[np.ndarray]:
    """Per clip (T,) raw predictions -> what the learner gets for each step under ``norm`` and ``clip``."""
    if norm == "running":
        z = normalised(np.concatenate(preds)) if preds else np.zeros(0, dtype=np.float32)
        cuts = np.cumsum([len(p) for p in preds])[:-1]
        out = np.split(z.astype(np.float64), cuts)
    elif norm == "window":
        out = []
        for p in preds:
            wn = WindowNorm(window, 1)
            out.append(np.array([wn.normalise(np.array([x]))[0] for x in p], dtype=np.float64))
    else:
        raise ValueError(f"unknown norm {norm!r}")
    if clip == "sign":
        return [np.sign(z) for z in out]
    bound = float(clip)
    return [np.clip(z, -bound, bound) for z in out]


Flags = list[tuple[np.ndarray, np.ndarray]]


def path_figures(z: list[np.ndarray], flags: Flags, lost: list[np.ndarray], high: Flags | None = None) -> dict:
    """The pay of climbing and still low-gauge diver steps, the same gap on the ``high``-gauge
    diver steps (NaN without them), around lost lives, and the mean step."""
    flat = np.concatenate(z) if z else np.zeros(0)
    m = diver_step_means(flat, flags)
    h = diver_step_means(flat, high) if high is not None else {}
    high_gap = h["diver_climb_z"] - h["diver_still_z"] if h else math.nan
    return {
        **m,
        "gap": m["diver_climb_z"] - m["diver_still_z"],
        "high_gap": high_gap,
        "high_climb_steps": h.get("diver_climb_steps", 0),
        **life_loss_means(z, lost),
        "paid": paid_share(flat),
    }


def paid_share(z: np.ndarray) -> float:
    """The share of steps paid anything (not 0): the rule pays a few steps, a learned reward nearly all."""
    return float(np.mean(z != 0)) if len(z) else math.nan


def measure(reward: Path, db: Path, names: list[str], window: int, dev: str = "cpu") -> list[dict]:
    rm = load_reward_model(reward, device=dev)
    p = predict_segments(rm, db, names)
    preds, flags, high, lost = [], [], [], []
    lo = 0
    for rel in p.names:
        seg = read_segment(db, rel)
        n = len(seg.frames)
        preds.append(np.asarray(p.pred_steps[lo : lo + n], dtype=np.float64))
        lo += n
        flags.append(diver_step_flags(seg.frames))
        high.append(diver_step_flags(seg.frames, "high"))
        lost.append(np.zeros(n, dtype=bool) if seg.dones is None else np.asarray(seg.dones, dtype=bool))
    if lo != len(p.pred_steps):
        raise UserError(f"{reward}: {len(p.pred_steps)} predictions for {lo} steps of {db}")
    rows = []
    for norm in PATHS:
        for clip in CLIPS:
            fig = path_figures(path_rewards(preds, norm, clip, window), flags, lost, high)
            rows.append({"norm": norm if norm == "running" else f"window {window}", "clip": clip, **fig})
    return rows


def print_rows(reward: Path, rows: list[dict]) -> None:
    print(f"\n{reward}")
    print(
        "| path | clip | diver step climbing / still (steps) | climbing - still | the same, gauge high (climbs)"
        " | a lost life | the 15 before",
        end="",
    )
    print(" | mean step | steps paid |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['norm']} | {'±' + r['clip'] if r['clip'] != 'sign' else 'sign'} | {r['diver_climb_z']:+.2f} / "
            f"{r['diver_still_z']:+.2f} ({r['diver_climb_steps']} / {r['diver_still_steps']}) | **{r['gap']:+.2f}** "
            f"| {r['high_gap']:+.2f} ({r['high_climb_steps']}) | {r['life_loss_z']:+.2f} | {r['pre_loss_z']:+.2f} "
            f"| {r['mean_z']:+.3f} | {r['paid']:.0%} |"
        )


GROUPS = {"in": "the models and the clips", "out": "output"}  # --help's groups, in order, and their titles


@dataclass(frozen=True)
class RewardPathSettings:
    """What ``python -m experiments.reward_path`` is told, one field per flag in ``--help`` order."""

    reward: list[Path] = setting(help="a reward model (.pt); repeat", group="in", type=Path, action="append")
    db: Path = setting(help="the DB whose clips are paid", group="in", type=Path)
    split: Path | None = setting(
        None, "a round's split.json: only its held-out clips (default: every clip)", group="in", type=Path
    )
    norm_window: int = setting(
        BOOK_NORM_WINDOW, "the window path's steps per env", group="in", checks=in_range("--norm-window", 2, 1000)
    )
    out: Path | None = rows_out_setting(group="out")


def build_parser() -> argparse.ArgumentParser:
    """The flags in groups (``--help``), one per ``RewardPathSettings`` field."""
    return settings_parser(RewardPathSettings, "python -m experiments.reward_path", __doc__.split("\n\n")[0], GROUPS)


def main(argv: list[str] | None = None) -> None:
    a = RewardPathSettings(**vars(build_parser().parse_args(argv)))
    check_fields(a)
    check_out(a.out)
    for path in (*a.reward, a.db):
        if not path.exists():
            raise UserError(f"{path} does not exist")
    names = list_segments(a.db)
    if a.split is not None:
        try:
            held = set(json.loads(a.split.read_text())["holdout"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"--split {a.split}: not a round's split.json with a holdout list ({e})") from None
        names = [n for n in names if n in held]
    if not names:
        raise UserError(f"no segment of {a.db} to pay" + (f" in {a.split}'s holdout" if a.split else ""))
    out = {}
    for reward in a.reward:
        rows = measure(reward, a.db, names, a.norm_window)
        print_rows(reward, rows)
        out[str(reward)] = rows
    print(f"\n(±{DEFAULT_CLIP:g} is 01_a2c.py's default clip; the running path is its default normalisation)")
    if a.out:
        try:
            atomic_write(a.out, json.dumps(out, indent=1).encode())
        except OSError as e:
            raise UserError(f"cannot write --out {a.out}: {e.strerror or e} (the tables above hold the rows)") from None


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
