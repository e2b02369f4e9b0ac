"""experiments/reward_bound.py: stage 3's net fitted to the surface rule's per-step pay, on a tiny DB of
real SeaQuest clips (a climb with a low gauge and a diver aboard, a refill, points), then loaded by
``03_reward_train.py --evaluate --teacher refill`` and run by ``01_a2c.py -r``."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_seaquest import CLIMB_PLAN, STAY_PLAN

from bench.dbs import REFILL_PLAN, cut, play_plan
from lib.store.segment_writer import save_segment

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def paid_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every 25-step stretch of three real plays, as segments of one DB (68 segments)."""
    db = tmp_path_factory.mktemp("bound") / "db"
    k = 0
    for plan in (CLIMB_PLAN, STAY_PLAN, REFILL_PLAN):
        record = play_plan(plan)
        for start in range(0, len(record) - 25 + 1, 25):
            seg = dataclasses.replace(cut(record, start, start + 25, step=start + 25), env_index=k % 8)
            save_segment(db, dataclasses.replace(seg, step=1000 * k + start + 25), fsync=False)
            k += 1
    return db


def run(*args: str | Path, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_fit_follows_the_pay_and_its_model_runs_in_stages_3_and_1(paid_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "bound" / "reward-bound.pt"
    p = run("-m", "experiments.reward_bound", paid_db, "-o", out, "--epochs", "100", "--patience", "100")
    assert p.returncode == 0, p.stderr
    held = re.search(r"held-out \(\d+ segments\): per-step corr with the pay ([-+.\d]+) over ([\d,]+) steps", p.stdout)
    train = re.search(r"training \(\d+ segments\): per-step corr with the pay ([-+.\d]+)", p.stdout)
    assert held and train, p.stdout
    assert float(train.group(1)) > 0.5  # a regression on the pay follows it where it was fitted
    ck = torch.load(out, weights_only=True)
    assert ck["arch"] == "diff" and ck["metrics"]["bound_train_corr"] == pytest.approx(float(train.group(1)), abs=1e-3)
    assert json.loads(out.with_suffix(".json").read_text())["bound_epochs"] >= 1

    # Stage 3's --evaluate scores it against the refill teacher, with the per-step correlation.
    p = run("03_reward_train.py", "--evaluate", out, paid_db, "--teacher", "refill")
    assert p.returncode == 0, p.stderr
    line = p.stdout.strip().splitlines()[-1]
    assert "refill teacher agreement" in line and "per-step corr with the pay +" in line, line
    assert "low-gauge diver steps" in line and "of the reward's variance on steps paid 0" in line

    # Stage 1 trains on it.
    save = tmp_path / "saves"
    p = run(
        "01_a2c.py", "-n", "b", "-r", out, "--max-steps", "64", "--envs", "2", "--test-every", "0", "--save", save,
        "--runs-dir", tmp_path / "tb",
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert (save / "last.pt").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nowhere"], "DB not found"),
        (["DB", "-o", "DIR"], "is a directory"),
        (["DB", "--test-share", "1.5"], "--test-share"),
        (["DB", "--diff-flow-scene"], "--diff-flow-scene needs --diff-flow"),
    ],
)
def test_mistakes_are_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "dir").mkdir()
    (tmp_path / "db").mkdir()
    words = [str(tmp_path / "db") if a == "DB" else str(tmp_path / "dir") if a == "DIR" else a for a in args]
    if "-o" not in words:
        words += ["-o", str(tmp_path / "m.pt")]
    p = run("-m", "experiments.reward_bound", *words)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr
