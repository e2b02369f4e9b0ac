"""experiments/quality.py: variants trained on the same labels per seed, scored on never-seen segments."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.dbs import make_square_db
from lib.store.segments import read_segment

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "experiments.quality", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.mark.slow
def test_variants_share_labels_and_are_scored_on_never_seen_segments(tmp_path: Path) -> None:
    db, work = tmp_path / "db", tmp_path / "work"
    make_square_db(db, n_segments=40, steps=10, seed=2)
    args = ["--db", str(db), "--labels", "40", "--seeds", "0,1", "--keep", str(work)]
    args += ["--variant", "d=--arch diff --epochs 2", "--variant", "b=--arch book --epochs 1"]
    p = _run(*args)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "## ablation" in p.stdout and "d: held-out agreement" in p.stdout and "b: per-step corr" in p.stdout
    report = json.loads((work / "quality.json").read_text())
    for seed in ("0", "1"):
        hold = report["holdout"][seed]
        assert len(hold) == 10  # --holdout 0.25 of 40
        # never trained on: the seed's training DB holds none of them, and its labels name none
        labels = (work / f"train-db-s{seed}" / "labels.jsonl").read_text()
        assert not any((work / f"train-db-s{seed}" / rel).exists() or rel in labels for rel in hold)
        returns = [read_segment(db, rel).true_return for rel in hold]
        differ = sum(a != b for a, b in itertools.combinations(returns, 2))
        for name in ("d", "b"):
            fig = next(r for r in report["results"][name] if r["seed"] == int(seed))
            assert fig["teacher_pairs"] == fig["score_pairs"] == differ  # every held-out pair the score orders
            assert 0.0 <= fig["teacher_agreement"] <= 1.0 and fig["s_per_pair"] > 0
    assert report["holdout"]["0"] != report["holdout"]["1"]  # each seed its own split
    # run again: every model is reused, nothing is trained twice
    log = work / "logs" / "d-s0.log"
    before = log.stat().st_mtime_ns
    p = _run(*args)
    assert p.returncode == 0 and log.stat().st_mtime_ns == before
    assert "$ " not in p.stderr  # no training command was started


def test_bad_variant_is_a_one_line_error(tmp_path: Path) -> None:
    p = _run("--db", str(tmp_path), "--variant", "no flags here")
    assert p.returncode == 2 and "--variant must be NAME=" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
