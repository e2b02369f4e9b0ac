"""experiments/sampling.py end to end on a tiny DB (slow: trains seven small reward models)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.dbs import make_square_db
from lib.store.labels import read_label_log

ROOT = Path(__file__).resolve().parents[1]


def run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "experiments.sampling", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.mark.slow
def test_curves_for_every_mode_from_one_shared_start(tmp_path: Path) -> None:
    db = tmp_path / "db"
    make_square_db(db, n_segments=30, steps=8, seed=4)
    out = tmp_path / "out"
    args = ["--db", str(db), "--teachers", "score", "--steps", "6,12", "--ensemble", "2", "--out", str(out)]
    args += ["--", "--epochs", "2", "--patience", "1", "--batch", "4"]
    p = run(*args)
    assert p.returncode == 0, p.stderr[-2000:]
    for mode in ("random", "uncertain", "disagree"):
        for n in (6, 12):
            assert f"| {mode}, {n} labels, 1 seed(s)" in p.stdout
        log = read_label_log(out / f"score-s0/{mode}-12/db")
        assert len(log) == 12 and len({lab.key for lab in log}) == 12
        later = [lab.extra.get("sampling", "random") for lab in log[6:]]
        assert later == [mode] * 6
        assert all("sampling" not in lab.extra for lab in log[:6])  # the shared random start
    assert sorted(d.name for d in (out / "score-s0").iterdir()) == [
        "disagree-12",
        "first-6",
        "random-12",
        "uncertain-12",
    ]
    report = json.loads((out / "sampling.json").read_text())
    pts = report["results"]["score"]["uncertain"]["0"]
    assert [pt["labels"] for pt in pts] == [6, 12] and 0.0 <= pts[1]["teacher_agreement"] <= 1.0
    assert (out / "sampling.png").stat().st_size > 10_000
    split = json.loads((out / "split.json").read_text())
    held = set(split["holdout"])
    assert held and not held & {s for lab in log for s in (lab.sample1, lab.sample2)}
    again = run(*args)  # everything is reused: no training stage runs
    assert again.returncode == 0 and "$ " not in again.stdout
