"""Scoring a trained reward model on DBs (lib/reward/eval.py, ``03_reward_train.py --evaluate``)."""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.dbs import action_model, make_square_db, write_action_db, write_legacy_segment
from lib.label_ui.oracle import oracle_label_db
from lib.models.reward import load_reward_model
from lib.models.teachers import Teacher
from lib.reward.config import TrainConfig
from lib.reward.data import load_preferences
from lib.reward.eval import all_pairs_agreement, evaluate_model, predict_segments, score
from lib.reward.train import train_reward_model
from lib.store.checkpoints import read_checkpoint
from lib.store.segments import list_segments, read_segment

ROOT = Path(__file__).resolve().parents[1]


def test_all_pairs_agreement_by_hand() -> None:
    pred = [0.0, 1.0, 2.0, 2.0]
    true = [0.0, 2.0, 1.0, 5.0]
    # (0,1) ok, (0,2) ok, (0,3) ok, (1,2) wrong order, (1,3) ok, (2,3) a predicted tie: wrong
    assert all_pairs_agreement(np.array(pred), np.array(true)) == (pytest.approx(4 / 6), 6)
    # pairs with equal true returns are left out: only (0,1) and (0,2) remain, (0,1) is a tie
    share, n = all_pairs_agreement(np.array([0.0, 0.0, 1.0]), np.array([1.0, 2.0, 2.0]))
    assert (share, n) == (pytest.approx(0.5), 2)
    share, n = all_pairs_agreement(np.array([1.0, 2.0]), np.array([3.0, 3.0]))
    assert math.isnan(share) and n == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A square-rule DB, a model trained on it for a few epochs, and the same model made constant."""
    tmp = tmp_path_factory.mktemp("eval")
    db = tmp / "db"
    make_square_db(db, n_segments=24, steps=10, seed=0)
    oracle_label_db(db, 80, seed=1)
    data = load_preferences([db], log=lambda _: None)
    res = train_reward_model(
        data, TrainConfig(epochs=3, batch=16, lr=1e-3, seed=0), tmp / "r.pt", progress=False, log=lambda _: None
    )
    ck = read_checkpoint(res.path, "reward model")
    for state in ck["state_dicts"]:
        state["out.2.weight"].zero_()  # the last layer ignores its input: every step predicts the bias
    flat = tmp / "flat.pt"
    torch.save(ck, flat)
    return db, res.path, flat


def run_evaluate(model: Path, *args: Path | str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "03_reward_train.py"), "--evaluate", str(model), *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.slow
def test_evaluate_a_constant_model_orders_nothing(trained: tuple[Path, Path, Path]) -> None:
    db, _, flat = trained
    returns = [read_segment(db, rel).true_return for rel in list_segments(db)]
    differ = sum(a != b for a, b in itertools.combinations(returns, 2))
    p = run_evaluate(flat, db)
    assert p.returncode == 0, p.stderr
    # Every pair is a predicted tie: wrong by the one rule; a constant prediction has no correlation.
    assert f"oracle agreement 0.0% ({differ:,} pairs" in p.stdout
    assert "return corr n/a, per-step corr n/a" in p.stdout


@pytest.mark.slow
def test_evaluate_matches_a_pair_by_pair_count(trained: tuple[Path, Path, Path], tmp_path: Path) -> None:
    db, model, _ = trained
    other = tmp_path / "db2"
    make_square_db(other, n_segments=12, steps=10, seed=7)
    write_legacy_segment(other / "00" / "00099999.dat", np.zeros((10, 48, 48, 3), np.uint8), np.zeros(10, int))
    rm = load_reward_model(model)
    ok = n = 0
    pred, true = [], []
    for d in (db, other):
        for rel in list_segments(d):
            seg = read_segment(d, rel)
            if seg.rewards is None:
                continue
            nxt = np.concatenate([seg.frames[1:], seg.frames[-1:]])  # each step's next frame; the last: itself
            pred.append(float(rm.predict(seg.frames, seg.actions, nxt).sum()))
            true.append(seg.true_return)
    for i, j in itertools.combinations(range(len(pred)), 2):
        if true[i] != true[j]:
            n += 1
            ok += np.sign(pred[i] - pred[j]) == np.sign(true[i] - true[j])
    p = run_evaluate(model, db, other)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert lines[1].startswith(f"{db}: 24 segments") and lines[2].startswith(f"{other}: 12 segments")
    assert "(1 skipped: unreadable or without true rewards)" in lines[2]
    total = re.search(r"total \(2 DBs\): 36 segments, oracle agreement ([0-9.]+)% \(([0-9,]+) pairs", lines[3])
    assert total is not None
    assert float(total[1]) == pytest.approx(100 * ok / n, abs=0.05) and int(total[2].replace(",", "")) == n
    # the library function experiments/quality.py uses gives the same figures for one DB
    s = score(predict_segments(rm, db, list_segments(db)))
    assert f"oracle agreement {100 * s.agreement:.1f}%" in lines[1] and f"per-step corr {s.step_corr:+.3f}" in lines[1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--evaluate", "missing.pt", "DB"], "not found"),
        (["--evaluate", "MODEL", "nope-db"], "DB not found"),
        (["DB"], "training needs -n NAME and -o OUTDIR"),
    ],
)
def test_evaluate_bad_input_one_line_exit_2(trained: tuple[Path, Path, Path], args: list[str], message: str) -> None:
    db, model, _ = trained
    argv = [str(db) if a == "DB" else str(model) if a == "MODEL" else a for a in args]
    p = subprocess.run(
        [sys.executable, str(ROOT / "03_reward_train.py"), *argv], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


@pytest.fixture
def died_for_points(tmp_path: Path) -> tuple[Path, Path]:
    """Three clips and a model that orders them by the score: 20 points with a lost life, 10, 0
    (each clip takes one action on every step; the model pays 3, 2 and 1 a step for those actions).
    The score teacher at its default penalty (100) orders them 10 > 0 > 20-with-a-death."""
    db = tmp_path / "db"
    write_action_db(db, [(0, 2.0), (1, 1.0), (2, 0.0)], t=10, size=64, lose_life=(0,))
    return db, action_model(64, tmp_path / "model.pt", [{0: 3.0, 1: 2.0, 2: 1.0}])


def test_evaluate_scores_against_the_teachers_rule_beside_the_bare_score(died_for_points) -> None:
    db, model = died_for_points
    rm = load_reward_model(model)
    lines: list[str] = []
    bare, by_teacher = evaluate_model(rm, [db], Teacher("score", death_penalty=100.0), log=lines.append)
    assert (bare.agreement, bare.pairs) == (1.0, 3)  # 30 > 20 > 10 predicted, 20 > 10 > 0 scored
    # The teacher prefers both clips over the one that died: the model got those two pairs wrong.
    assert (by_teacher.agreement, by_teacher.pairs) == (pytest.approx(1 / 3), 3)
    assert by_teacher.by_rule == {"death": (0.0, 2), "score": (1.0, 1)}
    bare_line = "3 segments, oracle agreement 100.0% (3 pairs with different true returns), return corr +1.000"
    want = "score teacher (death penalty 100) agreement 33.3% (3 pairs it prefers one of: death 0.0% of 2, "
    want += "score 100.0% of 1)"
    assert lines[0] == f"{db}: {bare_line}, per-step corr +1.000; {want}"
    assert lines[1].startswith("total (1 DB): 3 segments, oracle agreement 100.0%") and lines[1].endswith(want)
    # At penalty 0 the teacher is the bare score.
    _, plain = evaluate_model(rm, [db], Teacher("score"), log=lines.append)
    assert (plain.agreement, plain.pairs, plain.by_rule) == (1.0, 3, {"score": (1.0, 3)})


@pytest.mark.slow
def test_evaluate_cli_takes_the_teacher_and_its_death_penalty(died_for_points) -> None:
    db, model = died_for_points
    p = run_evaluate(model, db)
    assert p.returncode == 0, p.stderr
    assert "oracle agreement 100.0%" in p.stdout and "score teacher (death penalty 100) agreement 33.3%" in p.stdout
    p = run_evaluate(model, db, "--death-penalty", "0")
    assert p.returncode == 0 and "score teacher (death penalty 0) agreement 100.0% (3 pairs" in p.stdout, p.stderr
    # The gauge teachers cannot read 64x64 frames: they prefer no pair.
    p = run_evaluate(model, db, "--teacher", "surface")
    assert p.returncode == 0 and "surface teacher agreement n/a (0 pairs it prefers one of)" in p.stdout, p.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--evaluate", "MODEL", "DB", "--teacher", "surface", "--death-penalty", "5"], "ranks lost lives already"),
        (["--evaluate", "MODEL", "DB", "--death-penalty", "-1"], "--death-penalty must be a number of points >= 0"),
        (["-n", "x", "-o", "OUT", "DB", "--teacher", "oxygen"], "--teacher applies to --evaluate only"),
        (["--evaluate", "MODEL", "BREAKOUT", "--teacher", "oxygen"], "reads SeaQuest's oxygen gauge"),
    ],
)
def test_evaluate_teacher_mistakes_one_line_exit_2(died_for_points, tmp_path: Path, args, message) -> None:
    db, model = died_for_points
    breakout = tmp_path / "breakout"
    make_square_db(breakout, n_segments=2, steps=4, env_id="BreakoutNoFrameskip-v4")
    paths = {"DB": db, "MODEL": model, "OUT": tmp_path / "out", "BREAKOUT": breakout}
    argv = [str(paths.get(a, a)) for a in args]
    p = subprocess.run(
        [sys.executable, str(ROOT / "03_reward_train.py"), *argv], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()  # nothing trained


def test_pay_scores_by_hand() -> None:
    """``--evaluate --teacher refill``'s figures: the per-step correlation with the pay over all steps
    and over the low-gauge diver steps, and the share of the reward's variance where the pay is 0."""
    from lib.atari.seaquest import StepPay
    from lib.reward.eval import pay_scores

    def clip(pay: list[float], low: list[bool]) -> StepPay:
        z = np.zeros(len(pay), dtype=bool)
        return StepPay(np.array(pay, dtype=np.float32), z, z, np.array(low), np.zeros(len(pay), np.int8))

    pays = [clip([0, 1, 0, 2], [False, True, True, True]), clip([1, 0], [True, False])]
    pred = np.array([0.0, 1.0, 0.0, 2.0, 1.0, 0.0])  # the pay itself
    s = pay_scores(pred, pays)
    assert (s.steps, s.low_diver_steps) == (6, 4)
    assert s.corr == pytest.approx(1.0) and s.low_diver_corr == pytest.approx(1.0)
    # mean 2/3: the three unpaid steps hold 3 * (2/3)^2 = 4/3 of the total 10/3
    assert s.unpaid_variance == pytest.approx(0.4)
    flipped = pay_scores(-pred, pays)
    assert flipped.corr == pytest.approx(-1.0) and flipped.unpaid_variance == pytest.approx(0.4)
    with pytest.raises(ValueError, match="predicted steps"):
        pay_scores(pred[:5], pays)
