"""experiments/ladder.py: the refill ladder's table of rows, and its command's mistakes."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from experiments.ladder import table

ROOT = Path(__file__).resolve().parents[1]


def test_the_table_has_one_row_an_arm_and_leaves_unmeasured_cells_empty() -> None:
    rows = [
        {"arm": "a s0", "probe_refill": 0.57, "probe_drowned": 0.08, "probe_died_otherwise": 0.35,
         "probe_climbed": 61.7, "score": 665.3, "score_std": 144.8, "refills_per_game": 0.77,
         "best_life": [520.0, 1110], "kl": 0.097, "kl_low": 0.401, "coef": 0.031},
        {"arm": "c s0", "corr": 0.91, "low_diver_corr": math.nan, "probe_refill": 0.0},
    ]  # fmt: skip
    lines = table(rows).splitlines()
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
    want = "| a s0 |  |  |  |  | 0.097 | 0.401 | 0.031 | 57% | 8% | 35% | 61.7 | 665.3 ± 144.8 | 0.77 | 520 in 1,110 |"
    assert lines[2] == want
    assert lines[3].startswith("| c s0 | +0.91 |  |  |")  # NaN: not measured, an empty cell


def test_arm_and_run_go_together_and_rows_are_kept(tmp_path: Path) -> None:
    out = tmp_path / "rows.json"
    out.write_text(json.dumps([{"arm": "kept", "probe_refill": 0.5}]))
    p = subprocess.run(
        [sys.executable, "-m", "experiments.ladder", "--arm", "x", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "--arm and --run go together" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "experiments.ladder", "--out", str(out)], cwd=ROOT, capture_output=True, text=True
    )
    assert p.returncode == 0 and "| kept |" in p.stdout and "50%" in p.stdout
    p = subprocess.run(
        [sys.executable, "-m", "experiments.ladder", "--arm", "y", "--run", str(tmp_path), "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "no last.pt" in p.stderr
