"""How well a reward model orders segments: the trainer's figures on its held-out pairs
(``pair_metrics``) and ``03_reward_train.py --evaluate`` / ``experiments/quality.py``'s figures on
any DB (``evaluate_model``, ``score``). On segments with true rewards: oracle agreement
(``oracle_agreement``), return correlation and per-step correlation; ``--evaluate`` adds the
agreement with a synthetic teacher's own answers (``teacher_agreement``). Test pairs share segments
with training pairs; ``experiments/quality.py`` measures on segments never trained on."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lib.atari.seaquest import StepPay
from lib.core.errors import UserError, warn
from lib.core.stats import pearson
from lib.models.reward import AnyRewardModel, DiffRewardModel, RewardPredictor, lean_net, preference_loss
from lib.models.teachers import TEACHER_ENTRIES, SegmentFacts, Teacher, segment_facts
from lib.reward.data import PreferenceData, model_inputs, step_features
from lib.store.labels import FIRST_BETTER, SECOND_BETTER
from lib.store.segments import SegmentError, db_game, decode_segment, list_segments, read_segment


def oracle_agreement(pred1: np.ndarray, pred2: np.ndarray, true1: np.ndarray, true2: np.ndarray) -> tuple[float, int]:
    """(share, count) of the pairs whose true returns are known and differ that the predicted
    returns order the same way; a predicted tie counts as wrong, NaN share when no pair is left. The
    one rule for every agreement figure."""
    p1, p2, t1, t2 = (np.asarray(x, dtype=np.float64) for x in (pred1, pred2, true1, true2))
    known = np.isfinite(t1) & np.isfinite(t2) & (t1 != t2)
    n = int(known.sum())
    if n == 0:
        return math.nan, 0
    return float(np.mean(np.sign(p1[known] - p2[known]) == np.sign(t1[known] - t2[known]))), n


# --- the trainer's test pairs ----------------------------------------------------------------


def predict_segment_returns(
    nets: Sequence[torch.nn.Module],
    data: PreferenceData,
    segs: np.ndarray,
    device: torch.device,
    arch: str,
    chunk_frames: int = 64,
) -> tuple[np.ndarray, tuple[float, float, int]]:
    """Eval-mode returns of segments ``segs`` by each member: (K, S) float64, and the (sum, sum of
    squares, count) of the ensemble-mean per-step predictions (for normalisation stats)."""
    out = np.zeros((len(nets), len(segs)), dtype=np.float64)
    s1 = s2 = 0.0
    count = 0
    groups: list[list[int]] = [[]]
    frames_in = 0
    for j, s in enumerate(segs):
        if groups[-1] and frames_in + data.lengths[s] > chunk_frames:
            groups.append([])
            frames_in = 0
        groups[-1].append(j)
        frames_in += int(data.lengths[s])
    with torch.inference_mode():
        for g in groups:
            if not g:
                continue
            if isinstance(nets[0], DiffRewardModel):
                feats, actions, owner = step_features(nets[0], data, segs[g], device)
                a = torch.from_numpy(actions).to(device)
                per_step = torch.stack([net.head(feats, a) for net in nets])  # type: ignore[operator]
            else:
                frames, actions, owner = model_inputs(data, segs[g], arch)
                f = torch.from_numpy(frames).to(device)
                a = torch.from_numpy(actions).to(device)
                per_step = torch.stack([net(f, a) for net in nets])  # (K, F)
            o = torch.from_numpy(owner).to(device)
            rets = torch.zeros((len(nets), len(g)), device=device, dtype=per_step.dtype).index_add(1, o, per_step)
            out[:, g] = rets.double().cpu().numpy()
            m = per_step.mean(0).double()
            s1 += float(m.sum())
            s2 += float((m * m).sum())
            count += len(m)
    return out, (s1, s2, count)


def lean_nets(models: Sequence[AnyRewardModel], device: torch.device) -> list[torch.nn.Module]:
    """The eval-only nets of models in training (``lean_net``); the models stay in train mode."""
    nets = []
    for m in models:
        m.eval()
        nets.append(lean_net(m).to(device, memory_format=torch.channels_last))
        m.train()
    return nets


def _mean_std(s1: float, s2: float, count: int) -> tuple[float, float]:
    mean = s1 / max(count, 1)
    return mean, math.sqrt(max(s2 / max(count, 1) - mean * mean, 0.0))


def pair_metrics(
    models: Sequence[AnyRewardModel], data: PreferenceData, pairs: np.ndarray, device: torch.device, noise: float
) -> dict[str, float]:
    """The trainer's figures on labeled ``pairs`` (its test pairs), in eval mode: loss, accuracy on
    non-tie labels, oracle agreement, correlation of predicted with true returns, ensemble
    disagreement, and per-step prediction stats."""
    segs, inv = np.unique(np.concatenate([data.first[pairs], data.second[pairs]]), return_inverse=True)
    rets, sums = predict_segment_returns(lean_nets(models, device), data, segs, device, models[0].arch)
    mean_ret = rets.mean(0)  # (S,) the ensemble's return
    r1 = torch.from_numpy(mean_ret[inv[: len(pairs)]]).float()
    r2 = torch.from_numpy(mean_ret[inv[len(pairs) :]]).float()
    _, m = preference_loss(r1, r2, torch.from_numpy(data.mu[pairs]), noise)
    agree, n_or = oracle_agreement(
        r1.numpy(), r2.numpy(), data.true_returns[data.first[pairs]], data.true_returns[data.second[pairs]]
    )
    t = data.true_returns[segs]
    ok = np.isfinite(t)
    # two points always correlate +-1: at least three segments with true returns
    corr = pearson(mean_ret[ok], t[ok]) if ok.sum() >= 3 else math.nan
    mean, std = _mean_std(*sums)
    return {
        "loss": m["loss"],
        "accuracy": m["accuracy"],
        "oracle_agreement": agree,
        "oracle_pairs": float(n_or),
        "return_corr": corr,
        "disagreement": float(rets.std(0).mean()) if len(models) > 1 else 0.0,
        "step_mean": mean,
        "step_std": std,
    }


def norm_stats(
    models: Sequence[AnyRewardModel], data: PreferenceData, segs: np.ndarray, device: torch.device
) -> tuple[float, float]:
    """Mean and std of the per-step predictions over segments ``segs`` (eval mode)."""
    _, sums = predict_segment_returns(lean_nets(models, device), data, segs, device, models[0].arch)
    return _mean_std(*sums)


def true_step_stats(data: PreferenceData, segs: np.ndarray) -> tuple[float, float] | None:
    """Mean and std of the true per-step score over ``segs``, the clips ``norm_stats`` measures the
    model on (the lab's oracle arm normalises with them under --reward-norm labels:
    ``experiments.lab_a2c``). None where a segment has no true rewards."""
    if not len(segs) or not np.isfinite(data.true_returns[segs]).all():
        return None
    s1 = s2 = 0.0
    count = 0
    for i in segs:
        seg = decode_segment(data.blobs[int(i)], data.names[int(i)])
        if seg.rewards is None:
            return None
        r = np.asarray(seg.rewards, dtype=np.float64)
        s1, s2, count = s1 + float(r.sum()), s2 + float((r * r).sum()), count + len(r)
    return _mean_std(s1, s2, count) if count else None


# --- any DB's segments (--evaluate, experiments) ---------------------------------------------


@dataclass
class SegmentPredictions:
    """The model's and the game's rewards for a set of segments."""

    names: list[str]
    pred_returns: np.ndarray  # (S,)
    true_returns: np.ndarray  # (S,)
    pred_steps: np.ndarray  # (sum of lengths,)
    true_steps: np.ndarray  # (sum of lengths,)
    skipped: int = 0  # unreadable segments, or segments without true rewards
    facts: list[SegmentFacts] = field(default_factory=list)  # per segment, where asked for (a teacher's view)


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


def all_pairs_agreement(pred: np.ndarray, true: np.ndarray) -> tuple[float, int]:
    """``oracle_agreement`` over every unordered pair of the segments (S*(S-1)/2 pairs)."""
    i, j = np.triu_indices(len(pred), k=1)
    pred, true = np.asarray(pred, dtype=np.float64), np.asarray(true, dtype=np.float64)
    return oracle_agreement(pred[i], pred[j], true[i], true[j])


def predict_segments(
    rm: RewardPredictor,
    db: str | os.PathLike,
    names: Sequence[str],
    warn: Callable[[str], None] = warn,
    facts: bool = False,
) -> SegmentPredictions:
    """Per-step predictions of the model for ``names`` of a DB; segments that cannot be read or
    have no true rewards (the book's) are skipped, with one warning each for broken ones. With
    ``facts``, also what a teacher knows of each segment (``lib.models.teachers.segment_facts``)."""
    kept, pr, tr, ps, ts = [], [], [], [], []
    seen: list[SegmentFacts] = []
    game = (db_game(db, warn=None) or (None, None))[0] if facts else None
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
        if facts:
            seen.append(segment_facts(seg.frames, seg.rewards, seg.dones, game))
    cat = (lambda xs: np.concatenate(xs)) if ps else (lambda xs: np.zeros(0))
    return SegmentPredictions(kept, np.array(pr), np.array(tr), cat(ps), cat(ts), skipped, seen)


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
        [f for p in parts for f in p.facts],
    )


@dataclass
class TeacherScores:
    """Agreement with a teacher's own answers (``teacher_agreement``); NaN where it prefers no pair.
    ``by_rule``: (agreement, pairs) of the pairs each deciding rule decided."""

    teacher: str
    death_penalty: float
    pairs: int
    agreement: float
    by_rule: dict[str, tuple[float, int]]

    def text(self) -> str:
        who = f"{self.teacher} teacher"
        if TEACHER_ENTRIES[self.teacher].death_penalty is not None:
            who += f" (death penalty {self.death_penalty:g})"
        rules = ", ".join(f"{rule} {_pct(a)} of {n:,}" for rule, (a, n) in self.by_rule.items())
        pairs = f"{self.pairs:,} pairs it prefers one of" + (f": {rules}" if rules else "")
        return f"{who} agreement {_pct(self.agreement)} ({pairs})"


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def teacher_agreement(p: SegmentPredictions, teacher: Teacher) -> TeacherScores:
    """Over every unordered pair of ``p.facts`` that ``teacher`` prefers one of by its own rule (no
    random answers): the share whose predicted returns order them as the teacher does (a predicted
    tie is wrong), overall and per deciding rule."""
    i, j = np.triu_indices(len(p.facts), k=1)
    verdicts = [teacher.judge_rule(p.facts[a], p.facts[b]) for a, b in zip(i, j, strict=True)]
    answers = np.array([answer for answer, _ in verdicts], dtype=np.int64)
    rules = np.array([rule for _, rule in verdicts], dtype=object)
    prefers = (answers == FIRST_BETTER) | (answers == SECOND_BETTER)
    pred = np.asarray(p.pred_returns, dtype=np.float64)
    right = np.sign(pred[i] - pred[j]) == np.where(answers == FIRST_BETTER, 1.0, -1.0)

    def share(m: np.ndarray) -> tuple[float, int]:
        n = int(m.sum())
        return (float(right[m].mean()) if n else math.nan), n

    overall, n = share(prefers)
    by_rule = {rule: share(prefers & (rules == rule)) for rule in sorted(set(rules[prefers].tolist()))}
    return TeacherScores(teacher.name, teacher.death_penalty, n, overall, by_rule)


@dataclass
class PayScores:
    """How a model's per-step reward follows the surface rule's per-step pay (``lib.atari.seaquest.step_pay``),
    NaN where undefined: the correlation over all steps and over the low-gauge diver steps alone
    (where the climb's pay lives; the score's steps alone can make the first high), and the share of
    the reward's variance (squared deviations from its mean) on steps the pay is 0."""

    steps: int
    corr: float
    low_diver_steps: int
    low_diver_corr: float
    unpaid_variance: float

    def text(self) -> str:
        share = "n/a" if math.isnan(self.unpaid_variance) else f"{100 * self.unpaid_variance:.0f}%"
        return (
            f"per-step corr with the pay {_r(self.corr)} over {self.steps:,} steps, {_r(self.low_diver_corr)} "
            f"over {self.low_diver_steps:,} low-gauge diver steps; {share} of the reward's variance on steps paid 0"
        )


def pay_scores(
    pred_steps: np.ndarray, pays: Sequence[StepPay], of: Callable[[StepPay], np.ndarray] = lambda p: p.pay
) -> PayScores:
    """``PayScores`` of per-step rewards ``pred_steps`` (F,) against the pay of the same steps, clip
    after clip (``pays``, their lengths summing to F; ``of``: which pay, default the refill teacher's)."""
    pred = np.asarray(pred_steps, dtype=np.float64)
    if not pays:
        return PayScores(0, math.nan, 0, math.nan, math.nan)
    pay = np.concatenate([of(p) for p in pays]).astype(np.float64)
    low = np.concatenate([p.low_diver for p in pays])
    if len(pay) != len(pred):
        raise ValueError(f"{len(pred)} predicted steps for {len(pay)} paid ones")
    dev = (pred - pred.mean()) ** 2 if len(pred) else pred
    total = float(dev.sum())
    unpaid = float(dev[pay == 0].sum()) / total if total > 0 else math.nan
    low_corr = pearson(pred[low], pay[low]) if low.sum() >= 3 else math.nan
    return PayScores(len(pred), pearson(pred, pay), int(low.sum()), low_corr, unpaid)


def _pay_text(p: SegmentPredictions, teacher: Teacher) -> str:
    """``--evaluate``'s pay figures for a teacher that sums the per-step pay; "" for the others."""
    of = TEACHER_ENTRIES[teacher.name].step_pay
    if of is None or any(f.pay is None for f in p.facts):
        return ""
    return "; " + pay_scores(p.pred_steps, [f.pay for f in p.facts if f.pay is not None], of).text()


def evaluate_model(
    rm: RewardPredictor,
    dbs: Sequence[str | os.PathLike],
    teacher: Teacher,
    log: Callable[[str], None] = print,
) -> tuple[Scores, TeacherScores]:
    """``--evaluate``: one line per DB and a total line over all their segments, each with the
    figures against the true score and against ``teacher``'s own answers; returns the total's.
    UserError when no DB has a segment with true rewards."""
    parts = []
    for db in dbs:
        root = Path(db)
        if not root.is_dir():
            raise UserError(f"DB not found: {root}")
        p = predict_segments(rm, root, list_segments(root), facts=True)
        skipped = f" ({p.skipped} skipped: unreadable or without true rewards)" if p.skipped else ""
        log(f"{score(p).line(str(root))}; {teacher_agreement(p, teacher).text()}{_pay_text(p, teacher)}{skipped}")
        parts.append(p)
    total = merge(parts)
    if not total.names:
        raise UserError("no segment with true rewards in " + ", ".join(map(str, dbs)) + ": nothing to score")
    result, by_teacher = score(total), teacher_agreement(total, teacher)
    what = f"total ({len(parts)} DB{'s' if len(parts) > 1 else ''})"
    log(f"{result.line(what)}; {by_teacher.text()}{_pay_text(total, teacher)}")
    return result, by_teacher
