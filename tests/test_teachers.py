"""Synthetic teachers and the SeaQuest oxygen reading (lib/models/teachers.py), on real ALE frames whose
story is known: a voluntary refill, an oxygen death with the blinking gauge, an enemy kill, a climb
with a low gauge, a sub parked at the surface (the last two: tests/test_seaquest.py's plans)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_seaquest import CLIMB_PLAN, CLIMB_REFILL, CLIMB_START, DOOMED_DEATH, DOOMED_PLAN, PARKED_PLAN, STAY_PLAN

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
from lib.atari.seaquest import (
    GAUGE_COLS,
    GAUGE_ROWS,
    GAUGE_WHITE,
    SURFACE_ROW,
    OxygenCounts,
    StepPay,
    SurfaceCounts,
    oxygen_counts,
    oxygen_levels,
    step_pay,
    sub_rows,
)
from lib.core.errors import UserError
from lib.label_ui.oracle import OracleSettings, oracle_label_db
from lib.models.teachers import (
    CLIMB_MIN_ROWS,
    DEFAULT_DEATH_PENALTY,
    IDLE_MIN_STEPS,
    SegmentFacts,
    Teacher,
    death_penalty_for,
    segment_facts,
)
from lib.store.labels import CANT_TELL, EQUAL, FIRST_BETTER, SECOND_BETTER, read_label_log
from lib.store.segment_writer import save_segment
from lib.store.segments import Segment

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def refill() -> Segment:
    return play_plan(REFILL_PLAN)


@pytest.fixture(scope="module")
def oxygen_death() -> Segment:
    return play_plan(OXYGEN_DEATH_PLAN)


@pytest.fixture(scope="module")
def enemy_death() -> Segment:
    return play_plan(ENEMY_DEATH_PLAN)


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
    assert sub_rows(refill.frames[REFILL_STEP]) == SURFACE_ROW
    assert sub_rows(refill.frames[REFILL_STEP - 20]) > SURFACE_ROW + 20
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


def facts(
    ret: float | None,
    refills: int = 0,
    oxygen_deaths: int = 0,
    climb: int = 0,
    idle: int = 0,
    deaths: int | None = None,
    diver_climb: int = 0,
    rescues: int = 0,
) -> SegmentFacts:
    surface = SurfaceCounts(
        steps=50, climb_rows=climb, idle_steps=idle, surface_steps=idle, diver_climb_rows=diver_climb, rescues=rescues
    )
    deaths = oxygen_deaths if deaths is None else deaths
    return SegmentFacts(ret, OxygenCounts(refills, deaths, oxygen_deaths), surface)


def test_teacher_rules() -> None:
    score, oxygen = Teacher("score"), Teacher("oxygen")
    assert score.judge_rule(facts(20), facts(0))[0] == FIRST_BETTER
    assert score.judge_rule(facts(0, refills=1), facts(20))[0] == SECOND_BETTER  # the score ignores oxygen
    assert score.judge_rule(facts(5), facts(5))[0] == EQUAL
    assert Teacher("score", ties="skip").judge_rule(facts(5), facts(5))[0] == CANT_TELL
    assert score.judge_rule(facts(None), facts(5))[0] == CANT_TELL
    # Oxygen: an oxygen death is the worst event, then refills count, then the score decides.
    assert oxygen.judge_rule(facts(100, oxygen_deaths=1), facts(0))[0] == SECOND_BETTER
    assert oxygen.judge_rule(facts(0, refills=1), facts(100))[0] == FIRST_BETTER
    assert oxygen.judge_rule(facts(0, refills=2, oxygen_deaths=1), facts(0, refills=0))[0] == SECOND_BETTER
    assert oxygen.judge_rule(facts(10), facts(30))[0] == SECOND_BETTER
    assert oxygen.judge_rule(facts(10), facts(10))[0] == EQUAL
    assert oxygen.judge_rule(SegmentFacts(10, None), facts(0))[0] == CANT_TELL  # no gauge: cannot judge
    with pytest.raises(ValueError):
        Teacher("taste")
    with pytest.raises(ValueError):
        Teacher("score", noise=1.5)


def test_surface_teacher_rules_in_order() -> None:
    surface = Teacher("surface")
    # 1: fewer lives lost, whatever the cause: an oxygen death, or surfacing with no diver aboard.
    assert surface.judge_rule(facts(0, oxygen_deaths=1, diver_climb=90), facts(0, idle=50)) == (SECOND_BETTER, "death")
    assert surface.judge_rule(facts(90, refills=1), facts(0, deaths=1, climb=60)) == (FIRST_BETTER, "death")
    assert surface.judge_rule(facts(0, deaths=2), facts(0, deaths=1, refills=1)) == (SECOND_BETTER, "death")
    # 2: a refill, before a climb, a rescue or idling.
    assert surface.judge_rule(facts(0, diver_climb=90, rescues=2), facts(0, refills=1, idle=30)) == (
        SECOND_BETTER,
        "refill",
    )
    # 3: climbing with a low gauge and a diver aboard, by at least CLIMB_MIN_ROWS more.
    assert surface.judge_rule(facts(0, diver_climb=CLIMB_MIN_ROWS), facts(100, rescues=1)) == (
        FIRST_BETTER,
        "diver_climb",
    )
    assert surface.judge_rule(facts(0, diver_climb=CLIMB_MIN_ROWS - 1), facts(100)) == (SECOND_BETTER, "score")
    assert surface.judge_rule(facts(0, diver_climb=40), facts(0, diver_climb=48)) == (SECOND_BETTER, "diver_climb")
    # Climbing with no diver aboard is no progress: the score decides.
    assert surface.judge_rule(facts(0, climb=90), facts(20)) == (SECOND_BETTER, "score")
    # 4: more divers picked up, before idling.
    assert surface.judge_rule(facts(0, rescues=1, idle=50), facts(100)) == (FIRST_BETTER, "rescue")
    assert surface.judge_rule(facts(0, rescues=1), facts(0, rescues=2)) == (SECOND_BETTER, "rescue")
    # 5: fewer steps idle at the surface with a full gauge, by at least IDLE_MIN_STEPS.
    assert surface.judge_rule(facts(100, idle=IDLE_MIN_STEPS), facts(0)) == (SECOND_BETTER, "idle")
    assert surface.judge_rule(facts(100, idle=IDLE_MIN_STEPS + 5), facts(0, idle=6)) == (FIRST_BETTER, "score")
    # 6: the score; equal is a tie, or can't tell with ties=skip (still decided by "tie").
    assert surface.judge_rule(facts(10), facts(30)) == (SECOND_BETTER, "score")
    assert surface.judge_rule(facts(10, diver_climb=3), facts(10, idle=5)) == (EQUAL, "tie")
    assert Teacher("surface", ties="skip").judge_rule(facts(10), facts(10)) == (CANT_TELL, "tie")
    # No gauge (another game) or no true rewards: can't tell.
    assert surface.judge_rule(SegmentFacts(10, None), facts(0)) == (CANT_TELL, "cant_tell")
    assert surface.judge_rule(facts(None), facts(0)) == (CANT_TELL, "cant_tell")
    # The old teachers name their rules too, and ignore the new facts.
    oxygen, score = Teacher("oxygen"), Teacher("score")
    assert oxygen.judge_rule(facts(0, diver_climb=90, rescues=1), facts(20)) == (SECOND_BETTER, "score")
    assert oxygen.judge_rule(facts(0, deaths=1), facts(0)) == (EQUAL, "tie")  # an enemy's kill: not its rule
    assert oxygen.judge_rule(facts(0, oxygen_deaths=1), facts(0)) == (SECOND_BETTER, "oxygen_death")
    assert oxygen.judge_rule(facts(0), facts(0, refills=1)) == (SECOND_BETTER, "refill")
    assert score.judge_rule(facts(0, refills=1), facts(20)) == (SECOND_BETTER, "score")
    assert score.judge_rule(facts(5), facts(5)) == (EQUAL, "tie")
    assert Teacher("surface", noise=1.0, rng=np.random.default_rng(0)).answer_rule(facts(0), facts(9))[1] == "noise"


def test_teacher_noise_is_the_papers_share_of_random_answers() -> None:
    n, p = 20_000, 0.3
    t = Teacher("score", noise=p, rng=np.random.default_rng(0))
    answers = np.array([t.answer_rule(facts(0), facts(10))[0] for _ in range(n)])
    assert set(answers.tolist()) <= {FIRST_BETTER, SECOND_BETTER}
    # Wrong answers come from the random share only, half of it: p/2 = 15% (4 sigma bounds).
    wrong = (answers == FIRST_BETTER).mean()
    sigma = np.sqrt(p / 2 * (1 - p / 2) / n)
    assert abs(wrong - p / 2) < 4 * sigma
    # A tie is never answered by a random answer of the noise share (it picks #1 or #2).
    ties = [t.answer_rule(facts(3), facts(3))[0] for _ in range(2000)]
    assert 0.2 < np.mean([a != EQUAL for a in ties]) < 0.4
    assert all(Teacher("score").answer_rule(facts(0), facts(10))[0] == SECOND_BETTER for _ in range(100))


def test_oracle_with_the_oxygen_teacher_on_real_segments(
    tmp_path: Path, refill: Segment, oxygen_death: Segment
) -> None:
    db = tmp_path / "db"
    with_refill = cut(refill, REFILL_STEP - 20, REFILL_STEP + 30)  # 1 refill, no points
    plain = cut(refill, 60, 110, step=110)  # under water, nothing happens but 20 points
    t = OXYGEN_DEATH_STEP
    died = cut(oxygen_death, t - 40, t + 10)  # runs out of oxygen
    names = {}
    for name, seg in (("refill", with_refill), ("plain", plain), ("died", died)):
        seg = dataclasses.replace(seg, env_index=len(names))
        names[save_segment(db, seg, fsync=False).relative_to(db).as_posix()] = name
    summary = oracle_label_db(db, 3, seed=0, settings=OracleSettings(teacher="oxygen"))
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


@pytest.fixture(scope="module")
def surface_clips(refill: Segment, oxygen_death: Segment) -> dict[str, Segment]:
    """Real clips of 46-50 steps whose story is known, one or more per rule of the surface teacher."""
    t = OXYGEN_DEATH_STEP
    climb, stay, parked = play_plan(CLIMB_PLAN), play_plan(STAY_PLAN), play_plan(PARKED_PLAN)
    doomed = play_plan(DOOMED_PLAN)
    return {
        "died": cut(oxygen_death, t - 40, t + 10),  # runs out of oxygen
        # Low gauge, no diver aboard: climbs from row 110 to the surface, where it loses a life.
        "doomed": cut(doomed, DOOMED_DEATH - 41, DOOMED_DEATH + 9),
        # The same climb, cut before it reaches the surface: no death yet, no points.
        "no_diver_climb": cut(doomed, DOOMED_DEATH - 50, DOOMED_DEATH - 1),
        "refill": cut(refill, REFILL_STEP - 20, REFILL_STEP + 30),  # 1 refill, no points
        # Low gauge, a diver aboard: rises from row 134 to row 47, no points; stops before the refill.
        "climbing": cut(climb, CLIMB_START - 26, CLIMB_REFILL),
        "staying": cut(stay, CLIMB_START - 26, CLIMB_START + 24),  # low gauge, diver, stays at row 134, 20 points
        "rescue": cut(refill, 70, 116),  # picks up a diver (step 102), no points (46 steps)
        "parked": cut(parked, 90, 140),  # at the surface, gauge full, all 50 steps, no points
        "plain": cut(climb, 84, 131),  # under water with plenty of air, no diver, no points (47 steps)
        "points": cut(climb, 100, 150),  # under water with plenty of air, 20 points
    }


_ALIVE = ("no_diver_climb", "refill", "climbing", "staying", "rescue", "parked", "plain", "points")
# The surface teacher's verdict on each pair of surface_clips: (winner or None for a tie, rule).
SURFACE_VERDICTS = {
    frozenset(("died", "doomed")): (None, "tie"),  # a death each, nothing else
    **{frozenset((dead, o)): (o, "death") for dead in ("died", "doomed") for o in _ALIVE},
    **{frozenset(("refill", o)): ("refill", "refill") for o in _ALIVE if o != "refill"},
    **{frozenset(("climbing", o)): ("climbing", "diver_climb") for o in _ALIVE if o not in ("refill", "climbing")},
    **{
        frozenset(("rescue", o)): ("rescue", "rescue")
        for o in ("no_diver_climb", "staying", "parked", "plain", "points")
    },
    **{frozenset((o, "parked")): (o, "idle") for o in ("no_diver_climb", "staying", "plain", "points")},
    # Climbing with a low gauge and no diver is no progress: the score decides, or nothing.
    frozenset(("staying", "no_diver_climb")): ("staying", "score"),
    frozenset(("points", "no_diver_climb")): ("points", "score"),
    frozenset(("plain", "no_diver_climb")): (None, "tie"),
    frozenset(("staying", "plain")): ("staying", "score"),
    frozenset(("points", "plain")): ("points", "score"),
    frozenset(("staying", "points")): (None, "tie"),
}


def test_surface_clips_show_their_story(surface_clips: dict[str, Segment]) -> None:
    f = {k: segment_facts(c.frames, c.rewards, c.dones, "seaquest") for k, c in surface_clips.items()}
    assert {
        k: (x.ret, x.oxygen.deaths, x.oxygen.oxygen_deaths, x.oxygen.refills) for k, x in f.items() if x.oxygen
    } == {
        "died": (0, 1, 1, 0),
        "doomed": (0, 1, 0, 0),  # a death at the surface with oxygen left: not an oxygen death
        "no_diver_climb": (0, 0, 0, 0),
        "refill": (0, 0, 0, 1),
        "climbing": (0, 0, 0, 0),
        "staying": (20, 0, 0, 0),
        "rescue": (0, 0, 0, 0),
        "parked": (0, 0, 0, 0),
        "plain": (0, 0, 0, 0),
        "points": (20, 0, 0, 0),
    }
    s = {k: x.surface for k, x in f.items()}
    assert s["climbing"].climb_rows == s["climbing"].diver_climb_rows == 134 - 47
    assert s["climbing"].low_steps == s["climbing"].low_diver_steps == len(surface_clips["climbing"]) - 1
    assert s["staying"].climb_rows == 0 and s["staying"].low_diver_steps == 49
    assert s["no_diver_climb"].climb_rows > CLIMB_MIN_ROWS and s["no_diver_climb"].diver_climb_rows == 0
    assert s["doomed"].diver_steps == s["no_diver_climb"].diver_steps == 0
    assert s["rescue"].rescues == 1 and all(s[k].rescues == 0 for k in s if k != "rescue")
    assert s["parked"].idle_steps == 50 and s["parked"].low_steps == 0
    # The died clip's next sub waits at the surface (row 46) while its gauge fills: not a climb.
    assert s["died"].climb_rows == 0 and sub_rows(surface_clips["died"].frames[-1]) == SURFACE_ROW
    assert all(s[k].idle_steps == 0 and s[k].climb_rows == 0 for k in ("plain", "points"))
    # The refill clip's sub stays at the surface, pressing UP, for 24 steps once its gauge is full
    # (idle), and gives up its diver there: the refill outranks both (rule 2 before rules 4 and 5).
    assert s["refill"].idle_steps == 24 >= IDLE_MIN_STEPS and s["refill"].climb_rows == 0


def save_clips(db: Path, clips: dict[str, Segment]) -> dict[str, str]:
    """The clips as segments of a DB; their names by relative path."""
    names = {}
    for name, seg in clips.items():
        seg = dataclasses.replace(seg, env_index=len(names))
        names[save_segment(db, seg, fsync=False).relative_to(db).as_posix()] = name
    return names


def test_oracle_records_the_surface_teachers_rule(tmp_path: Path, surface_clips: dict[str, Segment]) -> None:
    db = tmp_path / "db"
    names = save_clips(db, surface_clips)
    summary = oracle_label_db(db, 100, seed=0, settings=OracleSettings(teacher="surface"))
    assert summary.labeled == len(SURFACE_VERDICTS) == 45
    seen = {}
    for lab in read_label_log(db):
        a, b = names[lab.sample1], names[lab.sample2]
        winner = a if lab.label == FIRST_BETTER else b if lab.label == SECOND_BETTER else None
        assert lab.label != EQUAL or winner is None
        seen[frozenset((a, b))] = (winner, lab.extra["rule"])
        assert lab.source == "oracle" and lab.extra["teacher"] == "surface"
        assert lab.extra["diver_climb"] == [134 - 47 if n == "climbing" else 0 for n in (a, b)]
        assert lab.extra["rescues"] == [int(n == "rescue") for n in (a, b)]
        assert lab.extra["deaths"] == [int(n in ("died", "doomed")) for n in (a, b)]
        if "parked" in (a, b):
            assert lab.extra["idle"][[a, b].index("parked")] == 50
    assert seen == SURFACE_VERDICTS
    # The oxygen teacher on the same DB sees no climb and no idling: the score, or a tie.
    oxygen_db = tmp_path / "oxygen"
    names = save_clips(oxygen_db, surface_clips)
    oracle_label_db(oxygen_db, 100, seed=0, settings=OracleSettings(teacher="oxygen"))
    rules = {
        frozenset((names[lab.sample1], names[lab.sample2])): lab.extra["rule"] for lab in read_label_log(oxygen_db)
    }
    assert rules[frozenset(("climbing", "staying"))] == "score" and rules[frozenset(("plain", "parked"))] == "tie"
    assert rules[frozenset(("doomed", "plain"))] == "tie"  # a death with oxygen left is not its rule
    # Random answers record "noise".
    noisy = tmp_path / "noisy"
    save_clips(noisy, surface_clips)
    oracle_label_db(noisy, 10, seed=0, settings=OracleSettings(teacher="surface", noise=1.0))
    assert [lab.extra["rule"] for lab in read_label_log(noisy)] == ["noise"] * 10


def test_oracle_labels_of_the_refill_teacher_record_the_sums(tmp_path: Path, surface_clips: dict[str, Segment]) -> None:
    """Each label of ``--teacher refill`` records both clips' pay sums and climb steps, and its answer
    is the larger sum (rule "pay") or a tie on equal sums."""
    db = tmp_path / "db"
    names = save_clips(db, surface_clips)
    summary = oracle_label_db(db, 100, seed=0, settings=OracleSettings(teacher="refill"))
    assert summary.labeled == 45
    for lab in read_label_log(db):
        pa, pb = lab.extra["pay"]
        assert lab.extra["teacher"] == "refill"
        assert lab.extra["rule"] == ("tie" if pa == pb else "pay")
        assert lab.label == (EQUAL if pa == pb else FIRST_BETTER if pa > pb else SECOND_BETTER)
        for name, climbs in zip((names[lab.sample1], names[lab.sample2]), lab.extra["climb_steps"], strict=True):
            assert (climbs > 0) == (name == "climbing"), name


@pytest.mark.parametrize("teacher", ["oxygen", "surface"])
def test_gauge_teachers_refuse_another_game(tmp_path: Path, teacher: str) -> None:
    make_synthetic_db(tmp_path / "db", 6, seed=1)  # 'Pong' frames, not SeaQuest
    with pytest.raises(UserError, match=f"the {teacher} teacher reads SeaQuest's oxygen gauge"):
        oracle_label_db(tmp_path / "db", 3, settings=OracleSettings(teacher=teacher))


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
    for bad in (["--teacher-noise", "2"], ["--teacher", "taste"], ["--teacher", "oxygen"], ["--teacher", "surface"]):
        p = subprocess.run([*main, *bad], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert p.returncode == 2 and p.stderr.startswith("error") or "usage" in p.stderr, (bad, p.stderr)
        assert "Traceback" not in p.stderr


def test_full_games_report_the_same_oxygen_story(oxygen_death: Segment) -> None:
    """play_games (01_a2c.py's evaluation, 04_play.py) reads the gauge with the teacher's tracker."""
    from lib.atari.behaviour import behaviour_observers, behaviour_stats
    from lib.atari.envs import AtariVec
    from lib.atari.games import play_games

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
    from lib.core.stats import StepCorrelation

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


def test_death_penalty_decides_a_pair_that_otherwise_ties() -> None:
    """--death-penalty P: a clip where the sub dies (0 points) ties with one where it idles (0
    points) for the plain score teacher; with P a lost life costs P points, so the idle clip wins
    (rule "death"), and a clip worth more than P points still wins over a clean one of 0."""
    died, idle = SegmentFacts(0.0, lives_lost=1), SegmentFacts(0.0)
    assert Teacher("score").judge_rule(died, idle) == (EQUAL, "tie")
    assert Teacher("score", death_penalty=100).judge_rule(died, idle) == (SECOND_BETTER, "death")
    assert Teacher("score", death_penalty=100).judge_rule(idle, died) == (FIRST_BETTER, "death")
    rich = SegmentFacts(140.0, lives_lost=1)
    assert Teacher("score", death_penalty=100).judge_rule(rich, idle) == (FIRST_BETTER, "score")
    assert Teacher("score", death_penalty=100).judge_rule(SegmentFacts(60.0, lives_lost=1), SegmentFacts(20.0)) == (
        SECOND_BETTER,
        "death",
    )
    with pytest.raises(ValueError):
        Teacher("score", death_penalty=-1)


def test_each_teacher_has_its_own_death_penalty_default() -> None:
    """Unset, --death-penalty is the score teacher's DEFAULT_DEATH_PENALTY and 0 for the teachers that
    rank lost lives themselves; a penalty for those, or below 0, is refused."""
    assert death_penalty_for("score", None) == DEFAULT_DEATH_PENALTY > 0
    assert death_penalty_for("score", 0.0) == 0.0 and death_penalty_for("score", 7.0) == 7.0
    assert death_penalty_for("surface", None) == death_penalty_for("oxygen", 0.0) == 0.0
    for teacher, given in (("surface", 10.0), ("score", -1.0), ("score", float("nan"))):
        with pytest.raises(ValueError, match="--death-penalty"):
            death_penalty_for(teacher, given)


def test_label_ui_death_penalty_flag(tmp_path: Path) -> None:
    """02_label_ui.py --oracle N --death-penalty P: segments' lost lives reach the teacher and the label."""
    db = tmp_path / "db"
    names = make_synthetic_db(db, 6, seed=3)
    from lib.store.segments import read_segment

    for rel in names[:3]:  # the first three lose a life on their last step and score nothing
        seg = read_segment(db, rel)
        seg = dataclasses.replace(seg, rewards=np.zeros_like(seg.rewards), dones=np.eye(len(seg.dones))[-1] > 0)
        (db / rel).unlink()
        save_segment(db, seg)
    for rel in names[3:]:
        seg = read_segment(db, rel)
        (db / rel).unlink()
        save_segment(db, dataclasses.replace(seg, rewards=np.zeros_like(seg.rewards)))
    unset = tmp_path / "unset"
    shutil.copytree(db, unset)
    main = [sys.executable, str(ROOT / "02_label_ui.py"), "-d", str(db), "--oracle", "15", "--seed", "1"]
    p = subprocess.run([*main[:3], str(unset), *main[4:]], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr  # unset: the score teacher's default
    assert {lab.extra.get("death_penalty") for lab in read_label_log(unset)} == {DEFAULT_DEATH_PENALTY}
    p = subprocess.run([*main, "--death-penalty", "50"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    log = read_label_log(db)
    assert len(log) == 15 and all(lab.extra["death_penalty"] == 50 for lab in log)
    for lab in log:
        a, b = lab.extra["lives_lost"]
        assert lab.label == (EQUAL if a == b else FIRST_BETTER if a < b else SECOND_BETTER)
    assert sum(lab.extra["rule"] == "death" for lab in log) == 9  # 3 x 3 died-vs-clean pairs
    for bad in (["--death-penalty", "-5"], ["--death-penalty", "10", "--teacher", "surface"]):
        p = subprocess.run([*main, *bad], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert p.returncode == 2 and "Traceback" not in p.stderr, (bad, p.stderr)


def _random_facts(rng: np.random.Generator) -> SegmentFacts:
    """Facts of a SeaQuest clip drawn so that every rule of every teacher gets to decide."""
    deaths = int(rng.integers(0, 2))
    oxygen = OxygenCounts(
        refills=int(rng.integers(0, 2)), deaths=deaths, oxygen_deaths=int(rng.integers(0, deaths + 1))
    )
    surface = SurfaceCounts(
        diver_climb_rows=int(rng.choice([0, 4, 12])),
        rescues=int(rng.integers(0, 2)),
        idle_steps=int(rng.choice([0, 10, 30])),
    )
    flags = rng.random((3, 4)) < 0.3
    pay = StepPay(flags.sum(0).astype(np.float32), flags[0], flags[1], flags[2], np.zeros(4, np.int8))
    return SegmentFacts(float(rng.choice([0.0, 20.0])), oxygen, surface, lives_lost=deaths, pay=pay)


def test_a_teacher_is_one_entry_whose_rules_are_the_ones_it_decides_by():
    """``lib.models.teachers.TEACHER_ENTRIES``: each entry's ``rules`` are exactly the rules its judge
    answers with (first to last as its docstring orders them), the --teacher choices and help
    come from the entries, and only an entry that takes the death penalty accepts one."""
    from lib.label_ui.config import build_parser
    from lib.models.teachers import DEFAULT_TEACHER, TEACHER_ENTRIES, TEACHERS, teacher_help

    rng = np.random.default_rng(0)
    for entry in TEACHER_ENTRIES.values():
        seen = set()
        for _ in range(4000):
            verdict = entry.judge(_random_facts(rng), _random_facts(rng), 100.0 if entry.death_penalty else 0.0)
            assert verdict is not None
            seen.add(verdict[1])
        assert seen == set(entry.rules), entry.name
    assert tuple(TEACHER_ENTRIES) == TEACHERS and DEFAULT_TEACHER in TEACHERS
    teacher_flag = next(a for a in build_parser()._actions if "--teacher" in a.option_strings)
    assert tuple(teacher_flag.choices) == TEACHERS and teacher_flag.default == DEFAULT_TEACHER
    assert all(f"'{name}'" in teacher_help() for name in TEACHERS)
    Teacher("score", death_penalty=100.0)
    with pytest.raises(ValueError, match="takes no death penalty"):
        Teacher("surface", death_penalty=100.0)


def test_the_refill_teacher_weighs_the_per_step_pay(surface_clips: dict[str, Segment]) -> None:
    """The refill teacher prefers the larger sum of the surface rule's pay: each climbing step with a
    low gauge and a diver aboard is worth what a kill is worth, so eight of them beat one kill,
    two kills beat one, and equal sums tie (where the surface teacher's order of rules would not)."""
    climb = play_plan(CLIMB_PLAN)
    eight = cut(climb, CLIMB_START - 26, CLIMB_START + 9)  # rises on its last 8 steps, no points
    one_kill = surface_clips["points"]  # 20 points on one step, plenty of air
    kills = np.array(one_kill.rewards)
    kills[np.flatnonzero(kills == 0)[5]] = 20.0
    two_kills = dataclasses.replace(one_kill, rewards=kills)
    pay = {k: step_pay(c.frames, c.rewards, c.dones) for k, c in [("eight", eight), ("one", one_kill)]}
    assert int(pay["eight"].climb.sum()) == 8 and pay["eight"].total == 8.0
    # Each climb is paid to the step whose action made it: the move from its frame to the next.
    rows = sub_rows(eight.frames)
    rose = np.flatnonzero(rows[1:] < rows[:-1])
    assert np.array_equal(np.flatnonzero(pay["eight"].climb), rose) and len(rose) == 8
    assert np.array_equal(np.flatnonzero(pay["eight"].moves == 1), rose) and not (pay["eight"].moves == -1).any()
    assert int(pay["eight"].low_diver.sum()) == len(eight) - 1  # all but the first, unjudged, reading
    assert pay["one"].total == 1.0 and not pay["one"].climb.any()

    def fx(c: Segment) -> SegmentFacts:
        return segment_facts(c.frames, c.rewards, c.dones, "seaquest")

    t = Teacher("refill")
    assert t.judge_rule(fx(eight), fx(one_kill)) == (FIRST_BETTER, "pay")
    assert t.judge_rule(fx(one_kill), fx(eight)) == (SECOND_BETTER, "pay")
    assert t.judge_rule(fx(two_kills), fx(one_kill)) == (FIRST_BETTER, "pay")
    staying = surface_clips["staying"]  # 20 points, a low gauge and a diver, no climb: one kill's pay
    assert t.judge_rule(fx(staying), fx(one_kill)) == (EQUAL, "tie")
    assert Teacher("refill", ties="skip").judge_rule(fx(staying), fx(one_kill)) == (CANT_TELL, "tie")
    # A clip refilled for air is paid one more than its climb; without true rewards the teacher cannot tell.
    assert t.judge_rule(fx(surface_clips["refill"]), fx(surface_clips["plain"])) == (FIRST_BETTER, "pay")
    blind = segment_facts(eight.frames, None, eight.dones, "seaquest")
    assert t.judge_rule(blind, fx(one_kill)) == (CANT_TELL, "cant_tell")
    # The moves teacher pays each step up +1 and each step down -1 with a low gauge and a diver aboard.
    m = Teacher("moves")
    assert pay["eight"].moves_pay.sum() == 8.0 and m.judge_rule(fx(eight), fx(one_kill)) == (FIRST_BETTER, "pay")
    assert m.judge_rule(fx(staying), fx(one_kill)) == (EQUAL, "tie")  # it stays at the sea bed: no move
    sinking = dataclasses.replace(eight, frames=eight.frames[::-1].copy(), rewards=np.zeros(len(eight), np.float32))
    assert step_pay(sinking.frames, sinking.rewards, None).moves.min() == -1
    assert m.judge_rule(fx(sinking), fx(surface_clips["plain"])) == (SECOND_BETTER, "pay")
