"""The refill's ladder: one row per fine-tune, the figures that say where the surface rule's pay is
lost on its way to the policy. Each rung is a fine-tune of the same v0 with the same learner
(``--start-states``, ``--finetune --lr 7e-4 --kl-target 0.1``, 300k steps), paid: (a) the rule
itself (``experiments.refill_levers --pay both``); (c) a net fitted to the pay
(``experiments.reward_bound``) through ``-r``; (d) preference models of the refill teacher's labels
through ``-r``. The first rung that falls below half of the rung above is where the pay is lost.

Per arm this measures what the others leave on disk: the reward model's per-step correlation with
the pay on a held-out DB (``lib.reward.eval.pay_scores``: the refill teacher's pay, and the moves
teacher's, whose climb is a function of the step alone), the KL to the start policy a step and on
low-gauge steps and the coefficient at the end (the run's TensorBoard; the low-gauge KL is logged by
fine-tunes run through ``experiments.lab_a2c`` or ``experiments.refill_levers``, and is empty for a
plain ``01_a2c.py`` run), the probe from the held-out
states (``experiments.probe``), and full games (``lib.play.play``): score, refills a game, best single
life. Rows go to ``--out`` (JSON, one object per arm, a re-measured arm replaced); the table of all
rows is printed.

    python -m experiments.ladder --arm c-s0 --run runs/ft/c-s0 --reward runs/bound/reward-bound.pt \
        --eval-db runs/sdb2 --states runs/probe/states --out runs/ladder/rows.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lib.core.errors import UserError, run_cli
from lib.core.files import atomic_write
from lib.core.settings import build_parser as settings_parser
from lib.core.settings import check_fields, in_range, setting

GROUPS = {"arm": "the arm", "measure": "what is measured", "output": "output"}
KL_TAIL = 20  # KL figures: the mean of the last this many logged values


@dataclass(frozen=True)
class LadderSettings:
    """What ``python -m experiments.ladder`` is told, one field per flag."""

    arm: str | None = setting(None, "the arm's name in the table (with --run)", group="arm")
    run: str | None = setting(None, "the fine-tune's save directory (its last.pt, refill_levers.json)", group="arm")
    reward: str | None = setting(None, "the reward model the arm learnt from (none: the rule paid)", group="arm")
    eval_db: str | None = setting(
        None, "a DB none of the arm's models trained on: the pay correlations", group="measure"
    )
    states: str = setting("runs/probe/states", "the probe's held-out states", group="measure")
    games: int = setting(30, "full games played", group="measure", checks=in_range("--games", 0, 1000))
    seed: int = setting(7, "the full games' seed", group="measure")
    out: str = setting("runs/ladder/rows.json", "the rows, kept between calls", group="output")


def build_parser() -> argparse.ArgumentParser:
    return settings_parser(
        LadderSettings,
        "python -m experiments.ladder",
        "Measure one rung of the refill's ladder (module docstring)",
        GROUPS,
    )


def tb_tail(tb_dir: Path, tag: str, n: int = KL_TAIL) -> float:
    """The mean of the last ``n`` values of a scalar in a TensorBoard run (NaN when it has none)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    if tag not in acc.Tags().get("scalars", []):
        return math.nan
    values = [e.value for e in acc.Scalars(tag)]
    return float(np.mean(values[-n:])) if values else math.nan


def pay_figures(reward: Path, db: Path) -> dict[str, float]:
    """The model's per-step correlation with the pay on ``db`` (``PayScores``)."""
    from lib.models.reward import load_reward_model
    from lib.models.teachers import TEACHER_ENTRIES
    from lib.reward.eval import pay_scores, predict_segments
    from lib.store.segments import list_segments

    p = predict_segments(load_reward_model(reward), db, list_segments(db), facts=True)
    pays = [f.pay for f in p.facts if f.pay is not None]
    s, m = pay_scores(p.pred_steps, pays), pay_scores(p.pred_steps, pays, TEACHER_ENTRIES["moves"].step_pay)
    return {
        "corr": s.corr,
        "low_diver_corr": s.low_diver_corr,
        "unpaid_variance": s.unpaid_variance,
        "moves_corr": m.corr,
        "moves_low_diver_corr": m.low_diver_corr,
    }


def measure(s: LadderSettings) -> dict[str, Any]:
    import torch

    from experiments.probe import main as probe_main
    from lib.atari.behaviour import behaviour_stats
    from lib.atari.games import best_life
    from lib.play.config import PlayConfig
    from lib.play.play import play

    run = Path(s.run or "")
    last = run / "last.pt"
    if not last.is_file():
        raise UserError(f"--run {run}: no last.pt (a finished fine-tune's save directory)")
    ck = torch.load(last, weights_only=True, map_location="cpu")
    row: dict[str, Any] = {"arm": s.arm, "run": str(run)}
    if s.reward and s.eval_db:
        row.update(pay_figures(Path(s.reward), Path(s.eval_db)))
    tb = Path(str(ck.get("tb_dir", "")))
    if tb.is_dir():
        row["kl"] = tb_tail(tb, "finetune/kl_to_start")
        row["kl_low"] = tb_tail(tb, "finetune/kl_low_gauge")
        row["coef"] = tb_tail(tb, "finetune/kl_coef", 1)
    levers = run / "refill_levers.json"
    if levers.is_file():
        lv = json.loads(levers.read_text())
        row["train_climb_steps"], row["train_refills"], row["train_games"] = (
            lv.get("climb_steps"),
            lv.get("refills"),
            lv.get("games"),
        )
    probe_out = run / "probe.json"
    probe_main(["--states", s.states, "--policy", str(last), "--out", str(probe_out)])
    (p,) = json.loads(probe_out.read_text())
    row.update({f"probe_{k}": p[k] for k in ("refill", "drowned", "died_otherwise", "climbed")})
    if s.games:
        results = play(PlayConfig(model=str(last), episodes=s.games, seed=s.seed), log=lambda _: None)
        scores = np.array([r.score for r in results], dtype=np.float64)
        life = best_life(results)
        stats = behaviour_stats(results)
        row.update(
            score=float(scores.mean()),
            score_std=float(scores.std()),
            refills_per_game=stats.get("refills_per_game"),
            best_life=list(life) if life else None,
        )
    return row


def _f(v: Any, fmt: str) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, fmt)


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| arm | corr (all) | corr (low-gauge diver) | moves corr (all) | moves corr (low-gauge diver) "
        "| KL/step | KL low gauge | coef at end | probe: refill | "
        "drowned | died otherwise | rows climbed | full games: score | refills a game | best single life |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        life = r.get("best_life")
        lines.append(
            f"| {r['arm']} | {_f(r.get('corr'), '+.2f')} | {_f(r.get('low_diver_corr'), '+.2f')} "
            f"| {_f(r.get('moves_corr'), '+.2f')} | {_f(r.get('moves_low_diver_corr'), '+.2f')} "
            f"| {_f(r.get('kl'), '.3f')} | {_f(r.get('kl_low'), '.3f')} | {_f(r.get('coef'), '.3f')} "
            f"| {_f(r.get('probe_refill'), '.0%')} | {_f(r.get('probe_drowned'), '.0%')} "
            f"| {_f(r.get('probe_died_otherwise'), '.0%')} | {_f(r.get('probe_climbed'), '.1f')} "
            f"| {_f(r.get('score'), '.1f')} ± {_f(r.get('score_std'), '.1f')} | {_f(r.get('refills_per_game'), '.2f')} "
            f"| {f'{life[0]:g} in {life[1]:,}' if life else ''} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    s = LadderSettings(**vars(build_parser().parse_args(argv)))
    check_fields(s)
    if (s.arm is None) != (s.run is None):
        raise UserError("--arm and --run go together")
    out = Path(s.out)
    rows: list[dict[str, Any]] = json.loads(out.read_text()) if out.is_file() else []
    if s.run is not None:
        row = measure(s)
        rows = [r for r in rows if r["arm"] != s.arm] + [row]
        clean = json.dumps(rows, indent=1, default=float).replace("NaN", "null")
        atomic_write(out, clean.encode())
    print(table(rows))
    return 0


if __name__ == "__main__":
    run_cli(lambda: main(sys.argv[1:]))
