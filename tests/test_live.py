"""experiments/live.py: the live round's budget and report, its process handling, and the
experiment's one-line mistakes. The whole loop with real processes is
``test_demo_live_runs_and_stops_cleanly`` (slow)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _round_args(out: Path, *extra: str):
    from experiments.round import build_parser

    return build_parser().parse_args(["--out", str(out), "--teacher", "score", "--labels", "100", *extra])


def test_live_plan_is_the_staged_budget() -> None:
    """Three rounds of 100 labels and 500k steps: one 1.5M-step fine-tune and 200 labels after
    round 1's, 0.133 per 1,000 agent steps."""
    from experiments.live import live_plan

    plan = live_plan(_round_args(Path("x"), "--rounds", "3"))
    assert plan["steps"] == 1_500_000 and plan["labels"] == 200
    assert plan["rate"] == pytest.approx(200 / 1500) and plan["retrain_every"] == 25
    assert live_plan(_round_args(Path("x"), "--rounds", "2", "--scale", "0.01"))["steps"] == 10_000


@pytest.mark.parametrize(
    "extra, msg",
    [
        (("--live",), "--rounds 2 or more"),
        (("--live", "--rounds", "3", "--reward-only"), "exclude each other"),
        (("--live", "--rounds", "3", "--sampling", "uncertain"), "random or rare"),
        (("--live", "--rounds", "3", "--from", "v0"), "--from does not apply"),
    ],
)
def test_live_round_mistakes_are_one_line(tmp_path: Path, extra, msg) -> None:
    from experiments.round import check
    from lib.errors import UserError

    with pytest.raises(UserError, match=msg):
        check(_round_args(tmp_path, *extra))
    check(_round_args(tmp_path, "--live", "--rounds", "3"))  # the benchmark's own setting passes


def test_versions_file_is_read_past_a_torn_line(tmp_path: Path) -> None:
    from experiments.live import read_versions, versions_table

    path = tmp_path / "reward-x-versions.jsonl"
    lines = [
        {"version": 1, "labels": 30, "heldout_pairs": 6, "heldout_accuracy": 0.5, "installed": True},
        {"version": 2, "labels": 40, "heldout_pairs": 8, "heldout_accuracy": 0.25, "installed": False, "why": "worse"}
        | {"compared_pairs": 8, "candidate_accuracy": 0.25, "installed_heldout_accuracy": 0.75}
        | {"fresh_pairs": 3, "fresh_accuracy": 2 / 3},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"version": 3, "lab')
    got = read_versions(path)
    assert [v["version"] for v in got] == [1, 2]
    text = versions_table(got)
    assert "| v1 | 30 | 6 | 50% | n/a | n/a |" in text
    assert "| v2 | 40 | 8 | 25% | 25% / 75% (8) | 67% (3) | n/a | no: worse |" in text
    assert read_versions(tmp_path / "none.jsonl") == []


def test_table_puts_the_live_row_beside_the_staged_rounds() -> None:
    from experiments.round_report import table

    row = {"score": 500.0, "score_ci": 20.0, "length": 900.0}
    staged = [{"v0": dict(row), "control": dict(row), "rlhf": dict(row)} for _ in range(3)]
    text = table([*staged, {"live": dict(row, score=640.0)}], arms=("v0", "control", "rlhf", "live"), names=None)
    assert "| 4 | live | 640 ± 20 |" in text
    text = table([*staged, {"live": dict(row, score=640.0)}], ("v0", "control", "rlhf", "live"), ["1", "2", "3", "1-3"])
    lines = text.splitlines()
    assert lines[-1].startswith("| 1-3 | live | 640 ± 20 |") and sum("| v0 |" in x for x in lines) == 1
    assert len(lines) == 2 + 1 + 3 * 2 + 1  # head, v0 once, control and rlhf per round, live


def test_score_stretches_cover_every_game_once() -> None:
    from experiments.live import score_stretches

    xs, ys = list(range(0, 1100, 100)), [float(i) for i in range(11)]
    got = score_stretches(xs, ys, n=5)
    assert sum(n for *_, n in got) == 11 and got[0][:2] == (0, 200) and got[-1][1] == 1000
    assert got[0][2] == pytest.approx(1.0)
    assert score_stretches([], []) == []


def test_stop_sends_ctrl_c_first_and_harder_only_when_ignored(tmp_path: Path) -> None:
    """A child that handles SIGINT ends on it (its exit code says so); one that ignores it is
    stopped with SIGTERM after the grace period."""
    from experiments.live import spawn, stop

    polite = tmp_path / "polite.py"
    polite.write_text(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, lambda *a: sys.exit(7))\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    stubborn = tmp_path / "stubborn.py"
    stubborn.write_text(
        "import signal, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    for script, want in ((polite, 7), (stubborn, -signal.SIGTERM)):
        p = spawn(script.stem, [sys.executable, script], tmp_path / f"{script.stem}.log")
        deadline = time.time() + 20
        while "ready" not in p.logfile.read_text() and time.time() < deadline:
            time.sleep(0.05)
        t = time.time()
        assert stop(p, grace=1.0) == want
        assert time.time() - t < 15


def test_wait_for_names_a_process_that_died(tmp_path: Path) -> None:
    from experiments.live import spawn, wait_for
    from lib.errors import UserError

    p = spawn("dies", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], tmp_path / "dies.log")
    with pytest.raises(UserError, match=r"dies ended \(exit 3\)[\s\S]*boom"):
        wait_for("never", lambda: False, [p], timeout=30, poll=0.1)
