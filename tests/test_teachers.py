"""Synthetic teachers and the SeaQuest oxygen reading (lib/teachers.py), on real ALE frames whose
story is known: a voluntary refill, an oxygen death with the blinking gauge, an enemy kill."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.dbs import (
    ENEMY_DEATH_PLAN,
    OXYGEN_DEATH_PLAN,
    OXYGEN_DEATH_STEP,
    REFILL_PLAN,
    REFILL_STEP,
    cut,
    make_synthetic_db,
    play_plan,
)
from lib.errors import UserError
from lib.labels import CANT_TELL, EQUAL, FIRST_BETTER, SECOND_BETTER, read_label_log
from lib.oracle import oracle_label_db
from lib.seaquest import GAUGE_COLS, GAUGE_ROWS, GAUGE_WHITE, OxygenCounts, oxygen_counts, oxygen_levels
from lib.segments import Segment, save_segment
from lib.teachers import SegmentFacts, Teacher

ROOT = Path(__file__).resolve().parents[1]
SUB_YELLOW = (187, 187, 53)  # the player's submarine
SURFACE_Y = 46  # its top row when it floats at the surface


@pytest.fixture(scope="module")
def refill() -> Segment:
    return play_plan(REFILL_PLAN)


@pytest.fixture(scope="module")
def oxygen_death() -> Segment:
    return play_plan(OXYGEN_DEATH_PLAN)


@pytest.fixture(scope="module")
def enemy_death() -> Segment:
    return play_plan(ENEMY_DEATH_PLAN)


def sub_top(frame: np.ndarray) -> int | None:
    """Top row of the player's sub in the water area, None while it is not drawn."""
    rows = np.flatnonzero((frame[40:160] == SUB_YELLOW).all(-1).any(1))
    return int(rows[0]) + 40 if len(rows) else None


def white_pixels(frame: np.ndarray) -> int:
    return int((frame[GAUGE_ROWS, GAUGE_COLS] == GAUGE_WHITE).all(-1).sum(1).max())


def test_gauge_reads_the_known_levels(refill: Segment) -> None:
    levels = oxygen_levels(refill.frames)
    # A new game: the gauge fills from 1 pixel by 2 per agent step while the sub waits.
    assert levels[:8].tolist() == [1, 3, 5, 7, 9, 11, 13, 15]
    assert levels[31:48].tolist() == [63] * 17
    # Under water from step 48 to the surfacing at 146: one pixel less every 8 agent steps.
    assert levels[48:REFILL_STEP].tolist() == [62 - i // 8 for i in range(REFILL_STEP - 48)]
    assert oxygen_levels(refill.frames[0]).shape == () and oxygen_levels(np.zeros((210, 160, 3), np.uint8)) == -1


def test_a_voluntary_refill_is_counted_once(refill: Segment) -> None:
    counts = oxygen_counts(refill.frames, refill.dones)
    assert counts == OxygenCounts(refills=1, deaths=0, oxygen_deaths=0)
    # The rise the tracker counted starts where the sub reached the surface.
    assert sub_top(refill.frames[REFILL_STEP]) == SURFACE_Y
    assert sub_top(refill.frames[REFILL_STEP - 20]) > SURFACE_Y + 20
    levels = oxygen_levels(refill.frames)
    assert levels[REFILL_STEP + 1] > levels[REFILL_STEP] > levels[REFILL_STEP - 1]
    # The game's own start (the gauge filling from 1) is not a refill: the record up to the dive.
    assert oxygen_counts(refill.frames[: REFILL_STEP - 1], refill.dones[: REFILL_STEP - 1]).refills == 0


def test_a_record_that_starts_mid_rise_counts_no_refill(refill: Segment) -> None:
    # Starting 3 steps into the refill the tracker cannot tell a refill from a respawn: no count.
    assert oxygen_counts(refill.frames[REFILL_STEP + 3 :], None).refills == 0
    # Starting 10 steps before it, the rise is seen from its start.
    assert oxygen_counts(refill.frames[REFILL_STEP - 10 :], None).refills == 1
    # Two steps before it the gauge holds still (50, 50): steady, then a rise from 50.
    assert oxygen_counts(refill.frames[REFILL_STEP - 2 :], None).refills == 1


def test_oxygen_death_with_a_blinking_gauge(oxygen_death: Segment) -> None:
    seg, t = oxygen_death, OXYGEN_DEATH_STEP
    assert seg.dones[t] and not seg.dones[:t].any()
    levels = oxygen_levels(seg.frames)
    blink = [i for i in range(t) if levels[i] > 0 and white_pixels(seg.frames[i]) == 0]
    assert len(blink) > 40 and blink[0] > 400, "the gauge blinks (white part hidden) while oxygen is low"
    # The red part does not blink: the reading falls steadily to empty before the death.
    assert (np.diff(levels[60:t]) <= 0).all() and levels[t - 20 : t].max() == 0 and levels[t - 30] == 2
    counts = oxygen_counts(seg.frames, seg.dones)
    # The new sub's gauge fills from empty by itself afterwards: a respawn, not a refill.
    assert levels[-1] > 20 and (np.diff(levels[t + 1 :]) >= 0).all()
    assert counts == OxygenCounts(refills=0, deaths=1, oxygen_deaths=1)


def test_an_enemy_kill_is_not_an_oxygen_death(enemy_death: Segment) -> None:
    seg = enemy_death
    death = int(np.flatnonzero(seg.dones)[0])
    levels = oxygen_levels(seg.frames)
    before = levels[: death - 20]
    assert before[-1] > 40  # the gauge jumped from plenty of oxygen straight to empty
    assert oxygen_counts(seg.frames, seg.dones) == OxygenCounts(refills=0, deaths=1, oxygen_deaths=0)


def facts(ret: float | None, refills: int = 0, oxygen_deaths: int = 0) -> SegmentFacts:
    return SegmentFacts(ret, OxygenCounts(refills, oxygen_deaths, oxygen_deaths))


def test_teacher_rules() -> None:
    score, oxygen = Teacher("score"), Teacher("oxygen")
    assert score.judge(facts(20), facts(0)) == FIRST_BETTER
    assert score.judge(facts(0, refills=1), facts(20)) == SECOND_BETTER  # the score ignores oxygen
    assert score.judge(facts(5), facts(5)) == EQUAL
    assert Teacher("score", ties="skip").judge(facts(5), facts(5)) == CANT_TELL
    assert score.judge(facts(None), facts(5)) == CANT_TELL
    # Oxygen: an oxygen death is the worst event, then refills count, then the score decides.
    assert oxygen.judge(facts(100, oxygen_deaths=1), facts(0)) == SECOND_BETTER
    assert oxygen.judge(facts(0, refills=1), facts(100)) == FIRST_BETTER
    assert oxygen.judge(facts(0, refills=2, oxygen_deaths=1), facts(0, refills=0)) == SECOND_BETTER
    assert oxygen.judge(facts(10), facts(30)) == SECOND_BETTER
    assert oxygen.judge(facts(10), facts(10)) == EQUAL
    assert oxygen.judge(SegmentFacts(10, None), facts(0)) == CANT_TELL  # no gauge: cannot judge
    with pytest.raises(ValueError):
        Teacher("taste")
    with pytest.raises(ValueError):
        Teacher("score", noise=1.5)


def test_teacher_noise_is_the_papers_share_of_random_answers() -> None:
    n, p = 20_000, 0.3
    t = Teacher("score", noise=p, rng=np.random.default_rng(0))
    answers = np.array([t.answer(facts(0), facts(10)) for _ in range(n)])
    assert set(answers.tolist()) <= {FIRST_BETTER, SECOND_BETTER}
    # Wrong answers come from the random share only, half of it: p/2 = 15% (4 sigma bounds).
    wrong = (answers == FIRST_BETTER).mean()
    sigma = np.sqrt(p / 2 * (1 - p / 2) / n)
    assert abs(wrong - p / 2) < 4 * sigma
    # A tie is never answered by a random answer of the noise share (it picks #1 or #2).
    ties = [t.answer(facts(3), facts(3)) for _ in range(2000)]
    assert 0.2 < np.mean([a != EQUAL for a in ties]) < 0.4
    assert all(Teacher("score").answer(facts(0), facts(10)) == SECOND_BETTER for _ in range(100))


def test_oracle_with_the_oxygen_teacher_on_real_segments(
    tmp_path: Path, refill: Segment, oxygen_death: Segment
) -> None:
    db = tmp_path / "db"
    with_refill = cut(refill, REFILL_STEP - 20, REFILL_STEP + 30)  # 1 refill, no points
    plain = cut(refill, 60, 110, step=110)  # under water, nothing happens, no points
    t = OXYGEN_DEATH_STEP
    died = cut(oxygen_death, t - 40, t + 10)  # runs out of oxygen
    names = {}
    for name, seg in (("refill", with_refill), ("plain", plain), ("died", died)):
        seg = dataclasses.replace(seg, env_index=len(names))
        names[save_segment(db, seg, fsync=False).relative_to(db).as_posix()] = name
    summary = oracle_label_db(db, 3, seed=0, teacher="oxygen")
    assert summary.labeled == 3
    winners = {}
    for lab in read_label_log(db):
        a, b = names[lab.sample1], names[lab.sample2]
        assert lab.source == "oracle" and lab.extra["teacher"] == "oxygen"
        winners[frozenset((a, b))] = a if lab.label == FIRST_BETTER else b if lab.label == SECOND_BETTER else None
    assert winners == {
        frozenset(("refill", "plain")): "refill",
        frozenset(("refill", "died")): "refill",
        frozenset(("plain", "died")): "plain",
    }


def test_oxygen_teacher_refuses_another_game(tmp_path: Path) -> None:
    make_synthetic_db(tmp_path / "db", 6, seed=1)  # 'Pong' frames, not SeaQuest
    with pytest.raises(UserError, match="oxygen gauge"):
        oracle_label_db(tmp_path / "db", 3, teacher="oxygen")


def test_label_ui_oracle_flags(tmp_path: Path) -> None:
    db = tmp_path / "db"
    make_synthetic_db(db, 10, seed=2)
    main = [sys.executable, str(ROOT / "02_label_ui.py"), "-d", str(db), "--oracle", "20", "--seed", "1"]
    p = subprocess.run([*main, "--teacher-noise", "0.5"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    log = read_label_log(db)
    assert len(log) == 20 and all(lab.extra["teacher"] == "score" and lab.extra["teacher_noise"] == 0.5 for lab in log)
    wrong = sum(lab.label != (1 if lab.extra["returns"][0] > lab.extra["returns"][1] else 2) for lab in log)
    assert wrong > 0  # half the answers are coin flips
    for bad in (["--teacher-noise", "2"], ["--teacher", "taste"], ["--teacher", "oxygen"]):
        p = subprocess.run([*main, *bad], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert p.returncode == 2 and p.stderr.startswith("error") or "usage" in p.stderr, (bad, p.stderr)
        assert "Traceback" not in p.stderr


def test_full_games_report_the_same_oxygen_story(oxygen_death: Segment) -> None:
    """play_games (01_a2c.py's evaluation, 04_play.py) reads the gauge with the teacher's tracker."""
    from lib.behaviour import behaviour_observers, behaviour_stats
    from lib.envs import AtariVec
    from lib.games import play_games

    seed, _ = OXYGEN_DEATH_PLAN
    actions = iter(oxygen_death.actions.tolist())
    venv = AtariVec(n_envs=1, seed=seed, noop_max=0, num_threads=1)
    try:
        observers = behaviour_observers(venv)
        assert len(observers) == 1  # SeaQuest at full resolution: the oxygen observer
        results = play_games(
            venv, lambda obs: np.array([next(actions)]), 1, observers=observers, max_steps=len(oxygen_death)
        )
    finally:
        venv.close()
    assert results is not None and results[0].end == "max steps"
    assert results[0].score == float(oxygen_death.rewards.sum())
    assert results[0].oxygen == OxygenCounts(refills=0, deaths=1, oxygen_deaths=1)
    stats = behaviour_stats(results)
    assert stats["refills_per_game"] == 0 and stats["deaths_per_game"] == 1 and stats["oxygen_death_share"] == 1


def test_step_correlation_matches_numpy() -> None:
    from lib.a2c import StepCorrelation

    rng = np.random.default_rng(0)
    x = rng.normal(size=1000)
    y = 0.5 * x + rng.normal(size=1000)
    c = StepCorrelation()
    for i in range(0, 1000, 16):
        c.add(x[i : i + 16], y[i : i + 16])
    assert c.value() == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-9)
    flat = StepCorrelation()
    flat.add(x[:50], np.zeros(50))  # no points scored: undefined, not 0
    assert flat.value() is None and StepCorrelation().value() is None
