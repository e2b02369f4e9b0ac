"""What a reward model pays and how well it orders clips, read on a segment DB: the figures the
rounds (``experiments.round``, ``experiments.live``), the benchmarks (``experiments.quality``,
``experiments.sampling``) and the branch and reward-path tools report. Its own module so that the
stages (``experiments.stages``) and the branch pairs (``experiments.branch``) both read them
without importing each other."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lib.atari.seaquest import divers_aboard, in_gauge_band, oxygen_levels, shows_gauge, sub_rows
from lib.models.reward import load_reward_model
from lib.models.reward_path import normalised
from lib.models.teachers import Teacher
from lib.reward.eval import predict_segments, score, teacher_agreement
from lib.store.labels import FIRST_BETTER, SECOND_BETTER, load_labels
from lib.store.segments import db_game, list_segments, read_segment

HELD_OUT_FIGURES = 2  # the version of held_out_figures' figures: 2, the climbing step aligned (2026-11-27)
LIFE_LOSS_LEAD = 15  # steps before a life loss that ``life_loss_rewards`` also averages


def held_out_figures(
    db: Path, holdout: list[str], reward: Path, teacher: str, dev: str, death_penalty: float = 0.0
) -> dict[str, Any]:
    """The reward model on segments it never saw: agreement with the teacher over every held-out
    pair the teacher prefers one of (a predicted tie counts as wrong), overall and per deciding rule
    (``by_rule``: agreement and pairs); ``--evaluate``'s figures against the score (agreement,
    per-step correlation); what the model pays where a life is lost (``life_loss_rewards``) and,
    for SeaQuest, on steps with a low gauge and a diver aboard (``diver_step_rewards``)."""
    rm = load_reward_model(reward, device=dev)
    preds = predict_segments(rm, db, holdout, facts=True)
    vs_score = score(preds)
    game = (db_game(db) or (None, None))[0]
    lost, flags = [], []
    for rel in preds.names:
        seg = read_segment(db, rel)
        lost.append(np.zeros(len(seg.frames), dtype=bool) if seg.dones is None else np.asarray(seg.dones, dtype=bool))
        if shows_gauge(game, seg.frames.shape[1:]):  # the steps' flags, not the frames (~5 MB a segment)
            flags.append(diver_step_flags(seg.frames))
    judged = teacher_agreement(preds, Teacher(teacher, death_penalty=death_penalty))
    figs: dict[str, Any] = {
        "teacher_agreement": judged.agreement,
        "teacher_pairs": judged.pairs,
        "by_rule": {rule: {"agreement": a, "pairs": n} for rule, (a, n) in judged.by_rule.items()},
        "score_agreement": vs_score.agreement,
        "score_pairs": vs_score.pairs,
        "step_corr_heldout": vs_score.step_corr,
        "heldout_segments": vs_score.segments,
        **life_loss_rewards(preds.pred_steps, np.concatenate(lost) if lost else np.zeros(0, dtype=bool)),
    }
    if flags and len(flags) == len(preds.names):
        figs.update(_diver_step_figures(preds.pred_steps, flags))
    return figs


def diver_step_rewards(pred_steps: np.ndarray, frames: list[np.ndarray]) -> dict[str, float]:
    """SeaQuest: the model's mean normalised reward (``lib.models.reward_path.normalised``, the
    learner's units) on the held-out steps with a low gauge (0 < level <= LOW_OXYGEN, not filling:
    ``lib.atari.seaquest``'s low) and a diver aboard, split by whether the step climbs (``diver_step_flags``):
    ``diver_climb_z`` and ``diver_still_z`` (NaN where there are none), with their counts.
    A model that has learned what the surface teacher asks for pays more for the climb."""
    return _diver_step_figures(pred_steps, [diver_step_flags(f) for f in frames])


def diver_step_flags(frames: np.ndarray, gauge: str = "low") -> tuple[np.ndarray, np.ndarray]:
    """One segment's (T,) masks: a low gauge (not filling) with a diver aboard (``gauge="high"``: a
    gauge at least HIGH_OXYGEN, where the surface teacher does not ask for the climb), and the step
    climbing: the sub's top row in the frame the step led to is above the one its action was
    chosen on. That is the step a reward model pays for the climb: its action moved the sub, and
    the diff net's input is that step's frame and the next. (Until 2026-11-27 the flag was the
    step after, whose frame already shows the move: the action there is often no longer UP.) A
    segment's first step (its gauge's trend unknown) and last step (its next frame not recorded)
    are not judged."""
    levels, rows, divers = oxygen_levels(frames), sub_rows(frames), divers_aboard(frames)
    draining, up = np.zeros(len(frames), dtype=bool), np.zeros(len(frames), dtype=bool)
    draining[1:-1] = levels[1:-1] <= levels[:-2]  # not filling
    up[:-1] = (rows[1:] >= 0) & (rows[:-1] >= 0) & (rows[1:] < rows[:-1])
    return draining & in_gauge_band(levels, gauge) & (divers > 0), up


def _diver_step_figures(pred_steps: np.ndarray, flags: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    return diver_step_means(normalised(pred_steps).astype(np.float64), flags)


def diver_step_means(z: np.ndarray, flags: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, float]:
    """The mean of ``z`` (per-step pay, the segments' steps in a row) on the climbing and on the
    still low-gauge diver steps of ``diver_step_flags`` (one pair of masks per segment), and how many."""
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


def life_loss_rewards(pred_steps: np.ndarray, life_lost: np.ndarray) -> dict[str, float]:
    """What a reward model pays around a lost life, in the learner's units: per-step predictions
    normalised as the reward path does (``lib.models.reward_path.normalised``). The true
    reward there is 0, so a model the agent cannot exploit pays about 0 or less.

    ``life_loss_z``: the mean on the steps that lost a life; ``pre_loss_z``: the mean over the
    ``LIFE_LOSS_LEAD`` steps before each of them (what the agent is paid for heading into a death);
    ``life_losses``: how many there were. NaN where there is none. ``mean_z``: the mean step (the
    median is 0): below 0, a life that goes on costs about ``mean_z`` a step, and under
    ``--terminal life`` a death that costs less than the rest of the life is the way out."""
    pred_steps = np.asarray(pred_steps, dtype=np.float64)
    life_lost = np.asarray(life_lost, dtype=bool)
    if pred_steps.shape != life_lost.shape:
        raise ValueError(f"{pred_steps.shape} predictions for {life_lost.shape} steps")
    return life_loss_means([normalised(pred_steps).astype(np.float64)], [life_lost])


def life_loss_means(z: list[np.ndarray], lost: list[np.ndarray]) -> dict[str, float]:
    """``life_loss_rewards``' figures of rewards already in the learner's units, clip by clip:
    the lead before a loss stays within its own clip (``z[k]``, ``lost[k]``)."""
    flat = np.concatenate(z) if z else np.zeros(0)
    dead = np.concatenate(lost) if lost else np.zeros(0, dtype=bool)
    leads = []
    for clip_lost in lost:
        lead = np.zeros(len(clip_lost), dtype=bool)
        for t in np.flatnonzero(clip_lost):
            lead[max(0, t - LIFE_LOSS_LEAD) : t] = True
        leads.append(lead & ~clip_lost)
    lead = np.concatenate(leads) if leads else np.zeros(0, dtype=bool)
    return {
        "life_losses": int(dead.sum()),
        "life_loss_z": float(flat[dead].mean()) if dead.any() else math.nan,
        "pre_loss_z": float(flat[lead].mean()) if lead.any() else math.nan,
        "mean_z": float(flat.mean()) if len(flat) else math.nan,
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
